// GPU decode-step benchmark on the real Model (built through runtime/engine/build.h, random
// weights): the Llama-2-70B shape (hidden 8192, 64/8 heads x 128, FFN 28672, vocab 32000) in W8A8
// at TP = 1, batch 1 / 8 / 32, one token per sequence at context `--ctx` (default 512). The
// embedding and every layer run as one captured CUDA graph per batch (replayed), the final norm and
// LM head eagerly with the logits download that the product path does today.
// `--layers N` (default 80) loads fewer layers of the same shape: the floor ratio is per byte, so a
// shorter stack gives the same ratio with a shorter load (host-fabricated random weights).
// The floor is bytes streamed per step (int8 weights + scales + norms + head + KV of every layer)
// / HBM bandwidth, the bandwidth being that of a device-to-device copy measured at the start of
// this run (gpu_peaks.h measure_copy_gbs; H200 ~4300 GB/s), the datasheet's figure reported beside
// it; the goal is >= 85% of the measured floor.
// Output: a table on stdout and decode.json in --out DIR (default ./gpu-results), written after
// every batch size so a cut-off run still leaves its rows.
// Usage: bench_gpu_decode [--out DIR] [--device N] [--ctx N] [--layers N] [--quick]
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "base/cuda_check.h"
#include "benchmarks/gpu/gpu_peaks.h"
#include "runtime/backend/cuda/cuda_backend.h"
#include "runtime/engine/build.h"
#include "runtime/weights/random_source.h"

using namespace lattice;

int main(int argc, char** argv) try {
    std::string out_dir = "gpu-results";
    int device = 0;
    int64_t ctx = 512, layers = 80;
    bool quick = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--out" && i + 1 < argc)
            out_dir = argv[++i];
        else if (a == "--device" && i + 1 < argc)
            device = std::stoi(argv[++i]);
        else if (a == "--ctx" && i + 1 < argc)
            ctx = std::stoll(argv[++i]);
        else if (a == "--layers" && i + 1 < argc)
            layers = std::stoll(argv[++i]);
        else if (a == "--quick")
            quick = true;
        else
            LATTICE_FAIL("bench_gpu_decode: unknown argument '{}'", a);
    }
    LATTICE_CHECK(layers >= 1 && layers <= 80 && ctx >= 1 && ctx < 100000, "bench_gpu_decode: bad options");
    if (cuda_device_count() == 0) {
        fmt::print("bench_gpu_decode: SKIP: no CUDA device\n");
        return 77;
    }
    const bench::GpuPeaks peaks = bench::gpu_peaks(device);
    const double copy_gbs = bench::measure_copy_gbs(device);
    // The floor's bandwidth: the copy measured now; the datasheet only if the copy could not run.
    const double floor_gbs = copy_gbs > 0 ? copy_gbs : peaks.hbm_gbs;
    ModelConfig cfg = preset_config("llama-2-70b");
    cfg.n_layers = layers;
    const int64_t kMaxBatch = 32;
    BuildOptions o;
    o.model.quant = QuantMode::kW8A8;
    o.model.quant_head = true;
    o.model.max_seq = ctx + 64;
    o.engine.max_seqs = kMaxBatch;
    o.model.max_batch_tokens = kMaxBatch;
    o.backend.kind = BackendKind::kCuda;
    o.backend.cuda_act = DType::kF16;
    o.devices = {device};
    auto src = make_random_source(cfg, 1234, DType::kBF16);
    const auto t_load = std::chrono::steady_clock::now();
    Built b = build(o, *src);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
    CudaBackend& be = static_cast<CudaBackend&>(*b.backend);  // the graph API is CUDA-only
    Model& model = *b.model;
    fmt::print("{}: llama-2-70b shape ({} layers), w8a8, TP=1, ctx {}, loaded in {:.1f} s, device copy {:.0f} GB/s "
               "(datasheet HBM {:.0f} GB/s [{}])\n",
               be.name(), layers, ctx, load_s, copy_gbs, peaks.hbm_gbs, peaks.model);

    nlohmann::json rows = nlohmann::json::array();
    auto write = [&] {
        std::filesystem::create_directories(out_dir);
        nlohmann::json doc = {{"benchmark", "gpu_decode_model"},
                              {"backend", be.name()},
                              {"shape", "llama-2-70b"},
                              {"layers", layers},
                              {"quant", "w8a8"},
                              {"tp", 1},
                              {"ctx", ctx},
                              {"load_seconds", load_s},
                              {"hbm_copy_gbs", copy_gbs},
                              {"hbm_datasheet_gbs", peaks.hbm_gbs},
                              {"floor_gbs", floor_gbs},
                              {"floor_from", copy_gbs > 0 ? "device-to-device copy measured in this run" : "datasheet"},
                              {"gpu_model", peaks.model},
                              {"rows", rows}};
        std::ofstream(out_dir + "/decode.json") << doc.dump(2) << "\n";
    };
    fmt::print("\n{:>6} {:>12} {:>12} {:>12} {:>12} {:>10}\n", "batch", "layers_ms", "step_ms", "tokens/s", "floor_ms",
               "%floor");
    for (int64_t batch : {1, 8, 32}) {
        const size_t nb = static_cast<size_t>(batch);
        std::vector<int32_t> ids(nb, 1), pos(nb, int32_t(ctx)), seqs(nb);
        std::iota(seqs.begin(), seqs.end(), 0);
        // Sequence i owns blocks [i * W, (i + 1) * W) of the paged cache.
        const int64_t W = model.attention_shape().table_width;
        LATTICE_CHECK(model.kv_blocks() >= batch * W, "bench_gpu_decode: KV cache of {} blocks < {}", model.kv_blocks(),
                      batch * W);
        std::vector<int32_t> tables(nb * size_t(W));
        std::iota(tables.begin(), tables.end(), 0);
        TokenBatch tb{ids.data(), pos.data(), seqs.data(), batch, tables.data(), batch, W};
        std::vector<int64_t> all(nb);
        std::iota(all.begin(), all.end(), 0);
        std::vector<float> logits(nb * size_t(cfg.vocab));
        View hidden = model.hidden_scratch(batch);
        model.forward(tb, all, logits.data());  // eager warm-up: sizes scratch, builds cuBLASLt plans
        CudaGraph graph;
        graph.capture(be, tb, [&] {
            model.embed(tb, hidden);
            model.run_layers(tb, hidden);
        });
        graph.replay(be, tb);
        be.sync();
        const int iters = quick ? 3 : 10;
        cudaEvent_t e0, e1;
        CUDA_CHECK(cudaEventCreate(&e0));
        CUDA_CHECK(cudaEventCreate(&e1));
        CUDA_CHECK(cudaEventRecord(e0, be.stream()));
        for (int i = 0; i < iters; ++i) graph.replay(be, tb);
        CUDA_CHECK(cudaEventRecord(e1, be.stream()));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float layers_ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&layers_ms, e0, e1));
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        layers_ms /= float(iters);
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) {
            graph.replay(be, tb);
            model.head(hidden, all, logits.data());  // synchronizes (download)
        }
        const double step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
        const double kv_bytes = double(layers) * batch * double(ctx + 1) * cfg.kv_dim() * 2 * 2;
        const double bytes = double(model.streamed_weight_bytes()) + kv_bytes;
        const double floor_ms = floor_gbs > 0 ? bytes / (floor_gbs * 1e9) * 1e3 : 0;
        const double pct = floor_ms > 0 ? 100.0 * floor_ms / step_ms : 0;
        const double sheet_ms = peaks.hbm_gbs > 0 ? bytes / (peaks.hbm_gbs * 1e9) * 1e3 : 0;
        fmt::print("{:>6} {:>12.2f} {:>12.2f} {:>12.1f} {:>12.2f} {:>9.1f}%\n", batch, layers_ms, step_ms,
                   batch * 1e3 / step_ms, floor_ms, pct);
        rows.push_back({{"batch", batch},
                        {"layers_ms", layers_ms},
                        {"ms_per_step", step_ms},
                        {"tokens_per_s", batch * 1e3 / step_ms},
                        {"bytes_per_step", bytes},
                        {"floor_ms", floor_ms},
                        {"pct_of_floor", pct},
                        {"pct_of_datasheet_floor", sheet_ms > 0 ? 100.0 * sheet_ms / step_ms : 0}});
        write();
    }
    fmt::print("\nwrote {}/decode.json\n", out_dir);
    return 0;
} catch (const std::exception& e) {
    fmt::print(stderr, "bench_gpu_decode: {}\n", e.what());
    return 1;
}
