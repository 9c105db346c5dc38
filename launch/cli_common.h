// Options shared by every command that loads a model (generate, score, calibrate, serve ...) and
// the code that turns them into a backend + model + parallel layout for this rank.
#pragma once

#include "runtime/engine/build.h"

#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

namespace lattice {

struct ModelArgs {
    std::string model;
    std::string config_preset;  // --config NAME with --random-weights
    bool random_weights = false;
    uint64_t weight_seed = 1234;
    std::string quant = "auto";
    bool quant_head = false;
    std::string smooth;  // SmoothQuant factor file from `lattice calibrate`
    int threads = 0;
    bool mlock = false;
    int64_t max_seq = 0;
    int64_t max_batch_tokens = 256;
    int tp = 1, pp = 1;
    std::string pp_layers;  // "20,20,21,19"
    int64_t micro_batch = 0;
    double comm_timeout = 60.0;
    double kv_cache_gb = 0;       // 0: the builder's default (runtime/engine/build.h)
    int64_t max_seqs = 64;
    int64_t block_size = 16;
    bool no_prefix_cache = false;
    std::string device = "auto";  // auto | cpu | cuda
    std::string dtype = "bf16";   // CUDA activations: f16 | bf16
    std::string devices;          // CUDA ordinals per local rank, e.g. 0,1,2,3

    void add_to(CLI::App* cmd);
};

// Builds this rank's model from the options (runtime/engine/build.h); MPI joins when tp * pp > 1 or
// when an MPI starter launched this process (read from the environment here, in launch/).
Built load_model(const ModelArgs& a);

// The built-in default model (SmolLM2-135M-Instruct Q4_1, fetched by scripts/setup.sh into models/):
// $LATTICE_DEFAULT_MODEL, else ./models/..., else <source tree>/models/...; Error if none exists.
std::string default_model_path();

// "1,2,3" or "1 2 3" -> ids; throws Error naming the bad entry.
std::vector<int32_t> parse_id_list(const std::string& s, const char* what);

}  // namespace lattice
