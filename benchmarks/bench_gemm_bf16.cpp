// bf16-weight GEMM benchmark: GFLOP/s of the CPU's float GEMMs on bf16 weights at m = 1, 16, 128, 512 on n x k =
// 4096 x 4096 and 11008 x 4096 (a 7B model's attention and FFN layers), in one run:
//   - "dot": lattice's bf16-pair GEMM (kernels/cpu/gemm_bf16.h, `--dtype bf16`), where the CPU has AVX512_BF16;
//   - "widened": lattice's f32 math on the same weights (gemm_f32.h, the default `--dtype`), best vector level;
//   - "onednn": oneDNN's bf16 x bf16 -> f32 matmul on the same shapes (weights reordered once into the layout
//     it picks; the rows of x handed to it already in bf16), where the build found libdnnl: on Xeons with AMX it
//     runs its AMX-BF16 tile kernels, which is how those reach the tile units; the implementation it chose is
//     printed.
// Ceilings: the register-only rate of vdpbf16ps (32 bf16 multiply-adds a zmm instruction) and of the f32 FMA
// (16), 12 independent chains, per core (CPU time); at m = 1 the weights' GB/s against the all-thread read
// bandwidth (bench_common.h; weights hot in the caches where they fit, so that column can pass 100%).
// Columns "core": a 1-thread pool (oneDNN: one OpenMP thread) timed by the thread's CPU time, best of the
// repetitions (the machine is shared; best is the least disturbed run); "wall": all threads, wall clock.
// Usage: bench_gemm_bf16 [--threads N] [--budget S] [--json FILE]
#include <dlfcn.h>
#include <fmt/format.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "benchmarks/bench_common.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/gemm_f32.h"

#if defined(LATTICE_BENCH_ONEDNN)
#include <oneapi/dnnl/dnnl.hpp>
#endif

using namespace lattice;

namespace {

using bench::best_time;
using bench::thread_cpu_s;

// Register-only loops, 12 chains: flop/s of one thread.
__attribute__((target("avx512f,avx512bf16"))) double dpbf16_flops(int64_t iters) {
    __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = a;
    __m512 c[12];
    for (auto& v : c) v = _mm512_setzero_ps();
    const double t0 = thread_cpu_s();
    for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
        for (int j = 0; j < 12; ++j) c[j] = _mm512_dpbf16_ps(c[j], a, b);
        __asm__ volatile("" : "+v"(a), "+v"(b));
    }
    const double t = thread_cpu_s() - t0;
    __m512 s = c[0];
    for (int j = 1; j < 12; ++j) s = _mm512_add_ps(s, c[j]);
    volatile float sink = _mm512_cvtss_f32(s);
    (void)sink;
    return double(iters) * 12 * 32 * 2 / t;
}

__attribute__((target("avx512f"))) double fma512_flops(int64_t iters) {
    __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(1e-7f);
    __m512 c[12];
    for (auto& v : c) v = _mm512_setzero_ps();
    const double t0 = thread_cpu_s();
    for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
        for (int j = 0; j < 12; ++j) c[j] = _mm512_fmadd_ps(a, b, c[j]);
        __asm__ volatile("" : "+v"(a), "+v"(b));
    }
    const double t = thread_cpu_s() - t0;
    __m512 s = c[0];
    for (int j = 1; j < 12; ++j) s = _mm512_add_ps(s, c[j]);
    volatile float sink = _mm512_cvtss_f32(s);
    (void)sink;
    return double(iters) * 12 * 16 * 2 / t;
}

#if defined(LATTICE_BENCH_ONEDNN)
// omp_set_num_threads from the libgomp libdnnl brought (nothing here needs -fopenmp).
void omp_threads(int n) {
    using SetFn = void (*)(int);
    static const SetFn set = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
    if (set) set(n);
}

// oneDNN's bf16 matmul of m rows against W [n, k] (bf16, row-major: B = W^T is k x n with tag ba), weights
// reordered once into the layout the primitive picks.
struct DirectOnednnBf16 {
    dnnl::engine eng{dnnl::engine::kind::cpu, 0};
    dnnl::stream strm{eng};
    dnnl::matmul::primitive_desc pd;
    dnnl::matmul prim;
    dnnl::memory a, w, c;
    DirectOnednnBf16(const uint16_t* xb, const uint16_t* wt, int64_t m, int64_t k, int64_t n, float* y) {
        using dt = dnnl::memory::data_type;
        using tag = dnnl::memory::format_tag;
        const dnnl::memory::desc a_md({m, k}, dt::bf16, tag::ab), w_any({k, n}, dt::bf16, tag::any),
            w_user({k, n}, dt::bf16, tag::ba), c_md({m, n}, dt::f32, tag::ab);
        pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, w_any, c_md), eng);
        prim = dnnl::matmul(pd);
        a = dnnl::memory(a_md, eng, const_cast<uint16_t*>(xb));
        c = dnnl::memory(c_md, eng, y);
        dnnl::memory user(w_user, eng, const_cast<uint16_t*>(wt));
        w = dnnl::memory(pd.weights_desc(), eng);
        dnnl::reorder(user, w).execute(strm, user, w);
        strm.wait();
    }
    void run() {
        prim.execute(strm, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, c}});
        strm.wait();
    }
    std::string impl() const { return pd.impl_info_str(); }
};
#endif

struct Row {
    std::string kind, impl;
    int64_t m, n, k;
    double core_s, wall_s;
};

}  // namespace

int main(int argc, char** argv) {
    int nt = 0;
    double budget = 0.5;
    std::string json_path;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--threads" && i + 1 < argc)
            nt = std::atoi(argv[++i]);
        else if (a == "--budget" && i + 1 < argc)
            budget = std::atof(argv[++i]);
        else if (a == "--json" && i + 1 < argc)
            json_path = argv[++i];
        else {
            fmt::print(stderr, "usage: bench_gemm_bf16 [--threads N] [--budget S] [--json FILE]\n");
            return 2;
        }
    }
    ThreadPool one(1, false), all(nt, false);
    nt = all.size();
    const bool dot = gemm_bf16_dot_available();
    const bool avx512 = isa_supported(IsaLevel::kAvx512Vnni);
    double peak_dot = 0, peak_fma = 0;
    for (int r = 0; r < 3; ++r) {
        if (dot) peak_dot = std::max(peak_dot, dpbf16_flops(5'000'000));
        if (avx512) peak_fma = std::max(peak_fma, fma512_flops(5'000'000));
    }
    const double bw = bench::measure_read_bandwidth(all);
    fmt::print(
        "bench_gemm_bf16: {} threads, ISA {}, AVX512_BF16 {}; per core (CPU time): vdpbf16ps {:.1f} GFLOP/s, "
        "f32 FMA zmm {:.1f} GFLOP/s; read bandwidth {:.1f} GB/s ({} threads)\n",
        nt, isa_name(detect_isa()), dot ? "yes" : "no", peak_dot / 1e9, peak_fma / 1e9, bw, nt);
    fmt::print("{:<8} {:>4} {:>6} {:>6} | {:>9} {:>8} {:>7} | {:>9} {:>8} {:>7} | {}\n", "kind", "m", "n", "k",
               "core ms", "GFLOP/s", "%peak", "wall ms", "GFLOP/s", "GB/s", "impl");
    std::vector<Row> rows;
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 1.0f);
    const struct { int64_t n, k; } shapes[] = {{4096, 4096}, {11008, 4096}};
    for (const auto [n, k] : shapes) {
        std::vector<uint16_t> w(size_t(n * k));
        for (uint16_t& v : w) v = f32_to_bf16(0.02f * d(rng));
        const PackedBf16 packed = dot ? pack_bf16_weights(w.data(), DType::kBF16, n, k, &all) : PackedBf16{};
        for (const int64_t m : {int64_t(1), int64_t(16), int64_t(128), int64_t(512)}) {
            std::vector<float> x(size_t(m * k)), y(size_t(m * n));
            for (float& v : x) v = d(rng);
            auto add = [&](const std::string& kind, const std::string& impl, auto&& call1, auto&& calln) {
                Row r{kind, impl, m, n, k, best_time(call1, true, budget), best_time(calln, false, budget)};
                const double flop = 2.0 * double(m * n * k);
                const double peak = kind == "widened" ? peak_fma : peak_dot;
                fmt::print("{:<8} {:>4} {:>6} {:>6} | {:>9.3f} {:>8.1f} {:>6.1f}% | {:>9.3f} {:>8.1f} {:>7.1f} | {}\n",
                           kind, m, n, k, r.core_s * 1e3, flop / r.core_s / 1e9,
                           peak > 0 ? 100.0 * flop / r.core_s / peak : 0.0, r.wall_s * 1e3, flop / r.wall_s / 1e9,
                           double(n * k * 2) / r.wall_s / 1e9, impl);
                std::fflush(stdout);
                rows.push_back(r);
            };
            if (dot)
                add(
                    "dot", "lattice", [&](int) { gemm_bf16_dot(x.data(), m, packed, y.data(), one); },
                    [&](int) { gemm_bf16_dot(x.data(), m, packed, y.data(), all); });
            add(
                "widened", std::string("lattice ") + std::string(isa_name(vector_level(detect_isa()))),
                [&](int) { gemm_f32(x.data(), m, k, w.data(), DType::kBF16, n, y.data(), one); },
                [&](int) { gemm_f32(x.data(), m, k, w.data(), DType::kBF16, n, y.data(), all); });
#if defined(LATTICE_BENCH_ONEDNN)
            if (dot && m >= 16) {
                std::vector<uint16_t> xb(x.size());
                for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
                DirectOnednnBf16 o(xb.data(), w.data(), m, k, n, y.data());
                add(
                    "onednn", o.impl(),
                    [&](int) {
                        omp_threads(1);
                        o.run();
                    },
                    [&](int) {
                        omp_threads(nt);
                        o.run();
                    });
            }
#endif
        }
    }
    nlohmann::json j;
    j["threads"] = nt;
    j["isa"] = std::string(isa_name(detect_isa()));
    j["avx512bf16"] = dot;
    j["peak_dpbf16_gflops_core"] = peak_dot / 1e9;
    j["peak_fma512_gflops_core"] = peak_fma / 1e9;
    j["read_gbps"] = bw;
    for (const Row& r : rows) {
        const double flop = 2.0 * double(r.m * r.n * r.k);
        j["rows"].push_back({{"kind", r.kind},
                             {"impl", r.impl},
                             {"m", r.m},
                             {"n", r.n},
                             {"k", r.k},
                             {"core_ms", r.core_s * 1e3},
                             {"core_gflops", flop / r.core_s / 1e9},
                             {"wall_ms", r.wall_s * 1e3},
                             {"wall_gflops", flop / r.wall_s / 1e9}});
    }
    bench::write_json(json_path, j);
    return 0;
}
