// `lattice info --model PATH`: config, parameter count and weight bytes of a checkpoint.
#include "launch/cli.h"
#include "runtime/weights/tensor_source.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <memory>
#include <string>

namespace lattice {

void add_info_command(CLI::App& app, CommandRun& run) {
    auto* cmd = app.add_subcommand("info", "Print a model's configuration, parameter count and weight bytes");
    auto model = std::make_shared<std::string>();
    cmd->add_option("--model", *model, "HF model directory or .gguf file")->required();
    cmd->callback([&run, model] {
        run = [model] {
            std::unique_ptr<TensorSource> src = open_model(*model);
            const ModelConfig& c = src->config();
            fmt::print("model: {}\n", src->describe());
            fmt::print("architecture: {}\n", c.architecture);
            fmt::print("hidden: {}  intermediate: {}  layers: {}  heads: {}  kv_heads: {}  head_dim: {}\n", c.hidden,
                       c.intermediate, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim);
            fmt::print("vocab: {}  max_position: {}  rms_eps: {}  rope_theta: {}  rope_scaling: {}\n", c.vocab,
                       c.max_position, c.rms_eps, c.rope_theta, c.rope_scaling.type.empty() ? "none" : c.rope_scaling.type);
            fmt::print("tie_embeddings: {}  bos: {}  eos: {}\n", c.tie_embeddings, c.bos_id, fmt::join(c.eos_ids, ","));
            fmt::print("parameters: {} ({:.3f} B)\n", c.parameter_count(), double(c.parameter_count()) * 1e-9);
            fmt::print("weight bytes in checkpoint: {} ({:.3f} GiB)\n", src->total_bytes(),
                       double(src->total_bytes()) / double(1 << 30));
            return 0;
        };
    });
}

}  // namespace lattice
