// bench_tp_linear: the tensor-parallel ceiling of a decode step's linear layers on CPU ranks.
// Each of N MPI ranks (one thread each) packs its 1/N share of a model preset's layer linears the
// way the engine splits them (q/k/v and gate/up by output channel, o and down by input channel),
// then decodes "tokens" that are only those m = 1 W8A8 GEMVs, layer by layer, with the model's two
// all-reduces per layer (after o and after down) through MpiComm, as the engine does.
// Per token it reports the slowest rank's time, each rank's wait in the all-reduces, and the weight
// GB/s per rank; `--no-sync` drops the all-reduces (streaming contention alone).
// Why: the engine's tp2/tp1 on two cores mixes three costs: both cores streaming at once,
// the sync jitter of 2 x layers waits per token, and the engine's own work (attention, norms, the
// head, sampling, scheduling). Running this with -np 1 and -np 2 measures the first two without the
// third, so `lattice generate --stats-json`'s tp speedup can be read against what the machine
// allows (docs/benchmark-results.md). Weights are random int8 in huge pages (as the engine's), rotated
// through all layers so nothing stays in cache; time is per token, median and best over --tokens.
// Usage: mpirun -np N bench_tp_linear [--config tinyllama-1.1b|config.json] [--tokens 30] [--no-sync] [--json F]
#include "benchmarks/bench_common.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/cpu/int8_gemm.h"
#include "kernels/cpu/thread_pool.h"
#include "parallel/mpi_comm.h"
#include "parallel/mpi_session.h"
#include "runtime/arch/config.h"

using namespace lattice;

namespace {

struct Shard {
    PackedInt8 w;
    std::vector<float> scales;
    bool reduce_after = false;  // o and down: partial sums over this rank's input channels
};

// This rank's shards of one layer: qkv [(q + 2 kv) / n, h], o [h, q / n], gate_up [2 f / n, h],
// down [h, f / n]; int8 values from `rng`, every shard packed for the best ISA.
std::vector<Shard> layer_shards(const ModelConfig& c, int n, std::mt19937& rng) {
    const int64_t h = c.hidden, q = c.q_dim(), kv = c.kv_dim(), f = c.intermediate;
    const struct { int64_t rows, cols; bool reduce; } shapes[] = {
        {(q + 2 * kv) / n, h, false}, {h, q / n, true}, {2 * f / n, h, false}, {h, f / n, true}};
    std::vector<Shard> out;
    for (const auto& s : shapes) {
        std::vector<int8_t> v(size_t(s.rows * s.cols));
        for (auto& x : v) x = int8_t(int(rng() % 255) - 127);
        Shard sh;
        sh.w = pack_int8_weights(v.data(), s.rows, s.cols, detect_isa());
        sh.scales.assign(size_t(s.rows), 1.0f / 4096.0f);
        sh.reduce_after = s.reduce;
        out.push_back(std::move(sh));
    }
    return out;
}

using bench::median;

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"tensor-parallel m = 1 W8A8 linears with the model's all-reduces, per rank and token"};
    std::string preset = "tinyllama-1.1b", json_path;
    int tokens = 30;
    bool no_sync = false;
    app.add_option("--config", preset, "model preset or a config.json (shapes only)");
    app.add_option("--tokens", tokens, "timed tokens (after one warm-up token)")->check(CLI::Range(1, 100000));
    app.add_flag("--no-sync", no_sync, "no all-reduces: streaming contention alone");
    app.add_option("--json", json_path, "write results as JSON (rank 0)");
    CLI11_PARSE(app, argc, argv);
    try {
        WaitPolicy policy;
        auto comm = MpiComm::world(policy, "tp");
        const int n = comm->size(), me = comm->rank();
        const bool is_file = preset.size() > 5 && preset.compare(preset.size() - 5, 5, ".json") == 0;
        const ModelConfig c = is_file ? load_hf_config(preset) : preset_config(preset);
        LATTICE_CHECK(c.q_dim() % n == 0 && c.kv_dim() % n == 0 && c.intermediate % n == 0,
                      "bench_tp_linear: {} does not split across {} ranks", preset, n);
        std::mt19937 rng(1234u + unsigned(me));
        std::vector<std::vector<Shard>> layers;
        int64_t bytes = 0;
        for (int64_t l = 0; l < c.n_layers; ++l) {
            layers.push_back(layer_shards(c, n, rng));
            for (const auto& s : layers.back()) bytes += int64_t(s.w.data.size());
        }
        ThreadPool pool(1, false);
        std::vector<float> x(size_t(std::max(c.hidden, c.intermediate)), 0.5f);
        std::vector<float> y(size_t(2 * c.intermediate + c.q_dim() + 2 * c.kv_dim()));
        std::vector<float> red(size_t(c.hidden));
        View red_view = View::contiguous(red.data(), DType::kF32, {c.hidden});
        std::vector<double> tok_s, wait_s;
        for (int t = 0; t <= tokens; ++t) {
            comm->barrier();
            double waited = 0;
            const double t0 = bench::now();
            for (const auto& layer : layers)
                for (const auto& s : layer) {
                    gemm_w8a8(x.data(), 1, s.w.k, s.w, s.scales.data(), y.data(), pool);
                    if (s.reduce_after && !no_sync) {
                        std::copy(y.begin(), y.begin() + c.hidden, red.begin());
                        const double w0 = bench::now();
                        comm->all_reduce_sum(red_view);
                        waited += bench::now() - w0;
                    }
                }
            double mine = bench::now() - t0, slowest = 0;
            MPI_CHECK(MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
            if (t == 0) continue;  // warm-up
            tok_s.push_back(slowest);
            wait_s.push_back(waited);
        }
        // Every rank's median wait in ms, gathered on rank 0.
        double my_wait = median(wait_s) * 1e3;
        std::vector<double> waits(static_cast<size_t>(n), 0.0);
        MPI_CHECK(MPI_Gather(&my_wait, 1, MPI_DOUBLE, waits.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD));
        if (me == 0) {
            const double med = median(tok_s), best = *std::min_element(tok_s.begin(), tok_s.end());
            std::printf("# %s linears, %d rank(s) x 1 thread, %s, %lld all-reduces per token, %s\n", preset.c_str(), n,
                        std::string(isa_name(detect_isa())).c_str(), no_sync ? 0LL : (long long)(2 * c.n_layers),
                        mpi_session().host().c_str());
            std::printf("%8s %12s %12s %14s %16s\n", "ranks", "median ms", "best ms", "GB/s per rank",
                        "wait ms (ranks)");
            std::string w;
            for (double v : waits) w += fmt::format("{}{:.2f}", w.empty() ? "" : " ", v);
            std::printf("%8d %12.2f %12.2f %14.2f %16s\n", n, med * 1e3, best * 1e3, double(bytes) / med * 1e-9,
                        w.c_str());
            bench::write_json(json_path, {{"benchmark", "tp_linear"},
                                          {"config", preset},
                                          {"ranks", n},
                                          {"sync", !no_sync},
                                          {"allreduces_per_token", no_sync ? 0 : 2 * c.n_layers},
                                          {"weight_bytes_per_rank", bytes},
                                          {"tokens", tokens},
                                          {"ms_per_token_median", med * 1e3},
                                          {"ms_per_token_best", best * 1e3},
                                          {"gbs_per_rank_median", double(bytes) / med * 1e-9},
                                          {"allreduce_wait_ms_median_per_rank", waits}});
        }
    } catch (const Error& e) {
        std::fprintf(stderr, "bench_tp_linear: %s\n", e.what());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return 0;
}
