// Test helpers for the golden models in $LATTICE_SHARED_DIR/golden (see its README):
// expected greedy tokens (expected.json) and float64-reference logits (expected.safetensors), the lists of
// models the tests run over (golden_models(), block_family_models()), and one golden case run through a
// built rank (run_case: at a layout, scored and generated greedy).
#pragma once

#include "runtime/backend/cpu/cpu_backend.h"
#include "runtime/builder/build.h"
#include "runtime/engine/client.h"
#include "runtime/model/model.h"
#include "runtime/weights/safetensors.h"
#include "runtime/weights/tensor_source.h"
#include "tests/test_build.h"
#include "tests/test_paths.h"

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

namespace lattice::testing {

// "families/<name>": the repository's own fixtures of the non-Llama families
// (tests/runtime/model/families, written by scripts/make_family_fixtures.py in the same format, with a
// model.gguf of the same weights where the family has a GGUF form); other names:
// $LATTICE_SHARED_DIR/golden/<name>.
inline std::string golden_dir(const std::string& model) {
    if (model.rfind("families/", 0) == 0) return test::source_dir() + "/tests/runtime/model/" + model;
    return test::shared_dir() + "/golden/" + model;
}
inline const std::vector<std::string>& family_models() {
    static const std::vector<std::string> m = {"families/qwen2", "families/qwen2-swa", "families/mistral",
                                                "families/mixtral"};
    return m;
}
// Every golden model: the shared Llama ones and the families' (the tests of the forward, layouts,
// quantization, SmoothQuant and conversion run over all of them).
inline const std::vector<std::string>& golden_models() {
    static const std::vector<std::string> m = {"tiny-llama2", "tiny-gqa-llama3", "tiny-fp16-tied", "families/qwen2",
                                               "families/qwen2-swa", "families/mistral", "families/mixtral"};
    return m;
}
// The families assembled from the shared blocks beyond Llama's skeleton (Qwen3, Gemma 2, Gemma 3, Phi-3 with
// and without LongRoPE, Qwen3-MoE; test_block_families.cpp says what each fixture exercises).
inline const std::vector<std::string>& block_family_models() {
    static const std::vector<std::string> m = {"families/qwen3", "families/gemma2",       "families/gemma3",
                                               "families/phi3",  "families/phi3-longrope", "families/qwen3-moe"};
    return m;
}

struct GoldenCase {
    std::vector<int32_t> prompt;
    std::vector<int32_t> greedy;
    std::vector<float> logits;  // [prompt.size(), vocab]
};

inline std::vector<GoldenCase> load_golden(const std::string& model) {
    std::ifstream f(golden_dir(model) + "/expected.json");
    nlohmann::json j = nlohmann::json::parse(f);
    SafetensorsFile st(golden_dir(model) + "/expected.safetensors");
    std::vector<GoldenCase> cases;
    for (size_t i = 0; i < j["cases"].size(); ++i) {
        GoldenCase c;
        c.prompt = j["cases"][i]["prompt_ids"].get<std::vector<int32_t>>();
        c.greedy = j["cases"][i]["greedy_ids"].get<std::vector<int32_t>>();
        const SafetensorsEntry* e = st.find("case" + std::to_string(i) + ".logits");
        if (e) {
            const float* p = reinterpret_cast<const float*>(st.bytes(*e));
            c.logits.assign(p, p + (e->end - e->begin) / 4);
        }
        cases.push_back(std::move(c));
    }
    return cases;
}

// ||a - b|| / ||b||
inline double rel_error(const float* a, const float* b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        double d = double(a[i]) - double(b[i]);
        num += d * d;
        den += double(b[i]) * double(b[i]);
    }
    return std::sqrt(num / (den > 0 ? den : 1));
}

// Where `run`'s greedy tokens after c.prompt first differ from the reference's c.greedy, judged by the logits
// of `ref` (an engine of the default precision) at that step: the margin of the reference's token over run's and
// the row's largest |logit|. step -1: they never differ.
struct Divergence {
    int64_t step = -1;
    double margin = 0, span = 0;
};
inline Divergence greedy_divergence(Engine& run, Engine& ref, const GoldenCase& c, int64_t V) {
    GenerateRequest req;
    req.prompt = c.prompt;
    req.max_new_tokens = int64_t(c.greedy.size());
    req.ignore_eos = true;
    const std::vector<int32_t> got = run.generate(req).tokens;
    const std::vector<int32_t>& want = c.greedy;
    REQUIRE(got.size() == want.size());
    Divergence d;
    size_t i = 0;
    while (i < got.size() && got[i] == want[i]) ++i;
    if (i == got.size()) return d;
    std::vector<int32_t> prefix = c.prompt;
    prefix.insert(prefix.end(), want.begin(), want.begin() + ptrdiff_t(i));
    const std::vector<float> logits = ref.score(prefix);
    const float* row = logits.data() + (prefix.size() - 1) * size_t(V);
    d.step = int64_t(i);
    d.margin = double(row[want[i]]) - double(row[got[i]]);
    for (int64_t v = 0; v < V; ++v) d.span = std::max(d.span, std::fabs(double(row[v])));
    return d;
}

// Loads `path` (HF directory or GGUF) on the CPU backend and checks every case: logits of every
// prompt position within 1e-4 relative of the reference, and every greedy token.
inline void check_golden_model(const std::string& path, const std::vector<GoldenCase>& cases, int threads,
                               int64_t batch_tokens) {
    REQUIRE(!cases.empty());
    auto src = open_model(path);
    CpuBackend be(CpuBackendOptions{threads, false, false});
    ModelOptions mo;
    mo.max_batch_tokens = batch_tokens;
    Model model(*src, be, mo, nullptr);
    auto gen = make_local_engine(model);
    const int64_t V = src->config().vocab;
    for (size_t ci = 0; ci < cases.size(); ++ci) {
        const GoldenCase& c = cases[ci];
        CAPTURE(path);
        CAPTURE(ci);
        std::vector<float> logits = gen->score(c.prompt);
        REQUIRE(c.logits.size() == c.prompt.size() * size_t(V));
        REQUIRE(logits.size() == c.logits.size());
        CHECK(rel_error(logits.data(), c.logits.data(), logits.size()) < 1e-4);
        GenerateRequest req;
        req.prompt = c.prompt;
        req.max_new_tokens = int64_t(c.greedy.size());
        req.ignore_eos = true;
        CHECK(gen->generate(req).tokens == c.greedy);
    }
}

// What one rank saw of a golden case: its world rank, the prompt's logits (delivered to world rank 0) and
// the greedy tokens (every rank).
struct CaseRun {
    int rank = 0;
    std::vector<float> logits;
    std::vector<int32_t> tokens;
};

// Builds `src` on the CPU backend (1 thread) at tp x pp with weights in `quant`, scores c.prompt and
// generates c.greedy.size() tokens greedy (EOS ignored). Under MPI every rank of the layout calls it.
inline CaseRun run_case(const TensorSource& src, int tp, int pp, const GoldenCase& c,
                        QuantMode quant = QuantMode::kNone) {
    BuildOptions opt = test::cpu_options(1, tp, pp);
    opt.model.quant = quant;
    RankRuntime rt = build(opt, src);
    CaseRun r;
    r.rank = rt.world.rank;
    r.logits = EngineClient(*rt.engine, nullptr, true).score(c.prompt);
    r.tokens = EngineClient(*rt.engine, nullptr, true)
                   .generate(GenerateRequest{c.prompt, int64_t(c.greedy.size()), 0, {}, true, {}})
                   .tokens;
    return r;
}

}  // namespace lattice::testing
