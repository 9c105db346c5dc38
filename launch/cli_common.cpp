// Shared model-loading options and setup (see cli_common.h).
#include "launch/cli_common.h"

#include "base/log.h"
#if !defined(LATTICE_NO_MPI)
#include "parallel/mpi_session.h"
#endif

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace lattice {

void ModelArgs::add_to(CLI::App* cmd) {
    cmd->add_option("--model", model, "HF model directory (config.json + safetensors) or .gguf file");
    cmd->add_flag("--random-weights", random_weights, "Fabricate weights of the model's shape from --seed-weights");
    cmd->add_option("--config", config_preset, "Built-in shape for --random-weights (tinyllama-1.1b, llama-2-7b, "
                                               "llama-2-70b, llama-3-8b, llama-3-70b)");
    cmd->add_option("--seed-weights", weight_seed, "Seed for --random-weights");
    cmd->add_option("--quant", quant, "Linear layers: none | w8a16 | w8a8")->check(CLI::IsMember({"none", "w8a16", "w8a8"}));
    cmd->add_flag("--quant-head", quant_head, "Quantize the LM head too (embedding stays float)");
    cmd->add_option("--smooth", smooth,
                    "SmoothQuant factors from lattice calibrate (.safetensors), folded into the weights at load");
    cmd->add_option("--threads", threads, "CPU threads per rank (0: one per available core)");
    cmd->add_flag("--mlock", mlock, "Lock weights in memory");
    cmd->add_option("--max-seq", max_seq, "KV cache positions per sequence (0: min(max_position_embeddings, 4096))");
    cmd->add_option("--max-batch-tokens", max_batch_tokens, "Tokens per forward pass (prompt chunk size)");
    cmd->add_option("--tp", tp, "Tensor-parallel ranks");
    cmd->add_option("--pp", pp, "Pipeline-parallel stages");
    cmd->add_option("--pp-layers", pp_layers, "Layers per pipeline stage, e.g. 20,20,21,19");
    cmd->add_option("--micro-batch", micro_batch, "Prompt tokens per pipeline micro-batch (0: --max-batch-tokens)");
    cmd->add_option("--comm-timeout", comm_timeout, "Seconds before a silent peer is declared dead");
    cmd->add_option("--device", device, "auto (CUDA when built with it and a GPU exists) | cpu | cuda")
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    cmd->add_option("--dtype", dtype, "CUDA activation type: f16 | bf16")->check(CLI::IsMember({"f16", "bf16"}));
    cmd->add_option("--devices", devices, "CUDA device of each local rank, e.g. 0,1,2,3 (default: local rank)");
}

std::vector<int32_t> parse_id_list(const std::string& s, const char* what) {
    std::vector<int32_t> ids;
    std::string tok;
    std::stringstream ss(s);
    auto flush = [&] {
        if (tok.empty()) return;
        size_t used = 0;
        long long v = 0;
        try {
            v = std::stoll(tok, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        LATTICE_CHECK(used == tok.size() && v >= 0 && v <= INT32_MAX, "{}: \"{}\" is not a token id", what, tok);
        ids.push_back(int32_t(v));
        tok.clear();
    };
    for (char c : s) {
        if (c == ',' || c == ' ' || c == '\t' || c == '\n') flush();
        else tok.push_back(c);
    }
    flush();
    return ids;
}

std::string default_model_path() {
    const char* kName = "SmolLM2-135M-Instruct.Q4_1.gguf";
    if (const char* env = std::getenv("LATTICE_DEFAULT_MODEL")) return env;
    for (const std::string& dir : {std::string("models"), std::string(LATTICE_SOURCE_DIR) + "/models"}) {
        std::string p = dir + "/" + kName;
        if (std::ifstream(p).good()) return p;
    }
    LATTICE_FAIL("no --model given and the built-in default model {} is not in ./models or {}/models: run "
                 "scripts/setup.sh (it fetches it) or pass --model",
                 kName, LATTICE_SOURCE_DIR);
}

namespace {

std::vector<int64_t> parse_counts(const std::string& s) {
    std::vector<int64_t> out;
    for (int32_t v : parse_id_list(s, "--pp-layers")) out.push_back(v);
    return out;
}

}  // namespace

Built load_model(const ModelArgs& a) {
    BuildOptions o;
    o.model.quant = parse_quant_mode(a.quant);
    o.model.quant_head = a.quant_head;
    o.model.smooth_path = a.smooth;
    o.model.max_seq = a.max_seq;
    o.model.max_batch_tokens = a.max_batch_tokens;
    o.model.slots = a.slots;
    if (!a.pp_layers.empty()) o.pp_layers = parse_counts(a.pp_layers);
    o.micro_batch = a.micro_batch;
    o.tp = a.tp;
    o.pp = a.pp;
    // MPI only when asked for several ranks or launched by an MPI starter: a plain single-process
    // run neither pays for nor depends on MPI initialization.
    o.mpi = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") || std::getenv("PMI_RANK");
#if defined(LATTICE_NO_MPI)
    // Without MPI every process would run alone: several started by mpirun would each do the whole job.
    if (const char* n = std::getenv("OMPI_COMM_WORLD_SIZE"); n && std::atoi(n) > 1)
        LATTICE_FAIL("started as one of {} MPI ranks, but this lattice was built without MPI: run it alone", n);
    o.mpi = false;
#endif
    o.comm_timeout = a.comm_timeout;
    o.backend.kind = parse_backend_kind(a.device);
    o.backend.threads = a.threads;
    o.backend.mlock = a.mlock;
    o.backend.cuda_act = a.dtype == "f16" ? DType::kF16 : DType::kBF16;
    if (!a.devices.empty())
        for (int32_t d : parse_id_list(a.devices, "--devices")) o.devices.push_back(d);
    o.on_context = [](const WorldConfig& w) {
        // When the launcher tears the job down because a rank died, say which one before exiting.
#if !defined(LATTICE_NO_MPI)
        if (w.world > 1) mpi_session().install_termination_reporter();
#endif
        if (w.rank != 0) set_log_level(LogLevel::kWarn);
    };
    ModelSpec spec{a.model, a.random_weights, a.config_preset, a.weight_seed};
    if (!a.random_weights) LATTICE_CHECK(!a.model.empty(), "--model is required (or --random-weights --config PRESET)");
    return build(o, spec);
}

}  // namespace lattice
