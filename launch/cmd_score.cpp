// `lattice score`: float32 logits of every prompt position written as tensor `logits` [T, vocab]
// of a safetensors file, written atomically; --out must be absent or a regular file (a symlink,
// FIFO or device is refused), and a previous file there is removed when the run starts. With one --lora
// the logits are the adapter's.
#include "launch/cli.h"
#include "launch/cli_common.h"

#include "runtime/engine/client.h"
#include "runtime/weights/safetensors.h"

#include <memory>

namespace lattice {

void add_score_command(CLI::App& app, CommandRun& run) {
    struct Args {
        ModelArgs model;
        std::string prompt_ids, out;
    };
    auto args = std::make_shared<Args>();
    auto* cmd = app.add_subcommand("score", "Write the logits of every prompt position to a safetensors file");
    args->model.add_to(cmd);
    cmd->add_option("--prompt-ids", args->prompt_ids, "Prompt token ids, e.g. 1,2,3")->required();
    cmd->add_option("--out", args->out, "Output .safetensors file (tensor \"logits\", f32 [T, vocab])")->required();
    cmd->footer(R"(Examples:
  lattice score --prompt-ids 1,2,3 --out logits.safetensors            # the built-in model
  lattice score --model /models/llama-2-7b --prompt-ids 1,450,4996 --out l7b.safetensors
  lattice score --model /models/llama-2-7b --lora /adapters/sql-lora --prompt-ids 1,450,4996 --out sql.safetensors
  mpirun -np 3 --oversubscribe lattice score --tp 3 --threads 1 --prompt-ids 1,2,3 --out logits.safetensors)");
    cmd->callback([&run, args] {
        run = [args] {
            std::vector<int32_t> prompt = parse_id_list(args->prompt_ids, "--prompt-ids");
            LATTICE_CHECK(!prompt.empty(), "give a prompt: --prompt-ids 1,2,3");
            if (args->model.model.empty() && !args->model.random_weights) args->model.model = default_model_path();
            prepare_output_file(args->out, "--out", {args->model.model, args->model.smooth});
            RankRuntime rt = load_model(args->model);
            EngineClient client(*rt.engine, nullptr);
            const std::vector<float> logits = client.score(prompt, args->model.run_lora("score"));
            if (rt.world.rank == 0) {
                const int64_t T = int64_t(prompt.size()), V = rt.model->config().vocab;
                write_safetensors(args->out, {{"logits", DType::kF32, {T, V}, logits.data()}});
            }
            return 0;
        };
    });
}

}  // namespace lattice
