// GPU decode benchmark on the product path: the real Engine over the real Model (built through
// runtime/builder/build.h, random weights), driven through its step API (Engine::add / step) exactly
// as `lattice serve` drives it. Llama-2-70B shape (hidden 8192, 64/8 heads x 128, FFN 28672, vocab
// 32000) in W8A8 at TP = 1, batch 1 / 8 / 32: each batch's sequences are prefilled to `--ctx`
// positions (default 512), then the engine decodes; the timed steps are decode steps after the
// engine's own CUDA graph of that batch bucket was captured (the first decode step of a bucket runs
// eagerly, the second captures), with token selection on the device: every timed step is one graph
// replay + the selection kernel + the ids' download + the engine's host bookkeeping. The JSON
// records the engine's graph counters, so a run whose steps did not replay a graph is visible.
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
#include <map>
#include <vector>

#include "base/cuda_check.h"
#include "benchmarks/gpu/gpu_peaks.h"
#include "runtime/builder/build.h"
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
    BuildOptions opt;
    opt.model.quant = QuantMode::kW8A8;
    opt.model.quant_head = true;
    const int warm = 3;                      // decode steps before timing: eager warm-up, capture, one replay
    const int iters = quick ? 5 : 20;        // timed decode steps
    const int64_t max_new = kMaxBatch + warm + iters + 8;  // never finishes inside the timed steps
    opt.model.max_seq = ctx + max_new + 1;
    opt.engine.max_seqs = kMaxBatch;
    opt.model.max_batch_tokens = 512;  // prefill chunks; decode graphs bucket up to max_seqs
    opt.backend.kind = BackendKind::kCuda;
    opt.backend.cuda_act = DType::kF16;
    opt.devices = {device};
    auto src = make_random_source(cfg, 1234, DType::kBF16);
    const auto t_load = std::chrono::steady_clock::now();
    RankRuntime rt = build(opt, *src);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
    Backend& backend = *rt.backend;
    Model& model = *rt.model;
    fmt::print("{}: llama-2-70b shape ({} layers), w8a8, TP=1, ctx {}, loaded in {:.1f} s, device copy {:.0f} GB/s "
               "(datasheet HBM {:.0f} GB/s [{}])\n",
               backend.name(), layers, ctx, load_s, copy_gbs, peaks.hbm_gbs, peaks.model);

    Engine& engine = *rt.engine;
    nlohmann::json rows = nlohmann::json::array();
    auto write = [&] {
        std::filesystem::create_directories(out_dir);
        nlohmann::json doc = {{"benchmark", "gpu_decode_engine"},
                              {"backend", backend.name()},
                              {"shape", "llama-2-70b"},
                              {"layers", layers},
                              {"quant", "w8a8"},
                              {"tp", 1},
                              {"ctx", ctx},
                              {"path", "Engine::step: engine-captured CUDA graph per batch bucket, device selection"},
                              {"fused_quant", model.fused_quant()},
                              {"load_seconds", load_s},
                              {"hbm_copy_gbs", copy_gbs},
                              {"hbm_datasheet_gbs", peaks.hbm_gbs},
                              {"floor_gbs", floor_gbs},
                              {"floor_from", copy_gbs > 0 ? "device-to-device copy measured in this run" : "datasheet"},
                              {"gpu_model", peaks.model},
                              {"rows", rows}};
        std::ofstream(out_dir + "/decode.json") << doc.dump(2) << "\n";
    };
    fmt::print("\n{:>6} {:>10} {:>12} {:>12} {:>12} {:>10} {:>9}\n", "batch", "prefill_s", "step_ms", "tokens/s",
               "floor_ms", "%floor", "replays");
    for (int64_t batch : {1, 8, 32}) {
        // Prompts of ctx tokens (ids spread over the vocabulary), decoding past the timed steps.
        std::vector<int64_t> ids;
        for (int64_t s = 0; s < batch; ++s) {
            EngineRequest r;
            for (int64_t t = 0; t < ctx; ++t) r.prompt.push_back(int32_t((s * 7919 + t * 104729) % (cfg.vocab - 2) + 2));
            r.max_new_tokens = max_new;
            r.ignore_eos = true;
            ids.push_back(engine.add(std::move(r)));
        }
        // Prefill: until every sequence has its first token.
        const auto t_pre = std::chrono::steady_clock::now();
        std::map<int64_t, int64_t> got;
        auto count_tokens = [&](const std::vector<TokenEvent>& evs) {
            for (const TokenEvent& e : evs)
                if (e.token >= 0) ++got[e.id];
        };
        while (int64_t(got.size()) < batch) count_tokens(engine.step());
        const double prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_pre).count();
        for (int i = 0; i < warm; ++i) count_tokens(engine.step());
        const EngineCounters c0 = engine.counters();
        int64_t timed_tokens = 0;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) {
            const std::vector<TokenEvent> evs = engine.step();
            for (const TokenEvent& e : evs) timed_tokens += e.token >= 0;
            count_tokens(evs);
        }
        const double step_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
        const EngineCounters c1 = engine.counters();
        // Every timed step decoded the whole batch (nothing finished, nothing was preempted).
        LATTICE_CHECK(timed_tokens == batch * iters, "bench_gpu_decode: batch {}: {} tokens in {} timed steps, wanted {}",
                      batch, timed_tokens, iters, batch * iters);
        for (int64_t id : ids) engine.cancel(id);
        while (engine.busy()) engine.step();
        const int64_t replays = c1.graph_replays - c0.graph_replays, steps = c1.steps - c0.steps;
        // Each timed step decodes every sequence once, at ~ctx + warm positions.
        const double kv_bytes = double(layers) * batch * double(ctx + warm + iters / 2) * cfg.kv_dim() * 2 * 2;
        const double bytes = double(model.streamed_weight_bytes()) + kv_bytes;
        const double floor_ms = floor_gbs > 0 ? bytes / (floor_gbs * 1e9) * 1e3 : 0;
        const double pct = floor_ms > 0 ? 100.0 * floor_ms / step_ms : 0;
        const double sheet_ms = peaks.hbm_gbs > 0 ? bytes / (peaks.hbm_gbs * 1e9) * 1e3 : 0;
        fmt::print("{:>6} {:>10.2f} {:>12.3f} {:>12.1f} {:>12.3f} {:>9.1f}% {:>5}/{:<3}\n", batch, prefill_s, step_ms,
                   batch * 1e3 / step_ms, floor_ms, pct, replays, steps);
        rows.push_back({{"batch", batch},
                        {"prefill_seconds", prefill_s},
                        {"ms_per_step", step_ms},
                        {"tokens_per_s", batch * 1e3 / step_ms},
                        {"timed_steps", steps},
                        {"graph_replays", replays},
                        {"bytes_per_step", bytes},
                        {"floor_ms", floor_ms},
                        {"pct_of_floor", pct},
                        {"pct_of_datasheet_floor", sheet_ms > 0 ? 100.0 * sheet_ms / step_ms : 0}});
        write();
        if (replays < steps)
            fmt::print("bench_gpu_decode: WARNING: {} of {} timed steps did not replay a graph\n", steps - replays,
                       steps);
    }
    fmt::print("\nwrote {}/decode.json\n", out_dir);
    return 0;
} catch (const std::exception& e) {
    fmt::print(stderr, "bench_gpu_decode: {}\n", e.what());
    return 1;
}
