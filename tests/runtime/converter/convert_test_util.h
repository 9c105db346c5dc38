// Test helpers for converted checkpoints: the golden checkpoints in both formats, temporary
// folders, random SmoothQuant factor files, and a run (logits of every prompt position + greedy
// tokens) of a built engine.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "runtime/builder/build.h"
#include "runtime/converter/convert.h"
#include "runtime/model/smoothquant.h"
#include "tests/runtime/model/golden.h"
#include "tests/test_build.h"
#include "tests/test_temp_dir.h"

namespace lattice::testing {

namespace fs = std::filesystem;

// The golden models as HF folders and as their GGUF copies.
inline std::vector<std::string> golden_checkpoints() {
    std::vector<std::string> out;
    for (const auto& m : golden_models()) out.push_back(golden_dir(m));
    for (const char* g : {"tiny-llama2.f32.gguf", "tiny-gqa-llama3.f16.gguf", "tiny-fp16-tied.f16.gguf"})
        out.push_back(std::string(LATTICE_SHARED_DIR) + "/golden/gguf/" + g);
    return out;
}

// golden_checkpoints() for the multi-rank layouts: without families/mistral and families/qwen2-swa,
// whose converted files hold Llama's and qwen2's tensors (only their configs' windows are new, and
// test_convert round-trips those on one rank): the sanitizer build's test_convert_layouts_np4 is the
// longest of its stage. (Mixtral stays: its experts are sharded tensors of their own.)
inline std::vector<std::string> layout_checkpoints() {
    std::vector<std::string> out;
    for (const std::string& p : golden_checkpoints())
        if (p.find("families/mistral") == std::string::npos && p.find("families/qwen2-swa") == std::string::npos)
            out.push_back(p);
    return out;
}

// Golden name ("tiny-llama2") of a checkpoint path of golden_checkpoints(): the longest that the path
// names ("families/qwen2-swa", not its prefix "families/qwen2").
inline std::string golden_name_of(const std::string& path) {
    std::string best;
    for (const auto& m : golden_models())
        if (path.find("/" + m) != std::string::npos && m.size() > best.size()) best = m;
    return best;
}


// Factors in [0.5, 2] for every layer, written as `lattice calibrate` writes them.
inline void write_random_smooth(const ModelConfig& c, const std::string& path, uint32_t seed) {
    SmoothFactors f;
    f.hidden = c.hidden;
    f.layer_begin = 0;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(0.5f, 2.0f);
    for (int64_t l = 0; l < c.n_layers; ++l) {
        f.attn.emplace_back(size_t(c.hidden));
        f.mlp.emplace_back(size_t(c.hidden));
        for (auto& x : f.attn.back()) x = u(rng);
        for (auto& x : f.mlp.back()) x = u(rng);
    }
    write_smooth_factors(path, f);
}

struct RunResult {
    std::vector<float> logits;  // world rank 0 (the leader) only
    std::vector<int32_t> tokens;
    int64_t weight_bytes = 0;
    std::vector<int64_t> bytes_read;
};

// tests/test_build.h's options with the layout's MPI flag, quantization and factors.
inline BuildOptions cpu_options(int tp, int pp, bool mpi, QuantMode q, const std::string& smooth = {}) {
    BuildOptions opt = test::cpu_options(1, tp, pp);
    opt.mpi = mpi;
    opt.comm_timeout = 60.0;
    opt.model.quant = q;
    opt.model.smooth_path = smooth;
    return opt;
}

inline RunResult run_built(RankRuntime rt, const std::vector<int32_t>& prompt, int64_t n_new) {
    RunResult r;
    r.logits = rt.engine->score(prompt);
    r.tokens = rt.engine->generate(GenerateRequest{prompt, n_new, 0, {}, true, {}}).tokens;
    r.weight_bytes = rt.model->weight_bytes();
    r.bytes_read = rt.checkpoint_bytes_read;
    return r;
}

inline ModelSpec spec_of(const std::string& path, bool verify = false) {
    ModelSpec s;
    s.path = path;
    s.verify = verify;
    return s;
}

// Bit-identical: not merely close.
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace lattice::testing
