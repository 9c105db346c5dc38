// The one builder: turns plain options into this rank's ready model and generator — the parallel
// context (MPI when there are several ranks), the backend (CPU or CUDA, bound to the rank's
// device), the device communicators (NCCL on GPUs, over the same ranks as the MPI groups), the
// model shard of this rank (TP slice, pipeline stage) and the generator with its pipeline links.
// The CLI, the tests and the benchmarks all build through here, so there is one way a rank's
// model comes to be. Nothing here reads argv or the environment: launch/ decides `mpi`, the
// device list and the rest, and passes them in.
#pragma once

#include "parallel/parallel_context.h"
#include "runtime/backend/make_backend.h"
#include "runtime/engine/generator.h"
#include "runtime/model/model.h"
#include "runtime/weights/tensor_source.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace lattice {

// Where the weights come from.
struct ModelSpec {
    std::string path;           // HF directory or .gguf file (the shape of random weights when no preset)
    bool random = false;        // fabricate weights of the shape (benchmarks, tests)
    std::string preset;         // built-in shape for random weights (runtime/model/config.h presets)
    uint64_t seed = 1234;       // random weights' seed
};
// Opens the checkpoint (or the random source) that `spec` names; throws Error naming the culprit.
std::unique_ptr<TensorSource> open_spec(const ModelSpec& spec);

struct BuildOptions {
    ModelOptions model;              // quantization, KV sizes, batch limits; tp/pp fields are filled in here
    std::vector<int64_t> pp_layers;  // layers per pipeline stage (empty: balanced)
    int64_t micro_batch = 0;         // prompt tokens per pipeline micro-batch (0: max_batch_tokens)
    int tp = 1, pp = 1;
    bool mpi = false;                // join an MPI job even at tp * pp == 1 (started by mpirun/srun)
    double comm_timeout = 60.0;      // seconds before a silent peer is an Error
    BackendOptions backend;          // cuda_device is replaced by this rank's device
    std::vector<int> devices;        // CUDA ordinal per local rank (empty: the local rank)
    // Called once the rank grid exists, before any weight is read (launch/ installs its
    // termination reporter and log level here).
    std::function<void(const WorldConfig&)> on_context;
};

// This rank's share of a built model, owned together. Destroyed in reverse order of declaration:
// generator and model, then the device communicators (they use the backend's stream), the MPI
// groups under them, and the backend last.
struct Built {
    WorldConfig world;
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Communicator> world_comm;
    std::vector<std::unique_ptr<Communicator>> host_groups;  // MPI groups under device communicators
    std::unique_ptr<Communicator> tp_comm;
    std::unique_ptr<Communicator> pp_comm;
    std::unique_ptr<Model> model;
    std::unique_ptr<Generator> generator;
    double load_seconds = 0;  // parallel context to ready generator
};

// From an open source (tests, tools that already hold one).
Built build(const BuildOptions& opt, const TensorSource& src);
// From a spec: the source is opened after the parallel context exists and dropped once the
// weights are in the backend's memory (the file mappings go with it).
Built build(const BuildOptions& opt, const ModelSpec& spec);

// This rank's ModelOptions (TP shard, pipeline stage layers) and pipeline links, from its context.
ModelOptions rank_model_options(ModelOptions base, const ParallelContext& ctx, int64_t n_layers,
                                const std::vector<int64_t>& pp_layer_counts = {});
PipelineLinks rank_pipeline_links(const ParallelContext& ctx);

}  // namespace lattice
