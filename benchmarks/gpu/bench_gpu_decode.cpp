// GPU decode-step benchmark on the CudaBackend ops, independent of the engine: the Llama-2-70B
// shape (hidden 8192, 64/8 heads x 128, FFN 28672, 80 layers, vocab 32000) with random W8A8
// weights at TP = 1, batch 1 / 8 / 32, one token per sequence at context `--ctx` (default 512),
// the whole step (80 layers + final norm + LM head) captured in one CUDA graph and replayed.
// Weights: `--physical` distinct layer weight sets (default 4, ~0.86 GB each) cycled over the 80
// layers. Each layer's weights (0.86 GB) are ~17x the largest L2 (50 MB), so reuse cannot be
// served from cache and the step reads as many bytes as a real 70B model; KV caches are distinct
// per layer. The floor is bytes read per step (int8 weights + scales + KV of every layer) / HBM
// bandwidth (gpu_peaks.h); the goal is >= 85% of it.
// Output: a table on stdout and decode.json in --out DIR (default ./gpu-results).
// Usage: bench_gpu_decode [--out DIR] [--device N] [--ctx N] [--physical N] [--quick]
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "benchmarks/gpu/gpu_peaks.h"
#include "kernels/cuda/cuda_check.h"
#include "runtime/cuda/cuda_backend.h"

using namespace lattice;

namespace {

constexpr int64_t kHidden = 8192, kFfn = 28672, kHeads = 64, kKvHeads = 8, kHeadDim = 128, kLayers = 80;
constexpr int64_t kVocab = 32000;

struct LayerW {
    Linear qkv, o, gu, down;
    Buffer n1, n2;
};

}  // namespace

int main(int argc, char** argv) try {
    std::string out_dir = "gpu-results";
    int device = 0, physical = 4;
    int64_t ctx = 512;
    bool quick = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--out" && i + 1 < argc)
            out_dir = argv[++i];
        else if (a == "--device" && i + 1 < argc)
            device = std::stoi(argv[++i]);
        else if (a == "--ctx" && i + 1 < argc)
            ctx = std::stoll(argv[++i]);
        else if (a == "--physical" && i + 1 < argc)
            physical = std::stoi(argv[++i]);
        else if (a == "--quick")
            quick = true;
        else
            LATTICE_FAIL("bench_gpu_decode: unknown argument '{}'", a);
    }
    LATTICE_CHECK(physical >= 1 && physical <= kLayers && ctx >= 1 && ctx < 100000, "bench_gpu_decode: bad options");
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        fmt::print("bench_gpu_decode: SKIPPED: no CUDA device\n");
        return 0;
    }
    const bench::GpuPeaks peaks = bench::gpu_peaks(device);
    CudaBackend be(device, DType::kF16);
    fmt::print("{}: llama-2-70b shape, w8a8, TP=1, ctx {}, {} physical layer weight sets, HBM {:.0f} GB/s [{}]\n",
               be.name(), ctx, physical, peaks.hbm_gbs, peaks.model);

    std::vector<LayerW> layers(static_cast<size_t>(physical));
    std::vector<float> ones(static_cast<size_t>(kHidden), 1.0f);
    const View ones_v = View::contiguous(ones.data(), DType::kF32, {kHidden});
    for (int l = 0; l < physical; ++l) {
        const uint64_t s = uint64_t(l) * 16 + 1;
        layers[size_t(l)].qkv = be.make_random_linear((kHeads + 2 * kKvHeads) * kHeadDim, kHidden, QuantMode::kW8A8, s);
        layers[size_t(l)].o = be.make_random_linear(kHidden, kHeads * kHeadDim, QuantMode::kW8A8, s + 1);
        layers[size_t(l)].gu = be.make_random_linear(2 * kFfn, kHidden, QuantMode::kW8A8, s + 2);
        layers[size_t(l)].down = be.make_random_linear(kHidden, kFfn, QuantMode::kW8A8, s + 3);
        layers[size_t(l)].n1 = be.make_f32(ones_v);
        layers[size_t(l)].n2 = be.make_f32(ones_v);
    }
    Linear head = be.make_random_linear(kVocab, kHidden, QuantMode::kW8A8, 999);
    Buffer final_norm = be.make_f32(ones_v);
    std::vector<float> inv(static_cast<size_t>(kHeadDim / 2));
    for (int64_t i = 0; i < kHeadDim / 2; ++i) inv[size_t(i)] = std::pow(10000.0f, -2.0f * float(i) / float(kHeadDim));
    Buffer inv_freq = be.make_f32(View::contiguous(inv.data(), DType::kF32, {kHeadDim / 2}));
    const double layer_bytes = double(layers[0].qkv.weight_bytes() + layers[0].o.weight_bytes() +
                                      layers[0].gu.weight_bytes() + layers[0].down.weight_bytes());

    nlohmann::json rows = nlohmann::json::array();
    fmt::print("\n{:>6} {:>12} {:>12} {:>12} {:>10}\n", "batch", "ms/step", "tokens/s", "floor_ms", "%floor");
    for (int64_t batch : {1, 8, 32}) {
        const int64_t max_seq = ctx + 64;
        const AttentionShape shape{kHeads, kKvHeads, kHeadDim, max_seq, 1.0f / std::sqrt(float(kHeadDim))};
        std::vector<Buffer> kc, vc;
        for (int64_t l = 0; l < kLayers; ++l) {
            kc.push_back(be.alloc(DType::kF16, {batch, max_seq, kKvHeads, kHeadDim}));
            vc.push_back(be.alloc(DType::kF16, {batch, max_seq, kKvHeads, kHeadDim}));
        }
        Buffer x = be.alloc(DType::kF16, {batch, kHidden}), y = be.alloc(DType::kF16, {batch, kHidden});
        Buffer qkv = be.alloc(DType::kF16, {batch, (kHeads + 2 * kKvHeads) * kHeadDim});
        Buffer att = be.alloc(DType::kF16, {batch, kHeads * kHeadDim}), o = be.alloc(DType::kF16, {batch, kHidden});
        Buffer gu = be.alloc(DType::kF16, {batch, 2 * kFfn}), act = be.alloc(DType::kF16, {batch, kFfn});
        Buffer logits = be.alloc(DType::kF16, {batch, kVocab});
        cuda::fill_random(x.data(), DType::kF16, batch * kHidden, 7, 1.0f, be.stream());
        const size_t nb = static_cast<size_t>(batch);
        std::vector<int32_t> ids(nb, 1), pos(nb, int32_t(ctx)), slots(nb);
        std::iota(slots.begin(), slots.end(), 0);
        TokenBatch tb{ids.data(), pos.data(), slots.data(), batch};
        auto step = [&] {
            for (int64_t l = 0; l < kLayers; ++l) {
                const LayerW& w = layers[size_t(l % physical)];
                be.rmsnorm(y.view(), x.view(), w.n1.view(), 1e-5f);
                be.linear(qkv.view(), y.view(), w.qkv);
                be.rope(qkv.view(), tb, shape, inv_freq.view());
                be.attention(att.view(), qkv.view(), kc[size_t(l)].view(), vc[size_t(l)].view(), tb, shape);
                be.linear(o.view(), att.view(), w.o);
                be.add_rmsnorm(x.view(), o.view(), y.view(), w.n2.view(), 1e-5f);
                be.linear(gu.view(), y.view(), w.gu);
                be.silu_mul(act.view(), gu.view());
                be.linear(o.view(), act.view(), w.down);
                be.add(x.view(), x.view(), o.view());
            }
            be.rmsnorm(y.view(), x.view(), final_norm.view(), 1e-5f);
            be.linear(logits.view(), y.view(), head);
        };
        step();  // eager warm-up: sizes scratch, builds cuBLASLt plans
        be.sync();
        CudaGraph graph;
        graph.capture(be, tb, step);
        graph.replay(be, tb);
        be.sync();
        cudaEvent_t a, b;
        CUDA_CHECK(cudaEventCreate(&a));
        CUDA_CHECK(cudaEventCreate(&b));
        const int iters = quick ? 3 : 10;
        CUDA_CHECK(cudaEventRecord(a, be.stream()));
        for (int i = 0; i < iters; ++i) graph.replay(be, tb);
        CUDA_CHECK(cudaEventRecord(b, be.stream()));
        CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        cudaEventDestroy(a);
        cudaEventDestroy(b);
        const double step_ms = ms / iters;
        std::vector<int32_t> next(static_cast<size_t>(batch));
        be.argmax(logits.view(), next.data());  // the step produced real logits (and no device error)
        const double kv_bytes = double(kLayers) * batch * double(ctx + 1) * kKvHeads * kHeadDim * 2 * 2;
        const double bytes = layer_bytes * kLayers + double(head.weight_bytes()) + kv_bytes;
        const double floor_ms = peaks.hbm_gbs > 0 ? bytes / (peaks.hbm_gbs * 1e9) * 1e3 : 0;
        const double pct = floor_ms > 0 ? 100.0 * floor_ms / step_ms : 0;
        fmt::print("{:>6} {:>12.2f} {:>12.1f} {:>12.2f} {:>9.1f}%\n", batch, step_ms, batch * 1e3 / step_ms, floor_ms,
                   pct);
        rows.push_back({{"batch", batch},
                        {"ms_per_step", step_ms},
                        {"tokens_per_s", batch * 1e3 / step_ms},
                        {"bytes_per_step", bytes},
                        {"floor_ms", floor_ms},
                        {"pct_of_floor", pct}});
    }
    std::filesystem::create_directories(out_dir);
    nlohmann::json doc = {{"benchmark", "gpu_decode_layers"},
                          {"backend", be.name()},
                          {"shape", "llama-2-70b"},
                          {"quant", "w8a8"},
                          {"tp", 1},
                          {"ctx", ctx},
                          {"physical_layers", physical},
                          {"hbm_gbs", peaks.hbm_gbs},
                          {"gpu_model", peaks.model},
                          {"rows", rows}};
    std::ofstream(out_dir + "/decode.json") << doc.dump(2) << "\n";
    fmt::print("\nwrote {}/decode.json\n", out_dir);
    return 0;
} catch (const std::exception& e) {
    fmt::print(stderr, "bench_gpu_decode: {}\n", e.what());
    return 1;
}
