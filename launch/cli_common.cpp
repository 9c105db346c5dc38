// Shared model-loading options and setup (see cli_common.h).
#include "launch/cli_common.h"

#include "parallel/mpi_session.h"
#include "parallel/parallel_context.h"
#include "runtime/base/log.h"
#include "runtime/cpu_backend.h"
#include "runtime/engine.h"
#include "runtime/cuda_backend_factory.h"
#include "runtime/random_source.h"

#if defined(LATTICE_HAVE_CUDA) && defined(LATTICE_HAVE_NCCL)
#include "parallel/cuda/nccl_comm.h"
#include "parallel/mpi_comm.h"
#include "runtime/cuda/cuda_backend.h"
#endif

#include <chrono>
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

// On GPUs the tensor-parallel and pipeline groups move device memory: NCCL over the same ranks as
// the MPI group (which stays alive underneath, in `keep`). Groups of one rank stay LocalComm.
std::unique_ptr<Communicator> device_group(std::unique_ptr<Communicator> host, Backend& be, int device,
                                           const char* name, double timeout,
                                           std::vector<std::unique_ptr<Communicator>>& keep) {
#if defined(LATTICE_HAVE_CUDA) && defined(LATTICE_HAVE_NCCL)
    auto* mpi = dynamic_cast<MpiComm*>(host.get());
    if (be.device() != Device::kCuda || mpi == nullptr) return host;
    auto nccl = std::make_unique<NcclComm>(mpi->handle(), static_cast<CudaBackend&>(be).stream(), device, name, timeout);
    keep.push_back(std::move(host));
    return nccl;
#else
    LATTICE_CHECK(be.device() != Device::kCuda || host->size() == 1,
                  "{} group of {} ranks on CUDA needs NCCL, which this build lacks", name, host->size());
    return host;
#endif
}

std::unique_ptr<Backend> make_backend(const ModelArgs& a, const WorldConfig& w, int* threads) {
    std::string dev = a.device;
    if (dev == "auto") dev = cuda_device_count() > 0 ? "cuda" : "cpu";
    if (dev == "cuda") {
        std::vector<int> devs;
        if (!a.devices.empty())
            for (int32_t d : parse_id_list(a.devices, "--devices")) devs.push_back(d);
        const int device = w.device(devs);
        const int count = cuda_device_count();
        LATTICE_CHECK(device < count, "{}: CUDA device {} requested but {} visible", w.describe(), device, count);
        process_identity().device = device;
        *threads = 1;
        return make_cuda_backend(device, a.dtype == "f16" ? DType::kF16 : DType::kBF16);
    }
    CpuBackendOptions bo;
    bo.threads = a.threads;
    bo.mlock = a.mlock;
    auto cpu = std::make_unique<CpuBackend>(bo);
    *threads = cpu->pool().size();
    return cpu;
}

std::vector<int64_t> parse_counts(const std::string& s) {
    std::vector<int64_t> out;
    for (int32_t v : parse_id_list(s, "--pp-layers")) out.push_back(v);
    return out;
}
}  // namespace

LoadedModel load_model(const ModelArgs& a) {
    LoadedModel lm;
    auto t0 = std::chrono::steady_clock::now();
    // MPI only when asked for several ranks or launched by an MPI starter: a plain single-process
    // run neither pays for nor depends on MPI initialization.
    const bool under_mpi = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") || std::getenv("PMI_RANK");
    ParallelContext ctx = (a.tp * a.pp > 1 || under_mpi) ? make_parallel_context(a.tp, a.pp, a.comm_timeout)
                                                         : make_local_context();
    // When the launcher tears the job down because a rank died, say which one before exiting.
    if (ctx.world.world > 1) mpi_session().install_termination_reporter();
    lm.world_rank = ctx.world.rank;
    lm.world_size = ctx.world.world;
    if (lm.world_rank != 0) set_log_level(LogLevel::kWarn);
    std::unique_ptr<TensorSource> src;
    if (a.random_weights) {
        ModelConfig cfg;
        if (!a.config_preset.empty()) cfg = preset_config(a.config_preset);
        else if (!a.model.empty()) cfg = open_model(a.model)->config();
        else LATTICE_FAIL("--random-weights needs --config PRESET or --model PATH for the shape");
        src = make_random_source(cfg, a.weight_seed);
    } else {
        LATTICE_CHECK(!a.model.empty(), "--model is required (or --random-weights --config PRESET)");
        src = open_model(a.model);
    }
    lm.backend = make_backend(a, ctx.world, &lm.threads);
    ctx.tp = device_group(std::move(ctx.tp), *lm.backend, process_identity().device, "tp", a.comm_timeout, lm.host_groups);
    ctx.pp_world =
        device_group(std::move(ctx.pp_world), *lm.backend, process_identity().device, "pp", a.comm_timeout, lm.host_groups);
    ModelOptions mo;
    mo.quant = parse_quant_mode(a.quant);
    mo.quant_head = a.quant_head;
    mo.smooth_path = a.smooth;
    mo.max_seq = a.max_seq;
    mo.max_batch_tokens = a.max_batch_tokens;
    mo.slots = a.slots;
    mo = rank_model_options(mo, ctx, src->config().n_layers,
                            a.pp_layers.empty() ? std::vector<int64_t>{} : parse_counts(a.pp_layers));
    lm.model = std::make_unique<Model>(*src, *lm.backend, mo, ctx.tp.get());
    src.reset();  // drop the file mappings: weights now live in the backend's memory
    PipelineLinks links = rank_pipeline_links(ctx);
    lm.generator = std::make_unique<Generator>(*lm.model, links, a.micro_batch);
    lm.tp_comm = std::move(ctx.tp);
    lm.pp_comm = std::move(ctx.pp_world);
    lm.world_comm = std::move(ctx.world_comm);
    lm.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    LOG_INFO("{}: loaded {} on {} in {:.2f} s ({:.1f} MiB of weights on this rank, quant {})",
             ctx.world.describe(), a.random_weights ? "random weights" : a.model, lm.backend->name(), lm.load_seconds,
             double(lm.model->weight_bytes()) / (1 << 20), a.quant);
    return lm;
}

}  // namespace lattice
