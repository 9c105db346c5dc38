// What LoRA adapters cost, single rank on the CPU: prefill and decode tokens/s of a batch of sequences with 0,
// 1 and 4 adapters active (random rank-R PEFT adapters on all seven projections, written to a temp folder,
// sequences assigned round-robin), against the floor of what the adapters add:
//   decode (weight-bandwidth bound): a step streams the base's weights once plus each active adapter's A and B
//     (f32) once, so the floor slow-down is (base bytes + adapters' bytes) / base bytes;
//   prefill (compute bound): each token adds 2 r (in + out) FLOPs per target per layer per its adapter, so the
//     floor slow-down is (base FLOPs + adapter FLOPs) / base FLOPs.
// "overhead / floor" is the measured slow-down over that floor (1.0: the adapters cost exactly what they add).
// Usage: bench_lora [--model FILE | --config NAME] [--threads N] [--seqs 8] [--prompt 64] [--decode 16]
//                   [--rank 16] [--quant auto|none|w8a8|...] [--json FILE]
// (default model: the built-in SmolLM2-135M Q4_1 when models/ has it and no --config is given, else random
// weights of the --config shape, tinyllama-1.1b by default.)
#include "benchmarks/bench_common.h"

#include "runtime/builder/build.h"
#include "runtime/engine/client.h"
#include "runtime/model/lora.h"
#include "runtime/weights/random_source.h"
#include "runtime/weights/safetensors.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <random>

using namespace lattice;

namespace {

// A random PEFT adapter of rank r on every projection of `cfg` in `dir`; returns its parameters per layer.
int64_t write_random_adapter(const std::string& dir, const ModelConfig& cfg, int64_t r, uint32_t seed) {
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/adapter_config.json")
        << fmt::format(R"({{"peft_type": "LORA", "r": {}, "lora_alpha": {}, "target_modules": ["q_proj", "k_proj",
            "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}})",
                       r, 2 * r);
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 0.02f);
    std::vector<std::vector<float>> data;
    std::vector<TensorToWrite> tensors;
    const char* kind[kLoraTargets] = {"self_attn", "self_attn", "self_attn", "self_attn", "mlp", "mlp", "mlp"};
    int64_t per_layer = 0;
    data.reserve(size_t(cfg.n_layers * kLoraTargets * 2));
    for (int64_t l = 0; l < cfg.n_layers; ++l)
        for (int t = 0; t < kLoraTargets; ++t) {
            const auto [in, out] = lora_target_dims(cfg, LoraTarget(t));
            if (l == 0) per_layer += r * (in + out);
            const std::string p = fmt::format("base_model.model.model.layers.{}.{}.{}.", l, kind[t],
                                              lora_target_name(LoraTarget(t)));
            for (const auto& [suffix, rows, cols] : {std::tuple{"lora_A.weight", r, in}, {"lora_B.weight", out, r}}) {
                data.emplace_back(size_t(rows * cols));
                for (float& v : data.back()) v = nd(rng);
                tensors.push_back({p + suffix, DType::kF32, {rows, cols}, data.back().data()});
            }
        }
    write_safetensors(dir + "/adapter_model.safetensors", tensors);
    return per_layer;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"lattice LoRA cost benchmark: 0, 1 and 4 active adapters in one batch"};
    std::string preset = "tinyllama-1.1b", quant = "auto", json, model_path;
    int threads = 0;
    int64_t seqs = 8, prompt = 64, decode = 16, rank = 16;
    auto* config_opt = app.add_option("--config", preset);
    app.add_option("--model", model_path);
    app.add_option("--threads", threads);
    app.add_option("--seqs", seqs);
    app.add_option("--prompt", prompt);
    app.add_option("--decode", decode);
    app.add_option("--rank", rank);
    app.add_option("--quant", quant);
    app.add_option("--json", json);
    CLI11_PARSE(app, argc, argv);
    const std::string builtin = std::string(LATTICE_SOURCE_DIR_BENCH) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (model_path.empty() && config_opt->count() == 0 && std::filesystem::exists(builtin)) model_path = builtin;
    const std::string dir = (std::filesystem::temp_directory_path() / fmt::format("lattice_bench_lora_{}", getpid())).string();
    try {
        std::unique_ptr<TensorSource> src = model_path.empty() ? make_random_source(preset_config(preset), 42)
                                                               : open_model(model_path);
        const ModelConfig cfg = src->config();
        BuildOptions opt;
        opt.quant_auto = quant == "auto";
        opt.model.quant = opt.quant_auto ? QuantMode::kNone : parse_quant_mode(quant);
        opt.model.max_seq = prompt + decode + 1;
        opt.model.max_batch_tokens = 256;
        opt.engine.max_lora_rank = rank;
        opt.engine.prefix_caching = false;  // every run prefills its prompts
        opt.backend.kind = BackendKind::kCpu;
        opt.backend.threads = threads;
        RankRuntime rt = build(opt, *src);
        src.reset();
        EngineClient client(*rt.engine, nullptr, true);
        int64_t per_layer = 0;
        for (int a = 0; a < 4; ++a) {
            per_layer = write_random_adapter(fmt::format("{}/a{}", dir, a), cfg, rank, uint32_t(7 + a));
            client.loras().add(fmt::format("a{}", a), fmt::format("{}/a{}", dir, a));
        }
        const double adapter_params = double(per_layer * cfg.n_layers);
        const double base_bytes = double(rt.model->streamed_weight_bytes());
        const double base_flops = 2.0 * double(cfg.parameter_count());
        const auto run = [&](int active) {
            std::vector<ClientRequest> reqs;
            for (int64_t s = 0; s < seqs; ++s) {
                ClientRequest r;
                for (int64_t i = 0; i < prompt; ++i) r.prompt.push_back(int32_t((i * 7919 + 13 * s + 5) % cfg.vocab));
                r.max_tokens = decode;
                r.ignore_eos = true;
                if (active > 0) r.lora = fmt::format("a{}", s % active);
                reqs.push_back(r);
            }
            GenerateStats st;
            client.run(reqs, {}, &st);
            return std::pair{double(st.prompt_tokens) / st.prefill_seconds,
                             double(st.generated_tokens - seqs) / st.decode_seconds};
        };
        run(4);  // warm-up: page in, spin up threads, every adapter resident
        fmt::print("| model | quant | threads | seqs | adapters | rank | prefill tok/s | decode tok/s | prefill floor "
                   "x | decode floor x | prefill overhead / floor | decode overhead / floor |\n");
        fmt::print("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        nlohmann::json rows = nlohmann::json::array();
        double p0 = 0, d0 = 0;
        for (const int active : {0, 1, 4}) {
            const auto [p, d] = run(active);
            if (active == 0) p0 = p, d0 = d;
            const double pf = (base_flops + 2.0 * adapter_params) / base_flops;  // every token has an adapter
            const double df = active == 0 ? 1.0 : (base_bytes + 4.0 * adapter_params * active) / base_bytes;
            const double po = (p0 / p) / (active == 0 ? 1.0 : pf), dov = (d0 / d) / df;
            fmt::print("| {} | {} | {} | {} | {} | {} | {:.1f} | {:.1f} | {:.3f} | {:.3f} | {:.2f} | {:.2f} |\n",
                       model_path.empty() ? preset : std::filesystem::path(model_path).filename().string(),
                       quant_mode_name(rt.model->options().quant), rt.backend->threads(), seqs, active, rank, p, d,
                       active == 0 ? 1.0 : pf, df, po, dov);
            rows.push_back({{"adapters", active}, {"prefill_tokens_per_s", p}, {"decode_tokens_per_s", d},
                            {"prefill_floor_slowdown", active == 0 ? 1.0 : pf}, {"decode_floor_slowdown", df},
                            {"prefill_overhead_over_floor", po}, {"decode_overhead_over_floor", dov}});
        }
        bench::write_json(json, {{"model", model_path.empty() ? preset : model_path},
                                 {"threads", rt.backend->threads()},
                                 {"seqs", seqs},
                                 {"rank", rank},
                                 {"adapter_parameters", adapter_params},
                                 {"base_streamed_bytes", base_bytes},
                                 {"rows", rows}});
    } catch (const Error& e) {
        fmt::print(stderr, "bench_lora: error: {}\n", e.what());
        std::filesystem::remove_all(dir);
        return 1;
    }
    std::filesystem::remove_all(dir);
    return 0;
}
