// Test helpers for the LoRA fixtures of tests/runtime/model/lora (written by make_lora_fixtures.py): the
// bases, their adapters and the float64 reference logits of each base with each adapter merged in.
#pragma once

#include "runtime/builder/build.h"
#include "runtime/engine/client.h"
#include "runtime/weights/safetensors.h"
#include "tests/runtime/model/golden.h"
#include "tests/test_build.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

namespace lattice::testing {

inline std::string lora_dir(const std::string& base) {
    return std::string(LATTICE_SOURCE_DIR) + "/tests/runtime/model/lora/" + base;
}
// The base checkpoint: tiny-llama2 from the shared golden models, tp3-base from the fixtures.
inline std::string lora_base_path(const std::string& base) {
    return base == "tp3-base" ? lora_dir(base) : golden_dir(base);
}
inline const std::vector<std::string>& lora_adapters() {
    static const std::vector<std::string> a = {"a4", "b16", "c8"};
    return a;
}

struct LoraCases {
    std::vector<std::vector<int32_t>> prompts;
    SafetensorsFile expected;
    explicit LoraCases(const std::string& base) : expected(lora_dir(base) + "/expected.safetensors") {
        std::ifstream f(lora_dir(base) + "/expected.json");
        prompts = nlohmann::json::parse(f)["prompts"].get<std::vector<std::vector<int32_t>>>();
    }
    // "base" or an adapter's name; case i.
    std::vector<float> logits(const std::string& who, size_t i) const {
        const SafetensorsEntry* e = expected.find(who + ".case" + std::to_string(i));
        REQUIRE(e != nullptr);
        const float* p = reinterpret_cast<const float*>(expected.bytes(*e));
        return std::vector<float>(p, p + (e->end - e->begin) / 4);
    }
};

// Registers every fixture adapter of `base` on the leader (a no-op elsewhere).
inline void add_fixture_adapters(Engine& engine, const std::string& base) {
    if (!engine.is_leader()) return;
    for (const std::string& a : lora_adapters()) engine.loras().add(a, lora_dir(base) + "/" + a);
}

// The greedy tokens of `prompt` under adapter `lora` ("" = the base), n of them, EOS ignored.
inline std::vector<int32_t> lora_greedy(EngineClient& c, const std::vector<int32_t>& prompt, const std::string& lora,
                                        int n) {
    ClientRequest r;
    r.prompt = prompt;
    r.max_tokens = n;
    r.ignore_eos = true;
    r.lora = lora;
    return c.run({r})[0].tokens;
}

}  // namespace lattice::testing
