// `lattice layout`: is tp x pp possible for this model on these nodes? The answer comes from
// parallel/world_config (the only home of the layout rules); launch/lattice-mpirun asks here
// (--json) instead of keeping its own copy. Exit 0 when the layout fits, 1 (with the reason) when not.
#include "launch/cli.h"
#include "launch/cli_common.h"

#include "parallel/world_config.h"
#include "runtime/arch/config.h"
#include "runtime/weights/tensor_source.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>

namespace lattice {

void add_layout_command(CLI::App& app, CommandRun& run) {
    struct Args {
        int tp = 1, pp = 1;
        std::string model, preset;
        Placement place;
        bool json = false;
    };
    auto args = std::make_shared<Args>();
    auto* cmd = app.add_subcommand("layout", "Check a TP x PP layout against a model and the nodes it runs on");
    cmd->add_option("--tp", args->tp, "Tensor-parallel ranks")->required()->check(tp_flag_range());
    cmd->add_option("--pp", args->pp, "Pipeline-parallel stages")->check(pp_flag_range());
    cmd->add_option("--model", args->model, "Check the model's heads, FFN and layers too (HF dir or .gguf)");
    cmd->add_option("--config", args->preset, "... or a built-in shape (tinyllama-1.1b, llama-2-70b, ...)");
    cmd->add_option("--nodes", args->place.nodes, "Nodes the ranks are spread over (default 1)")
        ->check(int_range(1, 1 << 20));
    cmd->add_flag("--cpu", args->place.cpu, "CPU ranks (default: one GPU per rank)");
    cmd->add_option("--gpus-per-node", args->place.gpus_per_node, "GPUs per node (GPU ranks)")
        ->check(int_range(0, 1 << 20));
    cmd->add_option("--cores-per-node", args->place.cores_per_node, "Physical cores per node (CPU ranks)")
        ->check(int_range(0, 1 << 20));
    cmd->add_option("--slots-per-node", args->place.slots_per_node, "Fewest MPI slots a host offers (0: unlimited)")
        ->check(int_range(0, 1 << 20));
    cmd->add_option("--slots-host", args->place.slots_host, "The host offering them (named in the message)");
    cmd->add_flag("--oversubscribe", args->place.oversubscribe, "CPU ranks may share cores");
    cmd->add_flag("--json", args->json, "One JSON object on stdout: {ok, ranks, ranks_per_node | error}");
    cmd->footer(R"(Examples:
  lattice layout --tp 3 --pp 2 --cpu --cores-per-node 8       # the built-in model takes tp 1 or 3
  lattice layout --tp 8 --gpus-per-node 8 --config llama-2-70b
  lattice layout --tp 4 --pp 2 --nodes 2 --gpus-per-node 4 --config llama-3-70b --json)");
    cmd->callback([&run, args] {
        run = [args] {
            nlohmann::json j = {{"tp", args->tp}, {"pp", args->pp}, {"ranks", int64_t(args->tp) * args->pp}};
            std::string error;
            try {
                if (!args->model.empty() || !args->preset.empty()) {
                    const ModelConfig c =
                        args->preset.empty() ? open_model(args->model)->config() : preset_config(args->preset);
                    check_model_layout(c.dims(), args->tp, args->pp);
                }
                j["ranks_per_node"] = check_placement(args->tp, args->pp, args->place);
            } catch (const Error& e) {
                error = output_settings().verbose ? e.what() : e.message();
            }
            j["ok"] = error.empty();
            if (!error.empty()) j["error"] = error;
            if (args->json)
                print_stdout("{}\n", j.dump());
            else if (error.empty())
                print_stdout("tp {} x pp {}: {} ranks, {} per node\n", args->tp, args->pp, args->tp * args->pp,
                             j["ranks_per_node"].get<int>());
            else
                print_stderr(
                    fmt::format("lattice: layout tp {} x pp {} does not fit: {}\n", args->tp, args->pp, error));
            return error.empty() ? 0 : 1;
        };
    });
}

}  // namespace lattice
