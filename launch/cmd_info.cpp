// `lattice info [--model PATH]`: config, parameter count and weight bytes of a checkpoint (the
// built-in model without --model), and the memory one rank needs to run it at a given --quant,
// --tp, --pp and context (--max-seq): its weights as the backend keeps them, the KV cache of one
// sequence of that context, and an estimate of the activations and workspace of one forward of
// --max-batch-tokens. The checkpoint is checked against its config first (check_tensor_set: every
// tensor present with its shape, nothing unexplained), so the parameter count printed is the
// tensors' own, and an absurd config is an error rather than a number.
// The weight plan is the loader's own (RankWeights: which tensors a rank holds, their shapes and
// what quantization each gets), so the estimate follows the code that loads; bytes per element
// follow the CPU backend (float weights keep the checkpoint's precision, int8 linears hold one byte
// per weight plus f32 scales and column sums) or, with --device cuda, 16-bit floats.
#include "base/memory.h"
#include "launch/cli.h"
#include "launch/cli_common.h"
#include "parallel/plan_model.h"
#include "runtime/builder/build.h"
#include "runtime/model/rank_weights.h"
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
};


// The memory of the largest rank of the layout (tp rank 0 of each stage; TP ranks of a stage differ
// by at most a vocabulary row).
void print_memory(const TensorSource& src, const InfoArgs& args) {
    const ModelConfig& c = src.config();
    check_model_layout(c.dims(), args.tp, args.pp);
    const bool cuda = args.device == "cuda";
    const QuantChoice quant = args.quant == "auto"
                                  ? auto_quant(src, args.quant_head, cuda ? QuantMode::kW4A16 : QuantMode::kW4A8)
                                                   : QuantChoice{parse_quant_mode(args.quant), args.quant_head};
    const int64_t act = cuda ? 2 : 4;  // activation bytes per element
    const double kv_elem = kv_element_bytes(args.kv_cache_dtype, c.head_dim, !cuda);
    const int64_t max_seq = resolve_max_seq(args.max_seq, c.max_position);  // the model's own default
    LATTICE_CHECK(max_seq <= c.max_position, "--max-seq {} exceeds the model's max_position_embeddings {}", max_seq,
                  c.max_position);
    const auto stages = stage_layer_ranges(c.n_layers, args.pp);
    double best = -1, best_w = 0, best_kv = 0, best_act = 0;
    int best_stage = 0;
    std::string head;  // the LM head's mode when quantized (a 4-bit run keeps an 8-bit one: rank_weights.h)
    for (int p = 0; p < args.pp; ++p) {
        ModelOptions o;
        o.quant = quant.quant;
        o.quant_head = quant.quant_head;
        o.tp = args.tp;
        o.tp_rank = 0;
        o.layer_begin = stages[size_t(p)].first;
        o.layer_end = stages[size_t(p)].second;
        o.first_stage = p == 0;
        o.last_stage = p == args.pp - 1;
        const RankWeights rw(src, o);
        const double w = rw.resident_bytes(cuda);
        for (const RankTensor& t : rw.tensors())
            if (t.role == WeightRole::kLmHead && t.mode != QuantMode::kNone)
                head = fmt::format(" + {} head", quant_mode_name(t.mode));
        const double kv = kv_cache_bytes(c.dims(), args.tp, o.layer_end - o.layer_begin, max_seq, kv_elem);
        const double act_b = activation_bytes(c.dims(), args.tp, args.max_batch_tokens, double(act), o.last_stage);
        if (w + kv + act_b > best) best = w + kv + act_b, best_w = w, best_kv = kv, best_act = act_b, best_stage = p;
    }
    print_stdout(
        "memory per rank (quant {}{}, tp {} x pp {}, {}, context {}): {:.3f} GiB = weights {:.3f} GiB + KV "
        "cache {:.3f} GiB per sequence of {} positions ({}) + activations ~{:.3f} GiB ({} tokens per step){}\n",
        quant_mode_name(quant.quant), head, args.tp,
        args.pp, cuda ? "cuda" : "cpu", max_seq, to_gib(best), to_gib(best_w), to_gib(best_kv), max_seq,
        args.kv_cache_dtype == "auto" ? (cuda ? "f16" : "f32") : args.kv_cache_dtype, to_gib(best_act), args.max_batch_tokens, args.pp > 1 ? fmt::format(" (largest: pp stage {})", best_stage) : "");
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
                const int64_t active = c.parameter_count() - c.n_layers * (c.n_experts - c.n_experts_used) * 3 *
                                                                 c.hidden * c.intermediate;
                print_stdout("experts: {} per layer, {} per token (intermediate is each expert's); active parameters "
                             "per token: {} ({:.3f} B)\n",
                             c.n_experts, c.n_experts_used, active, double(active) * 1e-9);
            }
            if (!src->prepared()) check_tensor_set(*src);  // a converted file is checked when a rank loads it
            const int64_t params = c.parameter_count(), listed = listed_elements(*src);
            // Sources that list their tensors must hold what the config describes (rope tables aside).
            LATTICE_CHECK(listed == 0 || listed >= params,
                          "{}: the config describes {} parameters but the checkpoint's tensors hold {}",
                          src->describe(), params, listed);
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
