// Test helpers for the golden models in $LATTICE_SHARED_DIR/golden (see its README):
// expected greedy tokens (expected.json) and float64-reference logits (expected.safetensors).
#pragma once

#include "runtime/backend/cpu/cpu_backend.h"
#include "runtime/builder/build.h"
#include "runtime/model/model.h"
#include "runtime/weights/safetensors.h"
#include "runtime/weights/tensor_source.h"
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

}  // namespace lattice::testing
