// INT8 and 4-bit GEMM benchmark: GOP/s of W8A8, W8A16, W4A8 and W4A16 (4-bit: GGUF Q4_1's form, group 32,
// int4_gemm.h) for each ISA path this CPU runs, at m = 1, 16, 128,
// 512 on n x k = 4096 x 4096 and 11008 x 4096 (a 7B model's attention and FFN layers), with
//   - the ratio to this CPU's int8 peak, measured by a register-only loop of the best ISA's instruction
//     (vpdpbusd zmm; else vpdpbusd ymm; else AVX2's vpmaddwd + vpaddd) (12 independent
//     accumulator chains per thread, all threads), and
//   - for m = 1 the weight-streaming GB/s against a measured memory bandwidth (all threads reading a
//     1 GiB buffer). The L3 here is large (hundreds of MB), so m = 1 and m = 16 (a decode step of 16
//     sequences) are timed twice: "hot" (the same weights every call, L3-resident) and "dram" (rotating
//     through copies totalling > 1 GiB), the decode-realistic number.
// Where the build has oneDNN (libdnnl) and the CPU AVX-512 VNNI, W8A8 also runs through oneDNN's matmul
// (onednn_int8.h: u8 x s8 -> s32 plus lattice's epilogue, weights reordered once; on AMX Xeons oneDNN picks
// its tile kernels) at m = 16, 128, 512 in the same run, rows "onednn" with the implementation oneDNN chose,
// and a closing table of lattice's best-ISA W8A8 against it (ratio = lattice GOP/s / oneDNN GOP/s). Where AMX
// runs, the "amx" rows at m >= 16 are lattice's own tile kernel (int8_gemm_amx_avx512.cpp: the weights here
// carry no oneDNN copy), and their %peak is against a register-only tdpbusd loop (4 independent 16 x 16 C tiles).
// Time is the best of the repetitions (the machine is shared; best is the least disturbed run).
// GB/s counts the packed bytes a call streams (4-bit: nibbles, f16 scales and minimums, 5 bits per weight).
// Usage: bench_gemm_int8 [--full] [--threads N] [--modes w8a8,w8a16,w4a8,w4a16] [--json FILE]. Default (quick)
// keeps the run < ~2 min: the scalar path only at m = 1, AVX2 not at m = 128, W8A16 and the 4-bit modes not on
// the AVX-VNNI level (it runs the AVX2 float and 4-bit kernels), and a short time budget per point (best of
// >= 1 timed run after a warm-up).
#include <fmt/format.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "benchmarks/bench_common.h"
#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/int4_gemm.h"
#include "kernels/cpu/int8_gemm.h"
#include "kernels/cpu/onednn_int8.h"

using namespace lattice;

namespace {

using bench::best_time;
using bench::thread_cpu_s;

// AMX-INT8's ceiling: tdpbusd into 4 independent C tiles (16 x 16 int32, 64 bytes of k: 16384 MACs each) from
// A and B tiles loaded once. Only where isa_supported(kAmx).
double amx_ops_per_s(int64_t iters) {
    using amx::AmxTiles;
    alignas(64) static uint8_t buf[amx::kTileRows * amx::kTileBytes];
    std::memset(buf, 1, sizeof buf);
    AmxTiles::configure(amx::gemm_config(amx::kTileRows));
    AmxTiles::load_a<0>(buf, amx::kTileBytes);
    AmxTiles::load_a<1>(buf, amx::kTileBytes);
    AmxTiles::load_b<0>(buf);
    AmxTiles::load_b<1>(buf);
    AmxTiles::zero_c<0, 0>();
    AmxTiles::zero_c<0, 1>();
    AmxTiles::zero_c<1, 0>();
    AmxTiles::zero_c<1, 1>();
    const double t0 = thread_cpu_s();
    for (int64_t i = 0; i < iters; ++i) {
        AmxTiles::dot<0, 0>();
        AmxTiles::dot<0, 1>();
        AmxTiles::dot<1, 0>();
        AmxTiles::dot<1, 1>();
    }
    const double t = thread_cpu_s() - t0;
    alignas(64) int32_t c[amx::kTileRows][amx::kTileBytes / 4];
    AmxTiles::store_c<0, 0>(c, amx::kTileBytes);
    AmxTiles::release();
    volatile int32_t sink = c[0][0];
    (void)sink;
    return double(iters) * 4 * 16384 * 2 / t;
}

// Register-only vpdpbusd loop: returns int8 ops/s of one thread (1 MAC = 2 ops, 64 MACs per zmm op), 12
// independent accumulator chains, in volatile asm: written as intrinsics on 12 zeroed accumulators with the same
// operands, GCC 12 merged the identical chains into one, and the loop timed one latency-bound vpdpbusd per 12
// counted (the "peak" printed before 2026-12-07 was ~3x the real one on the Zen 4 VM).
__attribute__((target("avx512f,avx512vnni"))) double vnni512_ops_per_s(int64_t iters, uint32_t seed) {
    __m512i a = _mm512_set1_epi32(int(seed | 0x01010101u)), b = _mm512_set1_epi32(int(seed * 7u + 3u));
    __m512i c0 = _mm512_set1_epi32(0), c1 = _mm512_set1_epi32(1), c2 = _mm512_set1_epi32(2), c3 = _mm512_set1_epi32(3),
            c4 = _mm512_set1_epi32(4), c5 = _mm512_set1_epi32(5), c6 = _mm512_set1_epi32(6), c7 = _mm512_set1_epi32(7),
            c8 = _mm512_set1_epi32(8), c9 = _mm512_set1_epi32(9), c10 = _mm512_set1_epi32(10),
            c11 = _mm512_set1_epi32(11);
    double t0 = thread_cpu_s();
    for (int64_t i = 0; i < iters; ++i) {
        // Named accumulators (an array under volatile asm stays in memory), four to a statement.
        __asm__ volatile("vpdpbusd %5, %4, %0\n\tvpdpbusd %5, %4, %1\n\tvpdpbusd %5, %4, %2\n\tvpdpbusd %5, %4, %3"
                         : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3)
                         : "v"(a), "v"(b));
        __asm__ volatile("vpdpbusd %5, %4, %0\n\tvpdpbusd %5, %4, %1\n\tvpdpbusd %5, %4, %2\n\tvpdpbusd %5, %4, %3"
                         : "+v"(c4), "+v"(c5), "+v"(c6), "+v"(c7)
                         : "v"(a), "v"(b));
        __asm__ volatile("vpdpbusd %5, %4, %0\n\tvpdpbusd %5, %4, %1\n\tvpdpbusd %5, %4, %2\n\tvpdpbusd %5, %4, %3"
                         : "+v"(c8), "+v"(c9), "+v"(c10), "+v"(c11)
                         : "v"(a), "v"(b));
    }
    double t = thread_cpu_s() - t0;
    __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3)),
                                 _mm512_add_epi32(_mm512_add_epi32(c4, c5), _mm512_add_epi32(c6, c7)));
    s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_add_epi32(c8, c9), _mm512_add_epi32(c10, c11)));
    alignas(64) int32_t lanes[16];
    _mm512_store_si512(lanes, s);
    volatile int32_t sink = lanes[0] + lanes[15];
    (void)sink;
    return double(iters) * 12 * 64 * 2 / t;
}

// Same loop on ymm with AVX-VNNI (VEX): that path's own ceiling.
__attribute__((target("avx2,avxvnni"))) double vnni256_ops_per_s(int64_t iters, uint32_t seed) {
    __m256i a = _mm256_set1_epi32(int(seed | 0x01010101u)), b = _mm256_set1_epi32(int(seed * 7u + 3u));
    __m256i c0 = _mm256_set1_epi32(0), c1 = _mm256_set1_epi32(1), c2 = _mm256_set1_epi32(2), c3 = _mm256_set1_epi32(3),
            c4 = _mm256_set1_epi32(4), c5 = _mm256_set1_epi32(5), c6 = _mm256_set1_epi32(6), c7 = _mm256_set1_epi32(7),
            c8 = _mm256_set1_epi32(8), c9 = _mm256_set1_epi32(9), c10 = _mm256_set1_epi32(10),
            c11 = _mm256_set1_epi32(11);
    double t0 = thread_cpu_s();
    for (int64_t i = 0; i < iters; ++i) {
        __asm__ volatile(
            "%{vex%} vpdpbusd %5, %4, %0\n\t%{vex%} vpdpbusd %5, %4, %1\n\t"
            "%{vex%} vpdpbusd %5, %4, %2\n\t%{vex%} vpdpbusd %5, %4, %3"
            : "+x"(c0), "+x"(c1), "+x"(c2), "+x"(c3)
            : "x"(a), "x"(b));
        __asm__ volatile(
            "%{vex%} vpdpbusd %5, %4, %0\n\t%{vex%} vpdpbusd %5, %4, %1\n\t"
            "%{vex%} vpdpbusd %5, %4, %2\n\t%{vex%} vpdpbusd %5, %4, %3"
            : "+x"(c4), "+x"(c5), "+x"(c6), "+x"(c7)
            : "x"(a), "x"(b));
        __asm__ volatile(
            "%{vex%} vpdpbusd %5, %4, %0\n\t%{vex%} vpdpbusd %5, %4, %1\n\t"
            "%{vex%} vpdpbusd %5, %4, %2\n\t%{vex%} vpdpbusd %5, %4, %3"
            : "+x"(c8), "+x"(c9), "+x"(c10), "+x"(c11)
            : "x"(a), "x"(b));
    }
    double t = thread_cpu_s() - t0;
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3)),
                                 _mm256_add_epi32(_mm256_add_epi32(c4, c5), _mm256_add_epi32(c6, c7)));
    s = _mm256_add_epi32(s, _mm256_add_epi32(_mm256_add_epi32(c8, c9), _mm256_add_epi32(c10, c11)));
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
    volatile int32_t sink = lanes[0];
    (void)sink;
    return double(iters) * 12 * 32 * 2 / t;
}

// AVX2 without VNNI: the kernel's own instruction pair, vpmaddwd (16 int16 MACs = 32 ops) + vpaddd into
// 12 independent accumulators; the ceiling of the AVX2 path (int8 widened to int16, int8_gemm_avx2.cpp).
__attribute__((target("avx2"))) double madd256_ops_per_s(int64_t iters, uint32_t seed) {
    __m256i a = _mm256_set1_epi32(int(seed | 0x01010101u)), b = _mm256_set1_epi32(int(seed * 7u + 3u));
    __m256i c[12];
    for (auto& v : c) v = _mm256_setzero_si256();
    double t0 = thread_cpu_s();
    for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
        for (int j = 0; j < 12; ++j) {  // volatile asm: 12 real vpmaddwd (identical operands would be CSE'd to one)
            __m256i t;
            __asm__ volatile("vpmaddwd %2, %1, %0" : "=x"(t) : "x"(a), "x"(b));
            c[j] = _mm256_add_epi32(c[j], t);
        }
        __asm__ volatile("" : "+x"(a), "+x"(b));
    }
    double t = thread_cpu_s() - t0;
    __m256i s = c[0];
    for (int j = 1; j < 12; ++j) s = _mm256_add_epi32(s, c[j]);
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
    volatile int32_t sink = lanes[0];
    (void)sink;
    return double(iters) * 12 * 16 * 2 / t;
}

struct Row {
    std::string isa, mode, kind;
    int64_t m, n, k;
    double ms_core;  // best CPU time of the call on a 1-thread pool (caller thread)
    double ms_wall;  // best wall time on the all-thread pool
    double weight_bytes;  // packed bytes streamed per call (scales and group data included)
    std::string impl;     // oneDNN rows: the implementation oneDNN chose
};

void print_row(const Row& r, double peak_core, double bw_core) {
    const double ops = 2.0 * double(r.m) * double(r.n) * double(r.k);
    const double core_s = r.ms_core * 1e-3;
    fmt::print("{:<8} {:<6} {:<5} {:>4} {:>6} {:>6} | {:>9.3f} {:>8.1f} {:>6.1f}% {:>7.1f} {:>6.1f}% "
               "| {:>9.3f} {:>8.1f} {:>7.1f}{}\n",
               r.isa, r.mode, r.kind, r.m, r.n, r.k, r.ms_core, ops / core_s / 1e9,
               peak_core > 0 ? 100.0 * ops / core_s / peak_core : 0.0, r.weight_bytes / core_s / 1e9,
               100.0 * r.weight_bytes / core_s / bw_core, r.ms_wall, ops / (r.ms_wall * 1e-3) / 1e9,
               r.weight_bytes / (r.ms_wall * 1e-3) / 1e9, r.impl.empty() ? "" : "  " + r.impl);
    std::fflush(stdout);
}

// lattice's best-ISA W8A8 against oneDNN at each (n, k, m) both ran: GOP/s per core and on all threads.
void print_onednn_ratios(const std::vector<Row>& rows) {
    bool header = false;
    for (const Row& o : rows) {
        if (o.isa != "onednn") continue;
        const Row* best = nullptr;
        for (const Row& r : rows)
            if (r.isa != "onednn" && r.mode == "w8a8" && r.kind == "hot" && r.m == o.m && r.n == o.n &&
                r.k == o.k && (!best || r.ms_core < best->ms_core))
                best = &r;
        if (!best) continue;
        if (!header)
            fmt::print("W8A8, lattice ({}) / oneDNN ({}):\n{:>4} {:>6} {:>6} | {:>10} {:>10} {:>6} | {:>10} {:>10} "
                       "{:>6}\n", best->isa, o.impl, "m", "n", "k", "own core", "oneDNN", "ratio", "own wall", "oneDNN",
                       "ratio");
        header = true;
        const double ops = 2.0 * double(o.m) * double(o.n) * double(o.k) / 1e6;  // GOP/s from ms
        fmt::print("{:>4} {:>6} {:>6} | {:>10.1f} {:>10.1f} {:>5.2f}x | {:>10.1f} {:>10.1f} {:>5.2f}x\n", o.m, o.n, o.k,
                   ops / best->ms_core, ops / o.ms_core, o.ms_core / best->ms_core, ops / best->ms_wall,
                   ops / o.ms_wall, o.ms_wall / best->ms_wall);
    }
}

}  // namespace

int main(int argc, char** argv) {
    bool full = false;
    int threads = 0;
    std::vector<std::pair<int64_t, int64_t>> shapes = {{4096, 4096}, {11008, 4096}};
    std::string json_path, only_isa;
    std::vector<std::string> modes = {"w8a8", "w8a16", "w4a8", "w4a16"};
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--full") full = true;
        else if (a == "--quick") full = false;
        else if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
        else if (a == "--json" && i + 1 < argc) json_path = argv[++i];
        else if (a == "--isa" && i + 1 < argc) only_isa = argv[++i];
        else if (a == "--modes" && i + 1 < argc) {  // w8a8,w8a16,w4a8,w4a16
            modes.clear();
            std::string v = argv[++i];
            for (size_t pos = 0; pos <= v.size();) {
                size_t end = std::min(v.find(',', pos), v.size());
                modes.push_back(v.substr(pos, end - pos));
                if (modes.back() != "w8a8" && modes.back() != "w8a16" && modes.back() != "w4a8" &&
                    modes.back() != "w4a16") {
                    std::fprintf(stderr, "bench_gemm_int8: bad --modes entry '%s' (w8a8, w8a16, w4a8, w4a16)\n",
                                 modes.back().c_str());
                    return 2;
                }
                pos = end + 1;
            }
        }
        else if (a == "--shapes" && i + 1 < argc) {  // NxK,NxK (e.g. TinyLlama's 2048x2048,5632x2048,2048x5632)
            shapes.clear();
            std::string v = argv[++i];
            for (size_t pos = 0; pos < v.size();) {
                size_t end = v.find(',', pos);
                if (end == std::string::npos) end = v.size();
                long long n = 0, k = 0;
                if (std::sscanf(v.substr(pos, end - pos).c_str(), "%lldx%lld", &n, &k) != 2 || n < 1 || k < 1 ||
                    k > kInt8MaxK || n > (1 << 20)) {
                    std::fprintf(stderr, "bench_gemm_int8: bad --shapes entry '%s' (want NxK)\n",
                                 v.substr(pos, end - pos).c_str());
                    return 2;
                }
                shapes.emplace_back(n, k);
                pos = end + 1;
            }
        } else {
            std::fprintf(stderr, "usage: %s [--quick|--full] [--threads N] [--isa scalar|avx2|avxvnni|avx512] "
                         "[--shapes NxK,...] [--modes w8a8,w8a16,w4a8,w4a16] [--json FILE]\n", argv[0]);
            return 2;
        }
    }
    ThreadPool pool(threads, true), pool1(1, true);  // pinned, as the published GEMM rates were measured
    const int nt = pool.size();
    const double t_start = bench::now();

    // Ceilings, from per-thread CPU time (exact for the calling thread even when the cores are shared).
    double peak_all = 0, peak_core = 0;
    if (isa_supported(IsaLevel::kAvx512Vnni)) {
        std::vector<double> per(static_cast<size_t>(nt), 0.0);
        for (int rep = 0; rep < 3; ++rep)
            pool.run_on_all([&](int t) {
                per[size_t(t)] = std::max(per[size_t(t)], vnni512_ops_per_s(10'000'000, uint32_t(t + 1)));
            });
        for (double v : per) peak_all += v;
        peak_core = per[0];
    }
    double peak_ymm_core = 0;
    if (isa_supported(IsaLevel::kAvxVnni))
        for (int rep = 0; rep < 3; ++rep) peak_ymm_core = std::max(peak_ymm_core, vnni256_ops_per_s(10'000'000, 5));
    // The ceiling %peak is measured against: the best ISA's own instruction loop (AVX-512 VNNI, else
    // AVX-VNNI ymm, else AVX2's vpmaddwd + vpaddd).
    std::string peak_kind = "vpdpbusd zmm";
    if (peak_core == 0 && peak_ymm_core > 0) {
        peak_kind = "vpdpbusd ymm (AVX-VNNI)";
        peak_core = peak_ymm_core;
        peak_all = peak_core * nt;  // per-core loop x threads (one core's CPU time is exact on shared cores)
    } else if (peak_core == 0 && isa_supported(IsaLevel::kAvx2)) {
        peak_kind = "vpmaddwd + vpaddd ymm (AVX2)";
        for (int rep = 0; rep < 3; ++rep) peak_core = std::max(peak_core, madd256_ops_per_s(10'000'000, 5));
        peak_all = peak_core * nt;
    }
    double peak_amx_core = 0;  // the amx rows' ceiling
    if (isa_supported(IsaLevel::kAmx))
        for (int rep = 0; rep < 3; ++rep) peak_amx_core = std::max(peak_amx_core, amx_ops_per_s(2'000'000));
    const size_t bw_bytes = size_t(1) << 30;
    std::vector<uint8_t, AlignedAllocator64<uint8_t>> big(bw_bytes, 1);
    double bw_wall = 0, bw_all = 0, bw_core = 0;
    for (int rep = 0; rep < 3; ++rep) {
        std::vector<uint64_t> sinks(static_cast<size_t>(nt), 0);
        std::vector<double> rate(static_cast<size_t>(nt), 0.0);
        double t0 = bench::now();
        pool.run_on_all([&](int t) {
            auto [lo, hi] = split_range(int64_t(bw_bytes), t, nt, 4096);
            double c0 = thread_cpu_s();
            sinks[size_t(t)] = bench::stream_read(big.data() + lo, size_t(hi - lo));
            rate[size_t(t)] = double(hi - lo) / (thread_cpu_s() - c0);
        });
        bw_wall = std::max(bw_wall, double(bw_bytes) / (bench::now() - t0));
        double sum = 0;
        for (double r : rate) sum += r;
        bw_all = std::max(bw_all, sum);
        double c0 = thread_cpu_s();
        uint64_t s1 = bench::stream_read(big.data(), bw_bytes / 2);
        bw_core = std::max(bw_core, double(bw_bytes / 2) / (thread_cpu_s() - c0));
        volatile uint64_t sink = sinks[0] ^ s1;
        (void)sink;
    }
    big.clear();
    big.shrink_to_fit();
    fmt::print(
        "bench_gemm_int8: {} threads, best ISA {}\n"
        "  int8 peak, register-only {} (CPU time): {:.0f} GOP/s per core, {:.0f} GOP/s all threads"
        " (ymm AVX-VNNI: {:.0f} GOP/s per core; AMX tdpbusd: {:.0f} GOP/s per core, the amx rows' %peak)\n"
        "  memory read bandwidth, 1 GiB stream: {:.1f} GB/s one core (CPU time), {:.1f} GB/s all threads "
        "(CPU time), {:.1f} GB/s all threads (wall)\n"
        "  'core' columns: 1-thread pool, CPU time of the call (immune to other processes on these shared\n"
        "  cores); %peak and %bw against the per-core ceilings. 'wall' columns: {}-thread pool, wall clock.\n",
        nt, isa_name(best_isa()), peak_kind, peak_core / 1e9, peak_all / 1e9, peak_ymm_core / 1e9, peak_amx_core / 1e9,
        bw_core / 1e9, bw_all / 1e9, bw_wall / 1e9, nt);

    std::vector<IsaLevel> isas;
    for (IsaLevel l : all_isa_levels())
        if (isa_supported(l) && (only_isa.empty() || parse_isa(only_isa) == l)) isas.push_back(l);

    std::vector<Row> rows;
    fmt::print("{:<8} {:<6} {:<5} {:>4} {:>6} {:>6} | {:>9} {:>8} {:>7} {:>7} {:>7} | {:>9} {:>8} {:>7}\n", "isa",
               "mode", "kind", "m", "n", "k", "core ms", "GOP/s", "%peak", "GB/s", "%bw", "wall ms", "GOP/s", "GB/s");
    std::mt19937 rng(42);
    for (auto [n, k] : shapes) {
        std::vector<int8_t> q(static_cast<size_t>(n * k));
        std::uniform_int_distribution<int> d(-127, 127);
        for (auto& v : q) v = int8_t(d(rng));
        std::vector<float> sw(static_cast<size_t>(n), 0.01f);
        // 4-bit weights of the same shape: random nibbles, f16 scales and minimums (GGUF Q4_1's form).
        Int4Weights q4(n, k, 32, Int4Kind::kAffine);
        std::uniform_int_distribution<int> byte(0, 255);
        for (auto& v : q4.qs) v = uint8_t(byte(rng));
        for (auto& v : q4.d) v = f32_to_f16(0.001f);
        for (auto& v : q4.m) v = f32_to_f16(-0.008f);
        const int64_t mmax = 512;
        std::vector<float> x(static_cast<size_t>(mmax * k)), y(static_cast<size_t>(mmax * n));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (auto& v : x) v = nd(rng);
        for (const std::string& mode : modes) {
            const bool int4 = mode == "w4a8" || mode == "w4a16";
            const bool w16 = mode == "w8a16" || mode == "w4a16";
            // One packed layout serves every ISA (int8_gemm.h, int4_gemm.h); rotating copies (> 1 GiB
            // together) for the DRAM-streaming m = 1 numbers.
            PackedInt8 base;
            PackedInt4 base4;
            if (int4)
                base4 = pack_int4_weights(q4.matrix(), IsaLevel::kScalar);
            else
                base = pack_int8_weights(q.data(), n, k, IsaLevel::kScalar);
            const size_t wbytes = int4 ? size_t(base4.bytes()) : base.data.size();
            std::vector<PackedInt8> copies(int4 ? 0 : (bw_bytes + wbytes - 1) / wbytes, base);
            std::vector<PackedInt4> copies4(int4 ? (bw_bytes + wbytes - 1) / wbytes : 0, base4);
            // oneDNN beside lattice's kernels (W8A8, m >= kInt8OnednnMinM, hot weights).
            const IsaLevel od_isa = best_isa() >= IsaLevel::kAvx512Vnni ? best_isa() : IsaLevel::kScalar;
            if (mode == "w8a8" && onednn_compiled() && od_isa != IsaLevel::kScalar) {
                set_int8_provider(Int8Provider::kOnednn);
                PackedInt8 od = pack_int8_weights(q.data(), n, k, od_isa);
                set_int8_provider(Int8Provider::kAuto);
                for (int64_t m : {16, 128, 512}) {
                    const double budget = full ? 1.0 : 0.05;
                    auto run = [&](ThreadPool& p) {
                        return [&](int) { gemm_w8a8(x.data(), m, k, od, sw.data(), y.data(), p); };
                    };
                    Row r{"onednn", mode, "hot", m, n, k, 1e3 * best_time(run(pool1), true, budget),
                          1e3 * best_time(run(pool), false, budget), double(od.data.size()), {}};
                    r.impl = onednn_int8_impl(*od.onednn, m, (k + 63) / 64 * 64);
                    print_row(r, peak_core, bw_core);
                    rows.push_back(r);
                }
            }
            for (IsaLevel isa : isas) {
                base.isa = base4.isa = isa;
                for (auto& c : copies) c.isa = isa;
                for (auto& c : copies4) c.isa = isa;
                if (!full && w16 && isa == IsaLevel::kAvxVnni) continue;  // the AVX2 float kernel
                if (!full && int4 && isa == IsaLevel::kAvxVnni) continue;  // the AVX2 4-bit kernels
                for (int64_t m : {1, 16, 128, 512}) {
                    if (!full && isa == IsaLevel::kScalar && m > 1) continue;
                    if (!full && isa == IsaLevel::kAvx2 && best_isa() != IsaLevel::kAvx2 && m == 128)
                        continue;  // quick: AVX2 is the slow fallback where a VNNI path exists
                    for (const char* kind : {"hot", "dram"}) {
                        bool dram = std::string(kind) == "dram";
                        if (dram && m > 16) continue;  // m = 16 from DRAM: a batched decode step
                        const double budget = full ? 1.0 : 0.05;
                        auto run = [&](ThreadPool& p) {
                            return [&, dram](int rep) {
                                if (int4) {
                                    const PackedInt4& w = dram ? copies4[size_t(rep) % copies4.size()] : base4;
                                    if (w16) gemm_w4a16(x.data(), m, k, w, y.data(), p);
                                    else gemm_w4a8(x.data(), m, k, w, y.data(), p);
                                    return;
                                }
                                const PackedInt8& w = dram ? copies[size_t(rep) % copies.size()] : base;
                                if (w16) gemm_w8a16(x.data(), m, k, w, sw.data(), y.data(), p);
                                else gemm_w8a8(x.data(), m, k, w, sw.data(), y.data(), p);
                            };
                        };
                        Row r{std::string(isa_name(isa)), mode, kind, m, n, k,
                              1e3 * best_time(run(pool1), true, budget), 1e3 * best_time(run(pool), false, budget),
                              double(wbytes), {}};
                        // W8A8 and W4A8 (group form) run AMX tiles from 16 rows at the amx level.
                        const bool tiles = isa == IsaLevel::kAmx && !w16 && m >= (int4 ? kInt4AmxMinM : kInt8AmxMinM);
                        print_row(r, tiles ? peak_amx_core : peak_core, bw_core);
                        rows.push_back(r);
                    }
                }
            }
        }
    }
    print_onednn_ratios(rows);
    fmt::print("total {:.1f} s\n", bench::now() - t_start);
    if (!json_path.empty()) {
        nlohmann::json j;
        j["threads"] = nt;
        j["best_isa"] = std::string(isa_name(best_isa()));
        j["onednn"] = onednn_compiled() ? onednn_describe() : std::string();
        j["int8_peak_kind"] = peak_kind;
        j["int8_peak_gops_core"] = peak_core / 1e9;
        j["int8_peak_gops_all"] = peak_all / 1e9;
        j["int8_peak_ymm_vnni_gops_core"] = peak_ymm_core / 1e9;
        j["int8_peak_amx_gops_core"] = peak_amx_core / 1e9;
        j["mem_bw_gbs_core"] = bw_core / 1e9;
        j["mem_bw_gbs_all_cpu"] = bw_all / 1e9;
        j["mem_bw_gbs_all_wall"] = bw_wall / 1e9;
        j["results"] = nlohmann::json::array();
        for (const Row& r : rows) {
            const double ops = 2.0 * double(r.m) * double(r.n) * double(r.k);
            const double wb = r.weight_bytes;
            const double core_s = r.ms_core * 1e-3;
            j["results"].push_back({{"isa", r.isa}, {"mode", r.mode}, {"kind", r.kind}, {"m", r.m}, {"n", r.n},
                                    {"k", r.k}, {"ms_core_cpu", r.ms_core}, {"gops_core", ops / core_s / 1e9},
                                    {"pct_peak_core", peak_core > 0 ? 100.0 * ops / core_s / peak_core : 0.0},
                                    {"weight_gbs_core", wb / core_s / 1e9},
                                    {"pct_mem_bw_core", 100.0 * wb / core_s / bw_core}, {"ms_wall", r.ms_wall},
                                    {"weight_bytes", wb}, {"weight_gbs_wall", wb / (r.ms_wall * 1e-3) / 1e9},
                                    {"gops_wall", ops / (r.ms_wall * 1e-3) / 1e9}, {"impl", r.impl}});
        }
        std::ofstream f(json_path);
        if (!f) {
            std::fprintf(stderr, "bench_gemm_int8: cannot write %s\n", json_path.c_str());
            return 1;
        }
        f << j.dump(2) << "\n";
    }
    return 0;
}
