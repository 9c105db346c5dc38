// The one builder: turns plain options into this rank's ready model and engine — the parallel
// context (MPI when there are several ranks), the backend (CPU or CUDA, bound to the rank's
// device), the device communicators (NCCL on GPUs, over the same ranks as the MPI groups), the
// model shard of this rank (TP slice, pipeline stage), its paged KV cache, and the engine with its
// pipeline links.
// KV cache size: --kv-cache-gb per rank when given; otherwise on GPUs 90% of the device memory
// left after the weights, on CPUs min(2 GiB, 10% of available memory) per rank (anonymous memory that
// becomes resident only as sequences fill it). Every rank takes the smallest block count of any
// rank, since the leader's block ids address every rank's cache.
// The CLI, the tests and the benchmarks all build through here, so there is one way a rank's
// model comes to be; the CLI's commands through load.h (the checks and the ranks' agreement before
// the build) and estimate.h (`lattice info`'s sizes without loading). This room (runtime/builder/) sits above the engine and the model and below
// launch/: nothing in runtime/ includes it. Nothing here reads argv or the environment: launch/ decides `mpi`, the
// device list and the rest, and passes them in.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/parallel_context.h"
#include "runtime/backend/make_backend.h"
#include "runtime/backend/sim/sim_device.h"
#include "runtime/engine/draft_model.h"
#include "runtime/engine/engine.h"
#include "runtime/model/model.h"
#include "runtime/weights/tensor_source.h"

namespace lattice {

// Where the weights come from.
struct ModelSpec {
    std::string path;      // HF directory, .gguf file or converted folder (the shape of random weights when no preset)
    bool random = false;   // fabricate weights of the shape (benchmarks, tests)
    std::string preset;    // built-in shape for random weights (runtime/arch/config.h presets)
    uint64_t seed = 1234;  // random weights' seed
    bool verify = false;   // converted folder: check the SHA-256 of this rank's file too (sizes always)
};
// Opens the checkpoint (or the random source) that `spec` names for world rank `world.rank`: a
// converted folder (`lattice convert`) maps only that rank's file and must hold world's layout.
// Throws Error naming the culprit.
std::unique_ptr<TensorSource> open_spec(const ModelSpec& spec, const WorldConfig& world = {});

// The default latency targets of a step that holds decodes (ms): a token every 250 ms reads as
// streaming on a CPU, where one 256-token prompt chunk beside the decodes of a 1B model takes
// seconds; GPUs step in tens of ms, and 50 ms keeps a stream smooth (20 tokens/s at least).
constexpr double kDefaultMaxItlMsCpu = 250;
constexpr double kDefaultMaxItlMsGpu = 50;

struct BuildOptions {
    ModelOptions model;              // quantization, KV sizes, batch limits; tp/pp fields are filled in here
    // Speculative decoding with a draft model (runtime/engine/draft_model.h): its checkpoint (empty path:
    // none), loaded on the leader only, on the CPU, quantized as --quant auto would; its drafts per step
    // are engine.speculative_tokens.
    ModelSpec draft;
    // Quantization follows the checkpoint: one already quantized (GGUF Q8_0/Q4_x) runs W8A8 with
    // the LM head quantized too, a converted one runs as converted, others keep model.quant /
    // quant_head. Without quant_auto a converted checkpoint's quantization must equal model.quant /
    // quant_head (an Error otherwise), and its stage split is taken when pp_layers is empty.
    bool quant_auto = false;
    std::vector<int64_t> pp_layers;  // layers per pipeline stage (empty: balanced)
    int64_t micro_batch = 0;         // tokens per engine step (0: max_batch_tokens)
    // Latency target of a step with decodes in it (EngineOptions::max_itl_s), in ms; -1: the device's
    // default (kDefaultMaxItlMsCpu / kDefaultMaxItlMsGpu), 0: none.
    double max_itl_ms = -1;
    EngineOptions engine;            // max sequences, prefix caching (kv_blocks is computed here)
    double kv_cache_gb = 0;          // KV cache per rank in GiB; 0: the default above
    int64_t kv_blocks = 0;           // exactly this many blocks instead (tests: forced preemption)
    int tp = 1, pp = 1;
    bool mpi = false;            // join an MPI job even at tp * pp == 1 (started by mpirun/srun)
    double comm_timeout = 60.0;  // seconds before a silent peer is an Error
    // Seconds the ranks wait for each other at start-up (at least comm_timeout): communicator creation and the
    // end of every rank's model load, where one host starting or reading its checkpoint later is not a
    // silent peer.
    double start_timeout = 600.0;
    bool comm_shared_memory = true;  // MPI groups within one machine exchange through shared memory
    BackendOptions backend;      // cuda_device is replaced by this rank's device
    // backend.kind == kSim: the simulated device (runtime/backend/sim/sim_device.h). The model is
    // shape-only; the KV cache (bookkeeping only) holds every sequence at full context unless
    // kv_blocks says otherwise.
    SimDeviceOptions sim;
    std::vector<int> devices;    // CUDA ordinal per local rank (empty: the local rank)
    // Called once the rank grid exists, before any weight is read (launch/ installs its
    // termination reporter and log level here).
    std::function<void(const WorldConfig&)> on_context;
};

// Everything one rank runs with, owned together: its place in the world, backend, communicators,
// model shard (with its KV cache) and engine. Destroyed in reverse order of declaration: engine and
// model, then the device communicators (they use the backend's stream), the MPI groups under them,
// and the backend last.
struct RankRuntime {
    WorldConfig world;
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Communicator> world_comm;
    std::unique_ptr<Communicator> plans_comm;  // the leader's step plans (ParallelContext::plans)
    std::vector<std::unique_ptr<Communicator>> host_groups;  // MPI groups under device communicators
    std::unique_ptr<Communicator> tp_comm;
    std::unique_ptr<Communicator> pp_comm;
    std::unique_ptr<Model> model;
    // The draft model's (leader, speculative decoding with BuildOptions::draft): declared before the
    // engine, which holds its proposer, so they outlive it.
    std::unique_ptr<Backend> draft_backend;
    std::unique_ptr<Model> draft_model;
    std::unique_ptr<Engine> draft_engine;
    std::unique_ptr<DraftModel> draft;
    std::unique_ptr<Engine> engine;
    double load_seconds = 0;  // parallel context to ready engine
    std::vector<int64_t> checkpoint_bytes_read;  // per world rank: checkpoint tensor bytes it read
};

// From an open source (tests, tools that already hold one).
RankRuntime build(const BuildOptions& opt, const TensorSource& src);
// From a spec: the source is opened after the parallel context exists and dropped once the
// weights are in the backend's memory (the file mappings go with it).
RankRuntime build(const BuildOptions& opt, const ModelSpec& spec);

// True when the checkpoint's linear weights are quantized (GGUF block types; AWQ, GPTQ).
bool checkpoint_is_quantized(const TensorSource& src);
// True when most of them (by weights, over every layer's linears) are 4-bit (GGUF Q4_0, Q4_1, Q4_K; AWQ, GPTQ:
// TensorInfo::int4_group): a llama.cpp Q4_K_M file stores some attn_v / ffn_down layers (layer 0's among them)
// in Q6_K, so no single tensor decides.
bool checkpoint_is_4bit(const TensorSource& src);
// --quant auto, the one rule (the builder, `lattice info` and `lattice convert` ask it): a 4-bit
// checkpoint runs in `int4_mode`, the 4-bit mode of the device's kernels, its blocks kept as they are:
// W4A8 on the CPU (rather than W4A16: on the CPU it streams the weights at the memory's rate while W4A16
// is compute-bound, and its NLL on the built-in model is within 0.05 nats of f32, test_smollm_nll), W4A16
// on CUDA (its 4-bit kernels dequantize against f16/bf16 activations; cuda_backend_int4.cpp); kNone where
// there are no 4-bit kernels (the simulated device; `lattice convert`, which writes no 4-bit files): there,
// and for any other block-quantized checkpoint, W8A8. Quantized checkpoints get a quantized LM
// head (8-bit unless the file holds it in 4). Any other checkpoint runs unquantized, its LM head quantized
// only when `quant_head` asks (which then changes nothing).
struct QuantChoice {
    QuantMode quant = QuantMode::kNone;
    bool quant_head = false;
};
QuantChoice auto_quant(const TensorSource& src, bool quant_head, QuantMode int4_mode);
// The 4-bit mode a backend runs (auto_quant's int4_mode): kW4A8 on the CPU, kW4A16 on CUDA, else kNone.
QuantMode int4_mode_for(BackendKind kind);

// KV blocks for this rank from the options and the model (before the world-wide minimum).
// Never more than max_seqs sequences of the full context can use.
int64_t kv_blocks_for(const Model& model, const Backend& backend, double kv_cache_gb, int64_t max_seqs);

// A single-rank model on a backend of its own, built without a parallel context or KV cache
// (`lattice calibrate`'s float forward): Error naming the checkpoint when it does not fit the options.
// Declared backend first, so the model goes first.
struct LocalModel {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Model> model;
};
LocalModel make_local_model(const TensorSource& src, const BackendOptions& backend, const ModelOptions& opt);

// A single-rank engine over a model built by hand (tests, calibration): allocates the KV cache with
// the default budget (or kv_cache_gb) when the model has none.
std::unique_ptr<Engine> make_local_engine(Model& model, const EngineOptions& opt = {}, double kv_cache_gb = 0);

// This rank's pipeline links, from its context. (Its ModelOptions: rank_model_options of
// runtime/model/rank_weights.h, which the converter shares.)
PipelineLinks rank_pipeline_links(const ParallelContext& ctx);

}  // namespace lattice
