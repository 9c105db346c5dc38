// GPU decode benchmark: how close a decode step comes to the HBM floor (weight and KV bytes streamed
// per step / bandwidth), measured three ways so that fixed per-step costs cannot hide in the ratio.
// Sections, in order (each written to decode.json as soon as it is measured):
//   1. TinyLlama-1.1B shape (22 layers; the goal: >= 85% of the floor at batch 1 by the slope),
//   2. Llama-2-70B shape at TP = 1 with --layers70b layers (default 8; 0: skip), random W8A8 weights.
// Per section:
//   engine  the real Engine through its step API (add / step, as `lattice serve` drives it), batch 1,
//           8 and 32 prefilled to --ctx positions: each timed step is a graph replay + device token
//           selection + the ids' download + the engine's host bookkeeping (the product number);
//   graph   the same model's decode step (embed, layers, head) captured once per batch and relaunched
//           back to back, timed by CUDA events: the GPU's time alone, no host work between steps;
//   slope   the graph time at batch 1 and 32 of a second build with fewer layers (TinyLlama 6, 70B 2):
//           (T_long - T_short) / (layers_long - layers_short) is a layer's time with every fixed cost
//           (embedding, final norm, LM head, launch of the graph) cancelled; its bytes the same way;
//   kernels one eager decode step at batch 1 with CudaBackend's per-op event timing: each op's time
//           (linear layers named by mode and shape), summed per name, as a share of the step (the
//           events add about a microsecond per op, so the sum exceeds the graph's time).
// The floor's bandwidth is a device-to-device copy measured at the start (gpu_peaks.h; H200 ~4300
// GB/s), the datasheet's beside it. Host-fabricated random weights (multithreaded, quantized on all
// cores) keep the load to seconds. --deadline S: a section part that would start after S seconds is
// skipped and said so (check.sh passes its step deadline).
// Usage: bench_gpu_decode [--out DIR] [--device N] [--ctx N] [--layers70b N] [--deadline S] [--quick]
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "base/cuda_check.h"
#include "benchmarks/gpu/gpu_peaks.h"
#include "runtime/backend/cuda/cuda_backend.h"
#include "runtime/builder/build.h"
#include "runtime/weights/random_source.h"

using namespace lattice;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Bench {
    std::string out_dir = "gpu-results";
    int device = 0;
    int64_t ctx = 512;
    bool quick = false;
    double deadline_s = 1e9;
    Clock::time_point t0 = Clock::now();
    double floor_gbs = 0;
    nlohmann::json doc;
    bool time_left(double need_s) const { return since(t0) + need_s < deadline_s; }
    void write() const {
        std::filesystem::create_directories(out_dir);
        const std::string tmp = out_dir + "/decode.json.tmp";
        std::ofstream(tmp) << doc.dump(2) << "\n";
        std::filesystem::rename(tmp, out_dir + "/decode.json");
    }
};

constexpr int64_t kMaxBatch = 32;
const int64_t kBatches[] = {1, 8, 32};

RankRuntime build_shape(const Bench& b, const std::string& shape, int64_t layers) {
    ModelConfig cfg = preset_config(shape);
    cfg.n_layers = layers;
    BuildOptions opt;
    opt.model.quant = QuantMode::kW8A8;
    opt.model.quant_head = true;
    opt.model.max_seq = b.ctx + 96;
    opt.model.max_batch_tokens = 512;  // prefill chunks; decode graphs bucket up to max_seqs
    opt.engine.max_seqs = kMaxBatch;
    opt.kv_cache_gb = 8;
    opt.backend.kind = BackendKind::kCuda;
    opt.backend.cuda_act = DType::kF16;
    opt.devices = {b.device};
    auto src = make_random_source(cfg, 1234, DType::kBF16);
    return build(opt, *src);
}

// Bytes one decode step of `batch` tokens at position `pos` streams: weights (all but the embedding
// table) + K and V rows of every layer.
double step_bytes(const Model& m, int64_t batch, int64_t pos) {
    const ModelConfig& c = m.config();
    return double(m.streamed_weight_bytes()) + double(c.n_layers) * batch * double(pos + 1) * c.kv_dim() * 2.0 * 2.0;
}

// The engine path: Engine::step at each batch size (see the header).
nlohmann::json engine_rows(Bench& b, RankRuntime& rt, nlohmann::json& section) {
    Engine& engine = *rt.engine;
    Model& model = *rt.model;
    const int64_t vocab = model.config().vocab;
    const int warm = 3, iters = b.quick ? 5 : 20;
    nlohmann::json rows = nlohmann::json::array();
    fmt::print("  engine path (Engine::step: graph replay + device selection + host bookkeeping)\n");
    fmt::print("  {:>6} {:>10} {:>10} {:>10} {:>10} {:>8} {:>9}\n", "batch", "prefill_s", "step_ms", "tokens/s",
               "floor_ms", "%floor", "replays");
    for (int64_t batch : kBatches) {
        if (!b.time_left(5)) {
            section["engine_skipped"] = fmt::format("batch {} and up: out of time", batch);
            break;
        }
        std::vector<int64_t> ids;
        for (int64_t s = 0; s < batch; ++s) {
            EngineRequest r;
            for (int64_t t = 0; t < b.ctx; ++t) r.prompt.push_back(int32_t((s * 7919 + t * 104729) % (vocab - 2) + 2));
            r.max_new_tokens = warm + iters + 8;  // never finishes inside the timed steps
            r.ignore_eos = true;
            ids.push_back(engine.add(std::move(r)));
        }
        const auto t_pre = Clock::now();
        std::map<int64_t, int64_t> got;
        auto count_tokens = [&](const std::vector<TokenEvent>& evs) {
            for (const TokenEvent& e : evs)
                if (e.token >= 0) ++got[e.id];
        };
        while (int64_t(got.size()) < batch) count_tokens(engine.step());
        const double prefill_s = since(t_pre);
        for (int i = 0; i < warm; ++i) count_tokens(engine.step());
        const EngineCounters c0 = engine.counters();
        int64_t timed_tokens = 0;
        const auto t0 = Clock::now();
        for (int i = 0; i < iters; ++i) {
            const std::vector<TokenEvent> evs = engine.step();
            for (const TokenEvent& e : evs) timed_tokens += e.token >= 0;
            count_tokens(evs);
        }
        const double step_ms = since(t0) * 1e3 / iters;
        const EngineCounters c1 = engine.counters();
        LATTICE_CHECK(timed_tokens == batch * iters,
                      "bench_gpu_decode: batch {}: {} tokens in {} timed steps, wanted {}", batch, timed_tokens, iters,
                      batch * iters);
        for (int64_t id : ids) engine.cancel(id);
        while (engine.busy()) engine.step();
        const int64_t replays = c1.graph_replays - c0.graph_replays, steps = c1.steps - c0.steps;
        const double bytes = step_bytes(model, batch, b.ctx + warm + iters / 2);
        const double floor_ms = bytes / (b.floor_gbs * 1e9) * 1e3;
        fmt::print("  {:>6} {:>10.2f} {:>10.3f} {:>10.1f} {:>10.3f} {:>7.1f}% {:>5}/{:<3}\n", batch, prefill_s, step_ms,
                   batch * 1e3 / step_ms, floor_ms, 100.0 * floor_ms / step_ms, replays, steps);
        if (replays < steps)
            fmt::print("  WARNING: {} of {} timed steps did not replay a graph\n", steps - replays, steps);
        rows.push_back({{"batch", batch},
                        {"prefill_seconds", prefill_s},
                        {"ms_per_step", step_ms},
                        {"tokens_per_s", batch * 1e3 / step_ms},
                        {"timed_steps", steps},
                        {"graph_replays", replays},
                        {"bytes_per_step", bytes},
                        {"floor_ms", floor_ms},
                        {"pct_of_floor", 100.0 * floor_ms / step_ms}});
        section["engine"] = rows;
        b.write();
    }
    return rows;
}

// One decode step of `batch` sequences at position `pos` on the model directly: sequence s owns the
// cache blocks [s W, (s + 1) W). The batch and its buffers outlive every use of `body`.
struct DecodeStep {
    Model& model;
    int64_t batch;
    std::vector<int32_t> ids, pos, seqs, tables;
    std::vector<int64_t> rows;
    TokenBatch tb;
    DecodeStep(Model& m, int64_t batch_, int64_t position) : model(m), batch(batch_) {
        const int64_t W = m.attention_shape().table_width;
        LATTICE_CHECK(m.kv_blocks() >= batch * W, "bench_gpu_decode: {} KV blocks for {} sequences of {} blocks",
                      m.kv_blocks(), batch, W);
        for (int64_t s = 0; s < batch; ++s) {
            ids.push_back(int32_t((s * 7919 + 17) % m.config().vocab));
            pos.push_back(int32_t(position));
            seqs.push_back(int32_t(s));
            rows.push_back(s);
        }
        tables.resize(size_t(batch * W));
        std::iota(tables.begin(), tables.end(), 0);
        tb = TokenBatch{ids.data(), pos.data(), seqs.data(), batch, tables.data(), batch, W};
    }
    void body() {
        const StepScope step(model.backend(), tb);
        View hidden = model.hidden_scratch(batch);
        model.embed(tb, hidden);
        model.run_layers(tb, hidden);
        model.head_logits(hidden, rows);
    }
};

// The graph alone: ms per step of back-to-back relaunches, timed by events on the backend's stream.
double graph_ms(Bench& b, Model& model, int64_t batch) {
    auto& be = dynamic_cast<CudaBackend&>(model.backend());
    DecodeStep step(model, batch, b.ctx);
    step.body();  // eager: sizes the scratch
    be.sync();
    CudaGraph graph;
    graph.capture(be, step.tb, [&] { step.body(); });
    graph.replay(be, step.tb);
    const int iters = b.quick ? 10 : 50;
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    for (int i = 0; i < 3; ++i) graph.relaunch(be);
    CUDA_CHECK(cudaEventRecord(e0, be.stream()));
    for (int i = 0; i < iters; ++i) graph.relaunch(be);
    CUDA_CHECK(cudaEventRecord(e1, be.stream()));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return double(ms) / iters;
}

nlohmann::json graph_rows(Bench& b, Model& model, nlohmann::json& section, const char* key,
                          std::initializer_list<int64_t> batches) {
    nlohmann::json rows = nlohmann::json::array();
    for (int64_t batch : batches) {
        if (!b.time_left(3)) {
            section[std::string(key) + "_skipped"] = fmt::format("batch {} and up: out of time", batch);
            break;
        }
        const double ms = graph_ms(b, model, batch);
        const double bytes = step_bytes(model, batch, b.ctx);
        const double floor_ms = bytes / (b.floor_gbs * 1e9) * 1e3;
        fmt::print("  graph alone, {} layers, batch {:>2}: {:8.3f} ms per step, floor {:.3f} ms: {:5.1f}%\n",
                   model.config().n_layers, batch, ms, floor_ms, 100.0 * floor_ms / ms);
        rows.push_back({{"batch", batch},
                        {"layers", model.config().n_layers},
                        {"ms_per_step", ms},
                        {"bytes_per_step", bytes},
                        {"floor_ms", floor_ms},
                        {"pct_of_floor", 100.0 * floor_ms / ms}});
        section[key] = rows;
        b.write();
    }
    return rows;
}

// One eager step at batch 1 with per-op events: time per op name, in first-issue order.
void kernel_breakdown(Bench& b, Model& model, nlohmann::json& section) {
    auto& be = dynamic_cast<CudaBackend&>(model.backend());
    DecodeStep step(model, 1, b.ctx);
    step.body();  // warm (plans, scratch)
    be.sync();
    be.set_op_timing(true);
    step.body();
    const auto ops = be.op_times();
    be.set_op_timing(false);
    std::vector<std::string> order;
    std::map<std::string, std::pair<int64_t, double>> agg;  // name -> (count, us)
    double total = 0;
    for (const auto& [name, us] : ops) {
        if (!agg.count(name)) order.push_back(name);
        agg[name].first += 1;
        agg[name].second += us;
        total += us;
    }
    nlohmann::json rows = nlohmann::json::array();
    fmt::print("  kernels of one eager decode step at batch 1 ({} ops, {:.1f} us in all):\n", ops.size(), total);
    for (const std::string& name : order) {
        const auto [count, us] = agg[name];
        fmt::print("    {:<40} {:>4} x {:>8.2f} us = {:>8.1f} us {:5.1f}%\n", name, count, us / count, us,
                   100.0 * us / total);
        rows.push_back(
            {{"op", name}, {"count", count}, {"us", us}, {"us_each", us / count}, {"pct", 100.0 * us / total}});
    }
    section["kernels"] = rows;
    section["kernels_total_us"] = total;
    b.write();
}

void run_section(Bench& b, const std::string& shape, int64_t layers, int64_t short_layers) {
    nlohmann::json& section = b.doc["sections"].emplace_back(nlohmann::json::object());
    section["shape"] = shape;
    section["layers"] = layers;
    section["quant"] = "w8a8 (LM head too)";
    section["ctx"] = b.ctx;
    fmt::print("\n== {} ({} layers), w8a8, TP=1, ctx {}\n", shape, layers, b.ctx);
    double t_long1 = 0, t_long32 = 0, bytes_long1 = 0, bytes_long32 = 0;
    {
        const auto t_load = Clock::now();
        RankRuntime rt = build_shape(b, shape, layers);
        section["load_seconds"] = since(t_load);
        section["backend"] = rt.backend->name();
        section["streamed_weight_bytes"] = rt.model->streamed_weight_bytes();
        fmt::print("  loaded in {:.1f} s: {}\n", since(t_load), rt.backend->name());
        b.write();
        engine_rows(b, rt, section);
        const nlohmann::json g = graph_rows(b, *rt.model, section, "graph", {1, 8, 32});
        for (const auto& r : g) {
            if (r["batch"] == 1) t_long1 = r["ms_per_step"], bytes_long1 = r["bytes_per_step"];
            if (r["batch"] == 32) t_long32 = r["ms_per_step"], bytes_long32 = r["bytes_per_step"];
        }
        if (b.time_left(3)) kernel_breakdown(b, *rt.model, section);
    }
    if (t_long1 <= 0 || !b.time_left(10)) {
        section["slope_skipped"] = "out of time";
        b.write();
        return;
    }
    RankRuntime rs = build_shape(b, shape, short_layers);
    const nlohmann::json g = graph_rows(b, *rs.model, section, "graph_short", {1, 32});
    nlohmann::json slopes = nlohmann::json::array();
    for (const auto& r : g) {
        const bool one = r["batch"] == 1;
        const double t_long = one ? t_long1 : t_long32, bytes_long = one ? bytes_long1 : bytes_long32;
        if (t_long <= 0) continue;
        const double dl = double(layers - short_layers);
        const double layer_ms = (t_long - double(r["ms_per_step"])) / dl;
        const double layer_bytes = (bytes_long - double(r["bytes_per_step"])) / dl;
        const double layer_floor_ms = layer_bytes / (b.floor_gbs * 1e9) * 1e3;
        const double pct = layer_ms > 0 ? 100.0 * layer_floor_ms / layer_ms : 0;
        fmt::print(
            "  slope {} -> {} layers, batch {:>2}: {:.2f} us per layer, floor {:.2f} us: {:5.1f}% of the floor\n",
            short_layers, layers, int64_t(r["batch"]), layer_ms * 1e3, layer_floor_ms * 1e3, pct);
        slopes.push_back({{"batch", r["batch"]},
                          {"layers", {short_layers, layers}},
                          {"us_per_layer", layer_ms * 1e3},
                          {"bytes_per_layer", layer_bytes},
                          {"floor_us_per_layer", layer_floor_ms * 1e3},
                          {"pct_of_floor", pct}});
    }
    section["slope"] = slopes;
    b.write();
}

}  // namespace

int main(int argc, char** argv) try {
    Bench b;
    int64_t layers70b = 8;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--out" && i + 1 < argc)
            b.out_dir = argv[++i];
        else if (a == "--device" && i + 1 < argc)
            b.device = std::stoi(argv[++i]);
        else if (a == "--ctx" && i + 1 < argc)
            b.ctx = std::stoll(argv[++i]);
        else if ((a == "--layers70b" || a == "--layers") && i + 1 < argc)
            layers70b = std::stoll(argv[++i]);
        else if (a == "--deadline" && i + 1 < argc)
            b.deadline_s = std::stod(argv[++i]);
        else if (a == "--quick")
            b.quick = true;
        else
            LATTICE_FAIL("bench_gpu_decode: unknown argument '{}'", a);
    }
    LATTICE_CHECK(layers70b >= 0 && layers70b <= 80 && b.ctx >= 1 && b.ctx < 100000, "bench_gpu_decode: bad options");
    if (cuda_device_count() == 0) {
        fmt::print("bench_gpu_decode: SKIP: no CUDA device\n");
        return 77;
    }
    const bench::GpuPeaks peaks = bench::gpu_peaks(b.device);
    const double copy_gbs = bench::measure_copy_gbs(b.device);
    b.floor_gbs = copy_gbs > 0 ? copy_gbs : peaks.hbm_gbs;
    b.doc = {{"benchmark", "gpu_decode"},
             {"gpu_model", peaks.model},
             {"hbm_copy_gbs", copy_gbs},
             {"hbm_datasheet_gbs", peaks.hbm_gbs},
             {"floor_gbs", b.floor_gbs},
             {"floor_from", copy_gbs > 0 ? "device-to-device copy measured in this run" : "datasheet"},
             {"sections", nlohmann::json::array()}};
    fmt::print("floor bandwidth {:.0f} GB/s ({}; datasheet {:.0f} GB/s [{}])\n", b.floor_gbs,
               copy_gbs > 0 ? "device copy" : "datasheet", peaks.hbm_gbs, peaks.model);
    b.write();
    run_section(b, "tinyllama-1.1b", 22, 6);
    if (layers70b >= 3 && b.time_left(20))
        run_section(b, "llama-2-70b", layers70b, 2);
    else if (layers70b >= 3)
        b.doc["llama-2-70b_skipped"] = "out of time";
    b.doc["complete"] = true;
    b.write();
    fmt::print("\nwrote {}/decode.json\n", b.out_dir);
    return 0;
} catch (const std::exception& e) {
    fmt::print(stderr, "bench_gpu_decode: {}\n", e.what());
    return 1;
}
