// GPU GEMM benchmark: INT8 (cuBLASLt IMMA, int32 out) and FP16 (cuBLASLt, fp32 accumulate) TOPS,
// first at 4096^3 (the goal: INT8 >= 70% of the dense tensor-core peak), then at
// m = 1, 16, 256, 4096 on n x k = 8192 x 8192 and 28672 x 8192 (Llama-70B o/qkv-class and
// gate/up-class shapes), plus the decode GEMVs the backend runs at m <= kGemvMaxRows = 16 (W8A8
// dp4a, W8A16) with their weight bandwidth against HBM, and the 4-bit W4A16 linears (kernels/cuda/int4_gemm.h:
// affine groups of 32, 5 bits a weight; the GEMV at m <= kInt4GemvMaxRows = 8, the tensor-core GEMM above).
// Ratios: the dense peaks of gpu_peaks.h.
// Every row names its path: "gemv", or "lt#i/c", the cuBLASLt algorithm LtGemm chose (index i in
// the heuristic's order of c candidates; int8 and fp16 both timed unless --no-autotune, while the
// backend's default times int8 only; algo/tile/split-k ids in the JSON). A summary gives, per
// shape and m, the path CudaBackend::linear takes for W8A8 and W8A16 (GEMV for m <= 16, else
// IMMA, or dequantize + fp16 GEMM) next to the other path's time.
// Method: weights and activations random on the device, 3 warm-up calls (the first plans and,
// with autotuning, times the cuBLASLt candidates), then timed batches of calls with CUDA events
// until >= 0.2 s per configuration; results checked for NaN after timing.
// Output: a table on stdout and gemm.json in --out DIR (default ./gpu-results), rewritten after every
// row (a run cut off by its deadline keeps the rows it measured; "complete" says whether it ended).
// --deadline S: no configuration starts after S seconds; gemm.json then says "complete": false and
// "cut_at_deadline": true (check.sh passes its step's deadline). IMMA at m <= kGemvMaxRows goes through
// try_gemm_i8, as the backend would (it runs the GEMV there): a shape cuBLASLt refuses is a row saying so.
// Usage: bench_gpu_gemm [--out DIR] [--device N] [--quick] [--no-autotune] [--deadline S]
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "base/cuda_check.h"
#include "base/error.h"
#include "benchmarks/gpu/gpu_peaks.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/int4_gemm.h"
#include "kernels/cuda/kernels.h"

using namespace lattice;

namespace {

struct DevMem {
    void* p = nullptr;
    explicit DevMem(size_t bytes) { CUDA_CHECK(cudaMalloc(&p, bytes)); }
    ~DevMem() { cudaFree(p); }
    template <typename T>
    T* as() const {
        return static_cast<T*>(p);
    }
};

// Seconds per call of fn (enqueued on stream), timed with events over >= min_s.
double time_per_call(cudaStream_t stream, const std::function<void()>& fn, double min_s) {
    for (int i = 0; i < 3; ++i) fn();
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    int iters = 1;
    double per = 0;
    for (;;) {
        CUDA_CHECK(cudaEventRecord(a, stream));
        for (int i = 0; i < iters; ++i) fn();
        CUDA_CHECK(cudaEventRecord(b, stream));
        CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        per = ms * 1e-3 / iters;
        if (ms * 1e-3 >= min_s || iters >= (1 << 20)) break;
        iters = std::max(iters * 2, int(min_s / std::max(per, 1e-7)) + 1);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return per;
}

// The table's path column for a cuBLASLt call, and its JSON description.
std::string lt_path(const cuda::LtAlgoInfo& a) {
    return fmt::format("lt#{}/{}", a.index, a.candidates);
}
nlohmann::json lt_json(const cuda::LtAlgoInfo& a) {
    return {{"index", a.index},    {"candidates", a.candidates}, {"dropped", a.dropped},     {"algo_id", a.algo_id},
            {"tile", a.tile},      {"splitk", a.splitk},         {"workspace", a.workspace}, {"timed", a.timed},
            {"tune_us", a.time_us}};
}

bool finite_f16(const void* dev, size_t n) {
    std::vector<uint16_t> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), dev, n * 2, cudaMemcpyDeviceToHost));
    for (uint16_t v : h)
        if ((v & 0x7c00u) == 0x7c00u) return false;
    return true;
}

}  // namespace

int main(int argc, char** argv) try {
    std::string out_dir = "gpu-results";
    int device = 0;
    bool quick = false;
    double deadline_s = 1e30;
    const auto t_start = std::chrono::steady_clock::now();
    cuda::LtOptions lt_options;
    lt_options.autotune_float = true;  // the fp16 rows show what timing finds (the backend default is off)
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--out" && i + 1 < argc)
            out_dir = argv[++i];
        else if (a == "--device" && i + 1 < argc)
            device = std::stoi(argv[++i]);
        else if (a == "--quick")
            quick = true;
        else if (a == "--no-autotune")
            lt_options.autotune = lt_options.autotune_float = false;
        else if (a == "--deadline" && i + 1 < argc)
            deadline_s = std::stod(argv[++i]);
        else
            LATTICE_FAIL(
                "bench_gpu_gemm: unknown argument '{}' (usage: [--out DIR] [--device N] [--quick] [--no-autotune] "
                "[--deadline S])",
                a);
    }
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        fmt::print("bench_gpu_gemm: SKIP: no CUDA device\n");
        return 77;  // like the tests: a skip is never a pass
    }
    CUDA_CHECK(cudaSetDevice(device));
    const bench::GpuPeaks peaks = bench::gpu_peaks(device);
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    fmt::print("GPU {}: {} (sm_{}{}), peaks: INT8 {} TOPS, FP16 {} TFLOPS, HBM {:.0f} GB/s [{}]\n", device, prop.name,
               prop.major, prop.minor, peaks.int8_tops, peaks.fp16_tflops, peaks.hbm_gbs, peaks.model);

    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    cuda::LtGemm lt(lt_options);
    const double min_s = quick ? 0.05 : 0.2;
    const std::vector<std::pair<int64_t, int64_t>> shapes = {{8192, 8192}, {28672, 8192}};
    const std::vector<int64_t> ms = {1, 16, 256, 4096};
    const int64_t max_m = 4096, max_n = 28672, k = 8192;
    DevMem w8(size_t(max_n) * k), x8(size_t(max_m) * k), acc(size_t(max_m) * max_n * 4);
    DevMem w16(size_t(max_n) * k * 2), x16(size_t(max_m) * k * 2), y16(size_t(max_m) * max_n * 2);
    DevMem sw(size_t(max_n) * 4), sx(size_t(max_m) * 4);
    cuda::fill_random(w8.p, DType::kI8, max_n * k, 1, 0, stream);
    cuda::fill_random(x8.p, DType::kI8, max_m * k, 2, 0, stream);
    cuda::fill_random(w16.p, DType::kF16, max_n * k, 3, 0.05f, stream);
    cuda::fill_random(x16.p, DType::kF16, max_m * k, 4, 1.0f, stream);
    cuda::fill_random(sw.p, DType::kF32, max_n, 5, 0.01f, stream);
    cuda::fill_random(sx.p, DType::kF32, max_m, 6, 0.01f, stream);
    // 4-bit weights [max_n, k]: any byte is two valid nibbles; f16 scales and minimums per group of 32.
    DevMem q4(size_t(max_n) * k / 2), q4meta(size_t(max_n) * (k / 32) * 2 * 2);
    cuda::fill_random(q4.p, DType::kI8, max_n * k / 2, 7, 0, stream);
    cuda::fill_random(q4meta.p, DType::kF16, max_n * (k / 32) * 2, 8, 0.01f, stream);
    auto int4_dev = [&](int64_t n) {
        cuda::Int4Dev d;
        d.qs = q4.as<uint8_t>();
        d.d = q4meta.as<uint16_t>();
        d.a = q4meta.as<uint16_t>() + n * (k / 32);
        d.affine = true;
        d.n = n;
        d.k = k;
        d.kp = k;
        d.group = 32;
        return d;
    };

    nlohmann::json rows = nlohmann::json::array();
    nlohmann::json paths = nlohmann::json::array();
    bool cut = false;
    auto past_deadline = [&] {
        cut = cut || std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count() > deadline_s;
        return cut;
    };
    auto write = [&](bool complete) {
        std::filesystem::create_directories(out_dir);
        nlohmann::json doc = {{"benchmark", "gpu_gemm"},
                              {"gpu", prop.name},
                              {"sm", prop.major * 10 + prop.minor},
                              {"sm_count", prop.multiProcessorCount},
                              {"l2_bytes", prop.l2CacheSize},
                              {"peaks",
                               {{"model", peaks.model},
                                {"int8_tops", peaks.int8_tops},
                                {"fp16_tflops", peaks.fp16_tflops},
                                {"hbm_gbs", peaks.hbm_gbs}}},
                              {"gemv_max_rows", cuda::kGemvMaxRows},
                              {"lt_autotune", lt_options.autotune},
                              {"complete", complete},
                              {"cut_at_deadline", cut},
                              {"rows", rows},
                              {"paths", paths}};
        const std::string tmp = out_dir + "/gemm.json.tmp";
        std::ofstream(tmp) << doc.dump(2) << "\n";
        std::filesystem::rename(tmp, out_dir + "/gemm.json");
    };
    fmt::print("\n{:<22} {:>6} {:>6} {:>6} {:>10} {:>9} {:>8} {:>9} {:>8}  {}\n", "kernel", "m", "n", "k", "time_us",
               "TOPS", "%peak", "GB/s", "%HBM", "path");
    // path: "gemv" or lt_path(); lt: the chosen algorithm's JSON (null for the GEMVs).
    auto report = [&](const std::string& kernel, int64_t m, int64_t n, int64_t k, double s, double peak_tops,
                      double bytes, const std::string& path, const nlohmann::json& lt_algo) {
        const double tops = 2.0 * double(m) * double(n) * double(k) / s / 1e12;
        const double gbs = bytes / s / 1e9;
        const double pct = peak_tops > 0 ? 100.0 * tops / peak_tops : 0.0;
        const double pct_hbm = peaks.hbm_gbs > 0 ? 100.0 * gbs / peaks.hbm_gbs : 0.0;
        fmt::print("{:<22} {:>6} {:>6} {:>6} {:>10.1f} {:>9.1f} {:>7.1f}% {:>9.0f} {:>7.1f}%  {}\n", kernel, m, n, k,
                   s * 1e6, tops, pct, gbs, pct_hbm, path);
        rows.push_back({{"kernel", kernel},
                        {"m", m},
                        {"n", n},
                        {"k", k},
                        {"time_us", s * 1e6},
                        {"tops", tops},
                        {"pct_peak", pct},
                        {"gbs", gbs},
                        {"pct_hbm", pct_hbm},
                        {"path", path},
                        {"lt_algo", lt_algo}});
        write(false);
    };
    // The headline first: 4096^3, INT8 and FP16.
    {
        const int64_t c = 4096;
        const double s8 = time_per_call(
            stream, [&] { lt.gemm_i8(acc.as<int32_t>(), c, x8.as<int8_t>(), c, w8.as<int8_t>(), c, c, c, c, stream); },
            min_s);
        report("int8 cublasLt IMMA", c, c, c, s8, peaks.int8_tops, 3.0 * double(c) * c + 4.0 * c * c,
               lt_path(lt.last_algo()), lt_json(lt.last_algo()));
        const double s16 = time_per_call(
            stream, [&] { lt.gemm_float(y16.p, c, x16.p, c, w16.p, c, c, c, c, DType::kF16, DType::kF16, stream); },
            min_s);
        report("fp16 cublasLt", c, c, c, s16, peaks.fp16_tflops, 6.0 * double(c) * c, lt_path(lt.last_algo()),
               lt_json(lt.last_algo()));
    }
    // What CudaBackend::linear runs per (n, m): W8A8 and W8A16 paths with their times.
    std::vector<std::string> summary;
    for (auto [n, kk] : shapes) {
        for (int64_t m : ms) {
            if (past_deadline()) break;
            const bool gemv = m <= cuda::kGemvMaxRows;  // CudaBackend::linear's crossover
            // Where the backend never asks IMMA (m <= 16), cuBLASLt may have no algorithm: try first.
            const bool imma = !gemv || lt.try_gemm_i8(acc.as<int32_t>(), n, x8.as<int8_t>(), k, w8.as<int8_t>(), k, m,
                                                      n, k, stream);
            double s8 = 0;
            cuda::LtAlgoInfo a8{};
            if (imma) {
                s8 = time_per_call(
                    stream,
                    [&] { lt.gemm_i8(acc.as<int32_t>(), n, x8.as<int8_t>(), k, w8.as<int8_t>(), k, m, n, k, stream); },
                    min_s);
                a8 = lt.last_algo();
                report("int8 cublasLt IMMA", m, n, k, s8, peaks.int8_tops,
                       double(n) * k + double(m) * k + 4.0 * m * n, lt_path(a8), lt_json(a8));
            } else {
                fmt::print("int8 cublasLt IMMA      {:>6} {:>6} {:>6}  no algorithm (the backend runs the GEMV)\n", m,
                           n, k);
            }
            const double s16 = time_per_call(
                stream, [&] { lt.gemm_float(y16.p, n, x16.p, k, w16.p, k, m, n, k, DType::kF16, DType::kF16, stream); },
                min_s);
            const cuda::LtAlgoInfo a16 = lt.last_algo();
            report("fp16 cublasLt", m, n, k, s16, peaks.fp16_tflops,
                   2.0 * (double(n) * k + double(m) * k + double(m) * n), lt_path(a16), lt_json(a16));
            LATTICE_CHECK(finite_f16(y16.p, size_t(m * n)), "fp16 GEMM produced inf/NaN at m={} n={}", m, n);
            double sg8 = 0, sg16 = 0;
            if (gemv) {
                sg8 = time_per_call(
                    stream,
                    [&] {
                        cuda::gemv_w8a8(y16.p, x8.as<int8_t>(), k, sx.as<float>(), w8.as<int8_t>(), k, sw.as<float>(),
                                        m, n, k, DType::kF16, DType::kF16, stream);
                    },
                    min_s);
                report("w8a8 GEMV (dp4a)", m, n, k, sg8, peaks.int8_tops, double(n) * k + 4.0 * n, "gemv", nullptr);
                sg16 = time_per_call(
                    stream,
                    [&] {
                        cuda::gemv_w8a16(y16.p, x16.p, w8.as<int8_t>(), k, sw.as<float>(), m, n, k, DType::kF16,
                                         DType::kF16, stream);
                    },
                    min_s);
                report("w8a16 GEMV", m, n, k, sg16, peaks.fp16_tflops, double(n) * k + 4.0 * n, "gemv", nullptr);
            }
            // W4A16: CudaBackend::linear's 4-bit path (GEMV for m <= 8, else the tensor-core GEMM).
            const bool gemv4 = m <= cuda::kInt4GemvMaxRows;
            const cuda::Int4Dev q = int4_dev(n);
            const double s4 = time_per_call(
                stream,
                [&] {
                    if (gemv4)
                        cuda::gemv_w4a16(y16.p, x16.p, q, m, DType::kF16, DType::kF16, stream);
                    else
                        cuda::gemm_w4a16(y16.p, x16.p, k, q, m, DType::kF16, DType::kF16, stream);
                },
                min_s);
            report(gemv4 ? "w4a16 GEMV" : "w4a16 GEMM (wmma)", m, n, k, s4, peaks.fp16_tflops,
                   double(n) * k * (0.5 + 4.0 / 32) + 2.0 * double(m) * (k + n), gemv4 ? "gemv4" : "wmma", nullptr);
            LATTICE_CHECK(finite_f16(y16.p, size_t(m * n)), "w4a16 produced inf/NaN at m={} n={}", m, n);
            // W8A16 above the crossover also dequantizes the weights (not timed here) before the fp16 GEMM.
            const std::string w8a8_path = gemv ? "gemv" : lt_path(a8),
                              w8a16_path = gemv ? "gemv" : "dequant+" + lt_path(a16);
            paths.push_back({{"n", n},
                             {"k", k},
                             {"m", m},
                             {"w8a8_path", w8a8_path},
                             {"w8a8_us", (gemv ? sg8 : s8) * 1e6},
                             {"imma_us", imma ? nlohmann::json(s8 * 1e6) : nlohmann::json()},
                             {"w8a8_lt_algo", imma ? lt_json(a8) : nlohmann::json()},
                             {"w8a16_path", w8a16_path},
                             {"w8a16_us", (gemv ? sg16 : s16) * 1e6},
                             {"fp16_lt_us", s16 * 1e6},
                             {"w4a16_path", gemv4 ? "gemv4" : "wmma"},
                             {"w4a16_us", s4 * 1e6},
                             {"fp16_lt_algo", lt_json(a16)}});
            summary.push_back(fmt::format(
                "{:>6} {:>6}  W8A8 {:<10} {:>9.1f} us{}   W8A16 {:<18} {:>9.1f} us{}   W4A16 {:<6} {:>9.1f} us", n, m,
                w8a8_path,
                (gemv ? sg8 : s8) * 1e6,
                gemv ? (imma ? fmt::format(" (IMMA {} {:.1f} us)", lt_path(a8), s8 * 1e6) : std::string(" (no IMMA)"))
                     : std::string(),
                w8a16_path, (gemv ? sg16 : s16) * 1e6,
                gemv ? fmt::format(" (fp16 {} {:.1f} us)", lt_path(a16), s16 * 1e6) : " (+ dequant)",
                gemv4 ? "gemv4" : "wmma", s4 * 1e6));
        }
    }
    fmt::print("\nCudaBackend::linear paths (GEMV for m <= {}; cuBLASLt autotune {}):\n{:>6} {:>6}\n",
               cuda::kGemvMaxRows, lt_options.autotune ? "on" : "off", "n", "m");
    for (const std::string& line : summary) fmt::print("{}\n", line);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    if (cut) fmt::print("\nstopped at the deadline ({} s): {} rows measured\n", deadline_s, rows.size());
    write(!cut);
    fmt::print("\nwrote {}/gemm.json\n", out_dir);
    cudaStreamDestroy(stream);
    return 0;
} catch (const std::exception& e) {
    fmt::print(stderr, "bench_gpu_gemm: {}\n", e.what());
    return 1;
}
