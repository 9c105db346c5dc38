// bench_attention: CPU paged attention through CpuBackend::attention (the op the model calls),
// sweeping context length x batch (concurrent sequences): one decode token each by default, or a
// prefill chunk of --queries tokens each (causal, at positions ctx .. ctx + queries - 1).
//   bench_attention [--config tinyllama-1.1b | --heads 32 --kv-heads 4 --head-dim 64] [--threads N]
//                   [--contexts 128,512,2048,8192] [--batches 1,4,16] [--queries 1] [--block 16]
//                   [--hot] [--min-time 0.2] [--kv-dtype f32|f16|bf16|int8] [--json FILE]
// Layout: K and V caches [num_blocks, block_size, n_kv, kv_row_elems] of --kv-dtype from alloc_lazy (as the
// model's; int8 rows carry their f32 scale after head_dim values), each sequence's
// blocks taken from a shuffled free list (a paged cache after some churn, not one contiguous run);
// the decode token of sequence s sits at position ctx, so one call reads (ctx + 1) positions of K
// and V per kv head per sequence: kv_bytes = batch * (ctx + 1) * n_kv * row bytes * 2 (with
// q queries: ctx + q positions, once; FLOPs = 4 * n_heads * head_dim * the positions each query
// attends to, summed: the figure the planner's attention rate stands for).
// A decode step visits every layer's cache once, so by default (dram) each point rotates through
// enough copies of the cache (one per "layer") to exceed --footprint bytes (> any L3 here); --hot
// reuses one cache (cache-resident when small: an upper bound, not what decode meets).
// Headline: kv GB/s = kv_bytes / time against the measured stream-read ceiling of the same pool
// (bench_common.h). Time per point: best of passes of >= --min-time after one warm-up pass.
// After timing, every output element (poisoned with NaN before the last call) must be finite.
#include "benchmarks/bench_common.h"

#include "runtime/backend/cpu/cpu_backend.h"
#include "runtime/arch/config.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <numeric>
#include <random>

using namespace lattice;

namespace {

struct Point {
    int64_t ctx = 0, batch = 0, queries = 1, copies = 0;
    double kv_bytes = 0, footprint_bytes = 0, seconds = 0, median_seconds = 0, gbs = 0, gflops = 0;
};

// Cheap deterministic fill in [-1, 1): caches of up to a GiB would take seconds with <random>.
void fill(float* p, int64_t n, uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = float(int64_t(x >> 40) - (int64_t(1) << 23)) * (1.0f / float(1 << 23));
    }
}

// A cache of `rows` rows of head_dim elements of `dt`, values in [-1, 1) (int8: values then each block's
// `block_rows` scales of 1/127, backend.h's layout).
void fill_cache(const View& c, int64_t rows, int64_t block_rows, int64_t hd, DType dt, uint64_t seed) {
    if (dt == DType::kF32) return fill(c.ptr<float>(), rows * hd, seed);
    std::vector<float> x(static_cast<size_t>(hd));
    uint8_t* p = static_cast<uint8_t*>(c.data);
    const int64_t rb = kv_row_elems(dt, hd) * int64_t(dtype_size(dt));
    const int64_t values = dt == DType::kI8 ? hd : rb;
    for (int64_t r = 0; r < rows; ++r) {
        fill(x.data(), hd, seed * 1000003 + uint64_t(r));
        const int64_t blk = r / block_rows, in = r % block_rows;
        uint8_t* row = p + blk * block_rows * rb + in * values;
        for (int64_t d = 0; d < hd; ++d) {
            if (dt == DType::kI8) {
                row[d] = uint8_t(int8_t(std::lround(x[size_t(d)] * 127.0f)));
            } else {
                const uint16_t h = dt == DType::kF16 ? f32_to_f16(x[size_t(d)]) : f32_to_bf16(x[size_t(d)]);
                std::memcpy(row + 2 * d, &h, 2);
            }
        }
        if (dt == DType::kI8) {
            const float scale = 1.0f / 127.0f;
            std::memcpy(p + blk * block_rows * rb + block_rows * hd + in * 4, &scale, 4);
        }
    }
}

std::vector<int64_t> parse_list(const std::string& s, const char* what, int64_t min) {
    std::vector<int64_t> v;
    size_t i = 0;
    while (i < s.size()) {
        size_t j = s.find(',', i);
        if (j == std::string::npos) j = s.size();
        const int64_t x = std::stoll(s.substr(i, j - i));
        LATTICE_CHECK(x >= min, "{}: {} is below {}", what, s.substr(i, j - i), min);
        v.push_back(x);
        i = j + 1;
    }
    LATTICE_CHECK(!v.empty(), "{}: empty list", what);
    return v;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"CPU paged decode attention: KV read GB/s against the stream-read ceiling"};
    std::string preset = "tinyllama-1.1b", contexts_s = "128,512,2048,8192", batches_s = "1,4,16", json_path,
                kv_dtype_s = "f32";
    int threads = 0;
    int64_t heads = 0, kv_heads = 0, head_dim = 0, block = 16, queries = 1;
    double min_time = 0.2, footprint = double(1ll << 30);
    bool hot = false;
    app.add_option("--config", preset, "built-in model shape for the head counts (per rank at TP 1)");
    app.add_option("--heads", heads, "query heads (overrides --config)")->check(CLI::Range(int64_t(1), int64_t(1024)));
    app.add_option("--kv-heads", kv_heads, "kv heads (overrides --config)")->check(CLI::Range(int64_t(1), int64_t(1024)));
    app.add_option("--head-dim", head_dim, "head dimension (overrides --config)")
        ->check(CLI::Range(int64_t(2), int64_t(1024)));
    app.add_option("--threads", threads, "threads of the backend's pool (default: one per core)");
    app.add_option("--contexts", contexts_s, "context lengths (positions already in the cache)");
    app.add_option("--batches", batches_s, "concurrent sequences");
    app.add_option("--queries", queries, "new tokens per sequence per call (1: decode; more: a causal prefill chunk)")
        ->check(CLI::Range(int64_t(1), int64_t(65536)));
    app.add_option("--block", block, "positions per KV block")->check(CLI::Range(int64_t(1), int64_t(4096)));
    app.add_flag("--hot", hot, "reuse one cache (no rotation through per-layer copies)");
    app.add_option("--footprint", footprint, "bytes of KV the rotation spans at least (default 1 GiB)");
    app.add_option("--min-time", min_time, "seconds per timed pass")->check(CLI::Range(0.001, 60.0));
    app.add_option("--kv-dtype", kv_dtype_s, "KV cache elements: f32 | f16 | bf16 | int8")
        ->check(CLI::IsMember({"f32", "f16", "bf16", "int8"}));
    app.add_option("--json", json_path, "write results as JSON");
    CLI11_PARSE(app, argc, argv);

    try {
        const ModelConfig cfg = preset_config(preset);
        const DType kvt = resolve_kv_dtype(parse_kv_dtype(kv_dtype_s), DType::kF32);
        const int64_t nh = heads > 0 ? heads : cfg.n_heads, nkv = kv_heads > 0 ? kv_heads : cfg.n_kv_heads;
        const int64_t hd = head_dim > 0 ? head_dim : cfg.head_dim;
        LATTICE_CHECK(nh % nkv == 0, "--heads {} is not a multiple of --kv-heads {}", nh, nkv);
        const std::vector<int64_t> contexts = parse_list(contexts_s, "--contexts", 0),
                                   batches = parse_list(batches_s, "--batches", 1);

        CpuBackendOptions opt;
        opt.threads = threads;
        CpuBackend be(opt);
        const double ceiling = bench::measure_read_bandwidth(be.pool());
        const int64_t row = (nh + 2 * nkv) * hd;
        const double row_bytes = double(kv_row_elems(kvt, hd) * int64_t(dtype_size(kvt)));
        fmt::print("# paged {} attention, CpuBackend ({}), heads {}/{} x {}, block {}, {} KV cache, {}\n",
                   queries == 1 ? "decode" : fmt::format("prefill ({} queries per sequence)", queries), be.name(), nh,
                   nkv, hd, block, kv_dtype_s,
                   hot ? "hot (one cache)" : fmt::format("rotating >= {:.0f} MiB of caches", footprint / 1048576));
        fmt::print("# ceiling: stream read {:.2f} GB/s ({} threads); kv GB/s = batch (ctx+q) nkv {:.0f} B x 2 / time\n",
                   ceiling, be.threads(), row_bytes);
        fmt::print("{:>7} {:>6} {:>7} {:>10} {:>10} {:>10} {:>10} {:>9} {:>8}\n", "ctx", "batch", "copies", "kv MiB",
                   "time(us)", "median(us)", "kv GB/s", "GFLOP/s", "of ceil");

        std::vector<Point> points;
        std::mt19937 rng(7);
        for (int64_t ctx : contexts)
            for (int64_t b : batches) {
                Point pt;
                pt.ctx = ctx;
                pt.batch = b;
                pt.queries = queries;
                const int64_t q = queries, width = (ctx + q + block - 1) / block, nblocks = b * width;
                AttentionShape s;
                s.n_heads = nh;
                s.n_kv_heads = nkv;
                s.head_dim = hd;
                s.block_size = block;
                s.num_blocks = nblocks;
                s.table_width = width;
                s.max_seq = width * block;
                s.scale = 1.0f / std::sqrt(float(hd));
                std::vector<int32_t> free_list(static_cast<size_t>(nblocks));
                std::iota(free_list.begin(), free_list.end(), 0);
                std::shuffle(free_list.begin(), free_list.end(), rng);
                const std::vector<int32_t> tables = free_list;  // [b, width]: sequence s owns a shuffled slice
                const size_t nt = static_cast<size_t>(b * q);  // sequence s's q tokens, in order
                std::vector<int32_t> ids(nt, 1), pos(nt), seqs(nt);
                for (size_t t = 0; t < nt; ++t) {
                    seqs[t] = int32_t(int64_t(t) / q);
                    pos[t] = int32_t(ctx + int64_t(t) % q);
                }
                TokenBatch tb;
                tb.ids = ids.data();
                tb.positions = pos.data();
                tb.seqs = seqs.data();
                tb.count = b * q;
                tb.block_tables = tables.data();
                tb.num_seqs = b;
                tb.table_width = width;

                const int64_t cache_rows = nblocks * block * nkv;
                const double cache_bytes = 2.0 * double(cache_rows) * row_bytes;
                pt.copies = hot ? 1 : std::max<int64_t>(1, int64_t(std::ceil(footprint / cache_bytes)));
                std::vector<Buffer> kc, vc;
                for (int64_t c = 0; c < pt.copies; ++c) {
                    kc.push_back(be.alloc_lazy(kvt, {nblocks, block, nkv, kv_row_elems(kvt, hd)}));
                    vc.push_back(be.alloc_lazy(kvt, {nblocks, block, nkv, kv_row_elems(kvt, hd)}));
                    fill_cache(kc.back().view(), cache_rows, block * nkv, hd, kvt, uint64_t(2 * c + 1));
                    fill_cache(vc.back().view(), cache_rows, block * nkv, hd, kvt, uint64_t(2 * c + 2));
                }
                Buffer qkv = be.alloc(DType::kF32, {b * q, row}), out = be.alloc(DType::kF32, {b * q, nh * hd});
                fill(qkv.view().ptr<float>(), b * q * row, 99);
                auto pass = [&] {
                    for (int64_t c = 0; c < pt.copies; ++c)
                        be.attention(out.view(), qkv.view(), kc[size_t(c)].view(), vc[size_t(c)].view(), tb, s);
                };
                pass();  // warm-up: pages resident, pool awake
                std::vector<double> per_call;
                const double t_point = bench::now();
                do {
                    int reps = 0;
                    const double t0 = bench::now();
                    do {
                        pass();
                        ++reps;
                    } while (bench::now() - t0 < min_time);
                    per_call.push_back((bench::now() - t0) / double(reps * pt.copies));
                } while (per_call.size() < 3 || (per_call.size() < 9 && bench::now() - t_point < 4 * min_time));
                pt.seconds = *std::min_element(per_call.begin(), per_call.end());
                std::nth_element(per_call.begin(), per_call.begin() + long(per_call.size() / 2), per_call.end());
                pt.median_seconds = per_call[per_call.size() / 2];
                // Check after timing: a poisoned output must come back entirely written and finite.
                float* o = out.view().ptr<float>();
                std::fill(o, o + b * q * nh * hd, std::nanf(""));
                be.attention(out.view(), qkv.view(), kc[0].view(), vc[0].view(), tb, s);
                const int64_t bad = std::count_if(o, o + b * q * nh * hd, [](float x) { return !std::isfinite(x); });
                LATTICE_CHECK(bad == 0, "ctx {} batch {}: {} output elements not finite after timing", ctx, b, bad);

                pt.kv_bytes = double(b) * double(ctx + q) * double(nkv) * row_bytes * 2.0;
                // query i (0-based) attends to ctx + i + 1 positions
                const double attended = double(b) * (double(q) * double(ctx + 1) + double(q) * double(q - 1) / 2.0);
                pt.footprint_bytes = cache_bytes * double(pt.copies);
                pt.gbs = pt.kv_bytes / pt.seconds * 1e-9;
                pt.gflops = 4.0 * attended * double(nh * hd) / pt.seconds * 1e-9;  // QK and PV
                fmt::print("{:>7} {:>6} {:>7} {:>10.2f} {:>10.1f} {:>10.1f} {:>10.2f} {:>9.2f} {:>7.1f}%\n", ctx, b,
                           pt.copies, pt.kv_bytes / 1048576, pt.seconds * 1e6, pt.median_seconds * 1e6, pt.gbs,
                           pt.gflops, 100.0 * pt.gbs / ceiling);
                std::fflush(stdout);
                points.push_back(pt);
            }

        if (!json_path.empty()) {
            nlohmann::json j;
            j["bench"] = "attention";
            j["backend"] = be.name();
            j["threads"] = be.threads();
            j["n_heads"] = nh;
            j["n_kv_heads"] = nkv;
            j["head_dim"] = hd;
            j["block_size"] = block;
            j["queries"] = queries;
            j["kv_dtype"] = kv_dtype_s;
            j["mode"] = hot ? "hot" : "dram";
            j["read_bw_gbs"] = ceiling;
            j["results"] = nlohmann::json::array();
            for (const Point& p : points)
                j["results"].push_back({{"ctx", p.ctx},
                                        {"batch", p.batch},
                                        {"copies", p.copies},
                                        {"kv_bytes", p.kv_bytes},
                                        {"footprint_bytes", p.footprint_bytes},
                                        {"seconds", p.seconds},
                                        {"median_seconds", p.median_seconds},
                                        {"kv_gbs", p.gbs},
                                        {"gflops", p.gflops},
                                        {"frac_read_bw", p.gbs / ceiling}});
            bench::write_json(json_path, j);
        }
        return 0;
    } catch (const Error& e) {
        std::fprintf(stderr, "bench_attention: error: %s\n", e.what());
        return 1;
    }
}
