// `lattice info --model PATH`: config, parameter count and weight bytes of a checkpoint. The
// checkpoint is checked against its config first (check_tensor_set: every tensor present with its
// shape, nothing unexplained), so the parameter count printed is the tensors' own, and an absurd
// config is an error rather than a number.
#include "launch/cli.h"
#include "launch/cli_common.h"
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
            print_stdout("model: {}\n", src->describe());
            print_stdout("architecture: {}\n", c.architecture);
            print_stdout("hidden: {}  intermediate: {}  layers: {}  heads: {}  kv_heads: {}  head_dim: {}\n", c.hidden,
                         c.intermediate, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim);
            print_stdout("vocab: {}  max_position: {}  rms_eps: {}  rope_theta: {}  rope_scaling: {}\n", c.vocab,
                         c.max_position, c.rms_eps, c.rope_theta,
                         c.rope_scaling.type.empty() ? "none" : c.rope_scaling.type);
            print_stdout("tie_embeddings: {}  bos: {}  eos: {}\n", c.tie_embeddings, c.bos_id,
                         fmt::join(c.eos_ids, ","));
            if (!src->prepared()) check_tensor_set(*src);  // a converted file is checked when a rank loads it
            const int64_t params = c.parameter_count(), listed = listed_elements(*src);
            // Sources that list their tensors must hold what the config describes (rope tables aside).
            LATTICE_CHECK(listed == 0 || listed >= params,
                          "{}: the config describes {} parameters but the checkpoint's tensors hold {}",
                          src->describe(), params, listed);
            print_stdout("parameters: {} ({:.3f} B)\n", params, double(params) * 1e-9);
            print_stdout("weight bytes in checkpoint: {} ({:.3f} GiB)\n", src->total_bytes(),
                         double(src->total_bytes()) / double(1 << 30));
            return 0;
        };
    });
}

}  // namespace lattice
