// End-to-end single-rank CPU benchmark on a checkpoint (--model: a GGUF or HF folder) or a random-weight model
// of a built-in shape (default TinyLlama-1.1B: hidden 2048, 22 layers, 32/4 heads, ffn 5632, vocab 32000).
// Ceiling: decode reads every weight once per token (all but the embedding table, of which it reads
// one row), so the floor time per token is streamed weight bytes / measured read bandwidth (a 1 GiB stream
// read by the same number of threads); we report the achieved weight-read GB/s and its ratio to that floor,
// and the KV cache bytes the last decode step read besides (f32 K and V of every cached position).
// Prefill is compute bound; we report tokens/s and GFLOP/s (2 x parameters x tokens).
// Usage: bench_decode [--model FILE | --config tinyllama-1.1b] [--threads N] [--pin] [--prompt 128] [--decode 32]
//                     [--quant auto|none|w8a16|w8a8|w4a16|w4a8] [--int8-gemm auto|own|onednn] [--isa LEVEL]
//                     [--json FILE]
// --int8-gemm picks who runs the W8A8 GEMMs at m >= 16 (kernels/cpu/int8_gemm.h, Int8Provider); --isa pins the CPU
// level as LATTICE_ISA does for lattice (e.g. avx512 on an AMX Xeon: the VNNI kernels beside the tiles).
#include "benchmarks/bench_common.h"

#include "base/log.h"
#include "kernels/cpu/int8_gemm.h"
#include "kernels/cpu/thread_pool.h"
#include "runtime/engine/client.h"
#include "runtime/builder/build.h"
#include "runtime/weights/random_source.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

using namespace lattice;

int main(int argc, char** argv) {
    CLI::App app{"lattice decode/prefill benchmark (a checkpoint or random weights)"};
    std::string preset = "tinyllama-1.1b", quant = "none", json, model_path, int8_gemm = "auto", dtype = "f32", isa;
    int threads = 0;
    bool pin = false;
    int64_t prompt = 128, decode = 32;
    app.add_option("--config", preset);
    app.add_option("--model", model_path, "checkpoint (GGUF file or HF folder) instead of random weights");
    app.add_option("--threads", threads);
    app.add_flag("--pin", pin, "pin the pool's workers to cores (the engine's default leaves them to the scheduler)");
    app.add_option("--prompt", prompt);
    app.add_option("--decode", decode);
    app.add_option("--quant", quant);
    app.add_option("--json", json);
    app.add_option("--int8-gemm", int8_gemm, "W8A8 GEMM provider at m >= 16: auto, own or onednn");
    app.add_option("--isa", isa,
                   "CPU ISA level (scalar, avx2, avxvnni, avx512, amx): as LATTICE_ISA; default the best");
    app.add_option("--dtype", dtype, "f32 | bf16: the CPU's --dtype (bf16: float linears in bf16 pairs, bf16 cache)")
        ->check(CLI::IsMember({"f32", "bf16"}));
    CLI11_PARSE(app, argc, argv);
    try {
        set_int8_provider(parse_int8_provider(int8_gemm));
        if (!isa.empty()) set_isa_override(parse_isa(isa));
        std::unique_ptr<TensorSource> src = model_path.empty() ? make_random_source(preset_config(preset), 42)
                                                               : open_model(model_path);
        const ModelConfig cfg = src->config();
        if (!model_path.empty()) preset = model_path;
        double bw = 0;
        {
            ThreadPool pool(threads, pin);  // the ceiling, on as many threads as the model gets, pinned alike
            bw = bench::measure_read_bandwidth(pool);
        }
        BuildOptions opt;
        opt.quant_auto = quant == "auto";
        opt.model.quant = opt.quant_auto ? QuantMode::kNone : parse_quant_mode(quant);
        opt.model.max_seq = prompt + decode + 1;
        opt.model.max_batch_tokens = std::min<int64_t>(prompt, 256);
        opt.backend.kind = BackendKind::kCpu;
        opt.backend.threads = threads;
        opt.backend.pin = pin;
        opt.backend.cpu_bf16 = dtype == "bf16";
        RankRuntime rt = build(opt, *src);
        const double load_s = rt.load_seconds;
        src.reset();
        Model& model = *rt.model;
        EngineClient engine(*rt.engine, nullptr, true);
        GenerateRequest req;
        for (int64_t i = 0; i < prompt; ++i) req.prompt.push_back(int32_t((i * 7919 + 13) % cfg.vocab));
        req.max_new_tokens = decode;
        req.ignore_eos = true;
        engine.generate(GenerateRequest{{1, 2, 3}, 2, 0, {}, true, {}});  // warm-up: page in, spin up threads
        GenerateResult r = engine.generate(req);
        const double bytes = double(model.streamed_weight_bytes());
        quant = std::string(quant_mode_name(model.options().quant)) + (model.options().quant_head ? "+head" : "");
        const AttentionShape& attn = model.attention_shape();
        const double kv_last = double(cfg.n_layers) * 2 * double(attn.n_kv_heads * attn.head_dim) *
                               double(dtype_size(model.kv_dtype())) * double(prompt + decode);
        const double decode_tps = double(r.stats.generated_tokens - 1) / r.stats.decode_seconds;
        const double prefill_tps = double(prompt) / r.stats.prefill_seconds;
        const double achieved_bw = bytes * decode_tps * 1e-9;
        const double floor_tps = bw * 1e9 / bytes;
        const double gflops = 2.0 * double(cfg.parameter_count()) * prefill_tps * 1e-9;
        fmt::print("| model | quant | threads | streamed GiB/token | prefill tok/s | prefill GFLOP/s | decode tok/s | "
                   "weight GB/s | mem GB/s | ratio to floor |\n");
        fmt::print("|---|---|---|---|---|---|---|---|---|---|\n");
        if (dtype != "f32") quant += " " + dtype;
        fmt::print("| {} | {} | {} | {:.2f} | {:.1f} | {:.1f} | {:.2f} | {:.1f} | {:.1f} | {:.2f} |\n", preset, quant,
                   rt.backend->threads(), bytes / double(1 << 30), prefill_tps, gflops, decode_tps, achieved_bw, bw,
                   decode_tps / floor_tps);
        bench::write_json(json, {{"model", preset},
                                 {"quant", quant},
                                 {"int8_gemm", int8_gemm},
                                 {"isa", std::string(isa_name(detect_isa()))},
                                 {"dtype", dtype},
                                 {"threads", rt.backend->threads()},
                                 {"pinned", pin},
                                 {"weight_bytes", bytes},
                                 {"load_seconds", load_s},
                                 {"prompt_tokens", prompt},
                                 {"prefill_tokens_per_s", prefill_tps},
                                 {"prefill_gflops", gflops},
                                 {"decode_tokens", r.stats.generated_tokens},
                                 {"decode_tokens_per_s", decode_tps},
                                 {"weight_read_gb_per_s", achieved_bw},
                                 {"memory_bandwidth_gb_per_s", bw},
                                 {"decode_floor_tokens_per_s", floor_tps},
                                 {"ratio_to_floor", decode_tps / floor_tps},
                                 {"kv_bytes_last_step", kv_last},
                                 {"vocab", cfg.vocab}});
    } catch (const Error& e) {
        fmt::print(stderr, "bench_decode: error: {}\n", e.what());
        return 1;
    }
    return 0;
}
