// `lattice info [--model PATH]`: config, parameter count and weight bytes of a checkpoint (the
// built-in model without --model), and the memory one rank needs to run it at a given --quant,
// --tp, --pp and context (--max-seq): its weights as the backend keeps them, the KV cache of one
// sequence of that context, and an estimate of the activations and workspace of one forward of
// --max-batch-tokens. The checkpoint is checked against its config first (check_tensor_set: every
// tensor present with its shape, nothing unexplained), so the parameter count printed is the
// tensors' own, and an absurd config is an error rather than a number.
// The count and the estimate are the builder's (runtime/builder/estimate.h: the loader's own weight
// plan, so the estimate follows the code that loads); this command parses and prints.
#include "base/memory.h"
#include "launch/cli.h"
#include "launch/cli_common.h"
#include "runtime/builder/estimate.h"
#include "runtime/weights/tensor_source.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <memory>
#include <string>

namespace lattice {

namespace {

struct InfoArgs {
    std::string model;
    std::string quant = "auto";
    bool quant_head = false;
    int tp = 1, pp = 1;
    int64_t max_seq = 0;
    int64_t max_batch_tokens = 256;
    std::string device = "cpu";
    std::string kv_cache_dtype = "auto";
    std::string dtype;  // --dtype: cpu f32 | bf16, cuda f16 | bf16 ("": the device's default)
};


// The memory of the largest rank of the layout (the builder's estimate, runtime/builder/estimate.h).
void print_memory(const TensorSource& src, const InfoArgs& args) {
    MemoryQuery q;
    q.quant_auto = args.quant == "auto";
    if (!q.quant_auto) q.quant = parse_quant_mode(args.quant);
    q.quant_head = args.quant_head;
    q.tp = args.tp;
    q.pp = args.pp;
    q.max_seq = args.max_seq;
    q.max_batch_tokens = args.max_batch_tokens;
    q.device = parse_backend_kind(args.device);
    q.kv_cache_dtype = args.kv_cache_dtype;
    const bool cuda = q.device == BackendKind::kCuda;
    BackendOptions b;  // --dtype as a run would take it (its refusals too)
    b.kind = q.device;
    apply_dtype(b, args.dtype);
    q.cpu_bf16 = b.cpu_bf16;
    const RankMemory m = largest_rank_memory(src, q);
    // The LM head's mode when quantized (a 4-bit run keeps an 8-bit one: rank_weights.h).
    const std::string head = m.head != QuantMode::kNone ? fmt::format(" + {} head", quant_mode_name(m.head)) : "";
    print_stdout(
        "memory per rank (quant {}{}, tp {} x pp {}, {}{}, context {}): {:.3f} GiB = weights {:.3f} GiB + KV "
        "cache {:.3f} GiB per sequence of {} positions ({}) + activations ~{:.3f} GiB ({} tokens per step){}\n",
        quant_mode_name(m.quant), head, args.tp, args.pp, cuda ? "cuda" : "cpu", q.cpu_bf16 ? " bf16" : "", m.max_seq,
        to_gib(m.total()), to_gib(m.weights), to_gib(m.kv), m.max_seq, m.kv_dtype, to_gib(m.activations),
        args.max_batch_tokens, args.pp > 1 ? fmt::format(" (largest: pp stage {})", m.stage) : "");
}

}  // namespace

void add_info_command(CLI::App& app, CommandRun& run) {
    auto* cmd = app.add_subcommand(
        "info", "Print a model's configuration, parameter count, weight bytes and the memory a rank needs to run it");
    auto args = std::make_shared<InfoArgs>();
    cmd->add_option("-m,--model", args->model,
                    "HF model directory or .gguf file (default: the built-in SmolLM2-135M-Instruct)")
        ->default_str("built-in");
    cmd->add_option("--quant", args->quant, "Quantization of the memory estimate: auto | none | w8a16 | w8a8 | w4a16 | w4a8")
        ->check(CLI::IsMember({"auto", "none", "w8a16", "w8a8", "w4a16", "w4a8"}));
    cmd->add_option("--kv-cache-dtype", args->kv_cache_dtype,
                    "KV cache elements of the estimate: auto (f32 on cpu, 16-bit on cuda) | f32 | f16 | bf16 | int8")
        ->check(CLI::IsMember({"auto", "f32", "f16", "bf16", "int8"}))
        ->capture_default_str();
    cmd->add_flag("--quant-head", args->quant_head, "The estimate quantizes the LM head too");
    cmd->add_option("--tp", args->tp, "Tensor-parallel ranks of the estimate")->check(tp_flag_range());
    cmd->add_option("--pp", args->pp, "Pipeline stages of the estimate")->check(pp_flag_range());
    cmd->add_option("--max-seq,--context", args->max_seq,
                    fmt::format("Context of the estimate's KV cache, positions (0: min(max_position_embeddings, {}))",
                                kDefaultMaxSeq))
        ->check(int_range(0, INT32_MAX));
    cmd->add_option("--max-batch-tokens", args->max_batch_tokens, "Tokens per forward pass of the activation estimate")
        ->check(int_range(1, 1 << 20));
    cmd->add_option("--device", args->device, "Backend of the estimate: cpu (f32 activations) | cuda (16-bit)")
        ->check(CLI::IsMember({"cpu", "cuda"}));
    cmd->add_option(
           "--dtype", args->dtype,
           "Compute type of the estimate, as generate's --dtype: cpu f32 | bf16 (float linears in bf16, KV auto "
           "bf16), cuda f16 | bf16")
        ->check(CLI::IsMember({"f32", "f16", "bf16"}));
    cmd->footer(R"(Examples:
  lattice info                                     # the built-in model
  lattice info --tp 3 --pp 2 --context 2048       # its memory per rank on 6 ranks
  lattice info --model /models/llama-2-70b --quant w8a8 --tp 8)");
    cmd->callback([&run, args] {
        run = [args] {
            const std::string path = args->model.empty() ? default_model_path() : args->model;
            std::unique_ptr<TensorSource> src = open_model(path);
            const ModelConfig& c = src->config();
            print_stdout("model: {}\n", src->describe());
            print_stdout("architecture: {} (family {}{}{})\n", c.architecture, c.family,
                         c.sliding_window > 0 ? fmt::format(", sliding window {}", c.sliding_window) : "",
                         c.sliding_window > 0 && c.window_layer_begin > 0
                             ? fmt::format(" in layers {} and up", c.window_layer_begin)
                             : "");
            print_stdout("hidden: {}  intermediate: {}  layers: {}  heads: {}  kv_heads: {}  head_dim: {}\n", c.hidden,
                         c.intermediate, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim);
            print_stdout("vocab: {}  max_position: {}  rms_eps: {}  rope_theta: {}  rope_scaling: {}\n", c.vocab,
                         c.max_position, c.rms_eps, c.rope_theta,
                         c.rope_scaling.type.empty() ? "none" : c.rope_scaling.type);
            print_stdout("tie_embeddings: {}  bos: {}  eos: {}\n", c.tie_embeddings, c.bos_id,
                         fmt::join(c.eos_ids, ","));
            if (c.is_moe()) {
                // Each token runs k of the E experts: what it computes and, decoding alone, reads.
                const int64_t active = c.active_parameter_count();
                print_stdout("experts: {} per layer, {} per token (intermediate is each expert's); active parameters "
                             "per token: {} ({:.3f} B)\n",
                             c.n_experts, c.n_experts_used, active, double(active) * 1e-9);
            }
            const int64_t params = checked_parameter_count(*src);
            print_stdout("parameters: {} ({:.3f} B)\n", params, double(params) * 1e-9);
            print_stdout("weight bytes in checkpoint: {} ({:.3f} GiB)\n", src->total_bytes(),
                         to_gib(double(src->total_bytes())));
            if (src->prepared())
                print_stdout("memory per rank: see the manifest (a converted folder runs on the layout it holds)\n");
            else
                print_memory(*src, *args);
            return 0;
        };
    });
}

}  // namespace lattice
