// GPU decode-attention benchmark: cuda::attention_decode (flash-decoding over the paged KV cache, then
// the split merge) at 4k and 32k positions of context, for the Llama-2-70B head layout at TP = 1 (64 q
// / 8 kv heads x 128) and TinyLlama's (32 / 4 x 64), batch 1, 8 and 32, fp16.
// Ceiling: the K and V rows every token reads (batch x ctx x n_kv x head_dim x 2 bytes x 2) over the
// device-to-device copy bandwidth measured in the same run (gpu_peaks.h measure_copy_gbs); the
// split workspace, q and out are small beside them at these lengths and are left out of the floor.
// Method: the cache's blocks are a random permutation (paged, not contiguous), filled with random
// values on the device; 20 calls are captured in one CUDA graph (so launch gaps between calls are
// graph gaps, as in the decode step's graph) and the graph is replayed, timed by events, for >= 0.1 s
// after a warm-up; the time per call is reported. Every row is written to attention.json in --out as
// soon as it is measured, so a cut-off run keeps what it measured.
// Usage: bench_gpu_attention [--out DIR] [--device N] [--quick]
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <vector>

#include "base/cuda_check.h"
#include "base/error.h"
#include "benchmarks/gpu/gpu_peaks.h"
#include "kernels/cuda/kernels.h"

using namespace lattice;

namespace {

struct DevMem {
    void* p = nullptr;
    explicit DevMem(size_t bytes) { CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 1))); }
    ~DevMem() { cudaFree(p); }
    DevMem(const DevMem&) = delete;
    DevMem& operator=(const DevMem&) = delete;
    template <typename T>
    T* as() const {
        return static_cast<T*>(p);
    }
};

struct Layout {
    const char* name;
    int64_t nh, nkv, hd;
};

}  // namespace

int main(int argc, char** argv) try {
    std::string out_dir = "gpu-results";
    int device = 0;
    bool quick = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--out" && i + 1 < argc)
            out_dir = argv[++i];
        else if (a == "--device" && i + 1 < argc)
            device = std::stoi(argv[++i]);
        else if (a == "--quick")
            quick = true;
        else
            LATTICE_FAIL("bench_gpu_attention: unknown argument '{}' (usage: [--out DIR] [--device N] [--quick])", a);
    }
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        fmt::print("bench_gpu_attention: SKIP: no CUDA device\n");
        return 77;
    }
    CUDA_CHECK(cudaSetDevice(device));
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    const double copy_gbs = bench::measure_copy_gbs(device);
    fmt::print("GPU {}: {} ({} SMs, L2 {} MiB), device copy {:.0f} GB/s\n", device, prop.name, prop.multiProcessorCount,
               prop.l2CacheSize >> 20, copy_gbs);
    cudaStream_t stream = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const Layout layouts[] = {{"llama-2-70b", 64, 8, 128}, {"tinyllama-1.1b", 32, 4, 64}};
    const int64_t ctxs[] = {4096, 32768};
    const int64_t batches[] = {1, 8, 32};
    const int64_t bs = 16;
    const double min_s = quick ? 0.03 : 0.1;
    const int calls_per_graph = 20;
    nlohmann::json rows = nlohmann::json::array();
    auto write = [&] {
        std::filesystem::create_directories(out_dir);
        nlohmann::json doc = {{"benchmark", "gpu_attention_decode"},
                              {"gpu", prop.name},
                              {"sm_count", prop.multiProcessorCount},
                              {"l2_bytes", prop.l2CacheSize},
                              {"hbm_copy_gbs", copy_gbs},
                              {"dtype", "f16"},
                              {"block_size", bs},
                              {"floor", "K and V bytes read / the device copy bandwidth"},
                              {"rows", rows}};
        std::ofstream(out_dir + "/attention.json") << doc.dump(2) << "\n";
    };
    fmt::print("\n{:<15} {:>6} {:>5} {:>7} {:>10} {:>10} {:>9} {:>7}\n", "heads", "ctx", "batch", "splits", "us/call",
               "KV_MB", "GB/s", "%copy");
    std::mt19937_64 rng(7);
    for (const Layout& L : layouts) {
        for (int64_t ctx : ctxs) {
            for (int64_t batch : batches) {
                const int64_t width = ctx / bs + 1, n_blocks = batch * width;
                cuda::AttnDims d;
                d.n_heads = L.nh;
                d.n_kv_heads = L.nkv;
                d.head_dim = L.hd;
                d.max_seq = width * bs;
                d.block_size = bs;
                d.num_blocks = n_blocks;
                d.table_width = width;
                d.scale = 1.0f / std::sqrt(float(L.hd));
                const int64_t cache_elems = n_blocks * bs * L.nkv * L.hd, row = (L.nh + 2 * L.nkv) * L.hd;
                DevMem kc(size_t(cache_elems) * 2), vc(size_t(cache_elems) * 2), qkv(size_t(batch * row) * 2);
                DevMem out(size_t(batch * L.nh * L.hd) * 2);
                DevMem ws(size_t(cuda::decode_workspace_floats(batch, d)) * 4);
                cuda::fill_random(kc.p, DType::kF16, cache_elems, 11, 1.0f, stream);
                cuda::fill_random(vc.p, DType::kF16, cache_elems, 12, 1.0f, stream);
                cuda::fill_random(qkv.p, DType::kF16, batch * row, 13, 1.0f, stream);
                std::vector<int32_t> tables(static_cast<size_t>(n_blocks));
                std::iota(tables.begin(), tables.end(), 0);
                std::shuffle(tables.begin(), tables.end(), rng);
                std::vector<int32_t> pos(static_cast<size_t>(batch), int32_t(ctx - 1)),
                    seqs(static_cast<size_t>(batch));
                std::iota(seqs.begin(), seqs.end(), 0);
                DevMem dtables(tables.size() * 4), dpos(pos.size() * 4), dseqs(seqs.size() * 4);
                CUDA_CHECK(
                    cudaMemcpyAsync(dtables.p, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice, stream));
                CUDA_CHECK(cudaMemcpyAsync(dpos.p, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice, stream));
                CUDA_CHECK(cudaMemcpyAsync(dseqs.p, seqs.data(), seqs.size() * 4, cudaMemcpyHostToDevice, stream));
                const cuda::KvTables kv{dtables.as<int32_t>(), batch};
                auto call = [&] {
                    cuda::attention_decode(out.p, qkv.p, kc.p, vc.p, dpos.as<int32_t>(), dseqs.as<int32_t>(), kv, batch,
                                           d, ws.as<float>(), DType::kF16, stream);
                };
                call();  // warm-up (and the kernels' attribute setting) outside the capture
                CUDA_CHECK(cudaStreamSynchronize(stream));
                cudaGraph_t graph = nullptr;
                cudaGraphExec_t exec = nullptr;
                CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
                for (int i = 0; i < calls_per_graph; ++i) call();
                CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
                CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
                CUDA_CHECK(cudaGraphLaunch(exec, stream));
                cudaEvent_t e0, e1;
                CUDA_CHECK(cudaEventCreate(&e0));
                CUDA_CHECK(cudaEventCreate(&e1));
                int reps = 1;
                double per_call = 0;
                for (;;) {
                    CUDA_CHECK(cudaEventRecord(e0, stream));
                    for (int r = 0; r < reps; ++r) CUDA_CHECK(cudaGraphLaunch(exec, stream));
                    CUDA_CHECK(cudaEventRecord(e1, stream));
                    CUDA_CHECK(cudaEventSynchronize(e1));
                    float ms = 0;
                    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
                    per_call = ms * 1e-3 / (reps * calls_per_graph);
                    if (ms * 1e-3 >= min_s || reps >= 4096) break;
                    reps *= 2;
                }
                cudaEventDestroy(e0);
                cudaEventDestroy(e1);
                cudaGraphExecDestroy(exec);
                cudaGraphDestroy(graph);
                const double kv_bytes = double(batch) * double(ctx) * double(L.nkv * L.hd) * 2.0 * 2.0;
                const double gbs = kv_bytes / per_call / 1e9;
                const double pct = copy_gbs > 0 ? 100.0 * gbs / copy_gbs : 0;
                const int splits = cuda::decode_splits(batch, d);
                fmt::print("{:<15} {:>6} {:>5} {:>7} {:>10.1f} {:>10.1f} {:>9.0f} {:>6.1f}%\n", L.name, ctx, batch,
                           splits, per_call * 1e6, kv_bytes / 1e6, gbs, pct);
                rows.push_back({{"heads", L.name},
                                {"n_heads", L.nh},
                                {"n_kv_heads", L.nkv},
                                {"head_dim", L.hd},
                                {"ctx", ctx},
                                {"batch", batch},
                                {"splits", splits},
                                {"us_per_call", per_call * 1e6},
                                {"kv_bytes", kv_bytes},
                                {"gbs", gbs},
                                {"pct_copy", pct}});
                write();
            }
        }
    }
    cudaStreamDestroy(stream);
    fmt::print("\nwrote {}/attention.json\n", out_dir);
    return 0;
} catch (const std::exception& e) {
    fmt::print(stderr, "bench_gpu_attention: {}\n", e.what());
    return 1;
}
