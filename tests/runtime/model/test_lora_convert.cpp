// `lattice convert --lora` (runtime/converter/lora_merge.h) on one rank: a fixture adapter (PEFT, or its GGUF
// LoRA twin into the GGUF base) merged into a float conversion gives the logits of the float64 merged NumPy reference (make_lora_fixtures.py) and of the
// unmerged adapter at run time within 1e-5; merged before INT8 quantization, it errs against the reference
// no more than the quantized base does against its own, and its next greedy tokens are the float adapted
// model's as often as those of the unmerged adapter on the same quantized base are; an adapter of another base is refused by name and leaves no folder.
// (tp / pp conversions: test_lora_layouts.cpp.)
#include <doctest/doctest.h>

#include "parallel/communicator.h"
#include "runtime/converter/convert.h"
#include "tests/runtime/model/lora_test_util.h"
#include "tests/runtime/model/quant_test_util.h"
#include "tests/test_temp_dir.h"

#include <filesystem>

using namespace lattice;
using namespace lattice::testing;

namespace {

RankRuntime build_from(const std::string& path, QuantMode quant, bool with_adapters, const std::string& base) {
    BuildOptions opt = test::cpu_options(1);
    opt.model.max_batch_tokens = 64;
    opt.model.quant = quant;
    opt.engine.max_lora_rank = 16;
    ModelSpec spec;
    spec.path = path;
    RankRuntime rt = build(opt, spec);
    if (with_adapters) add_fixture_adapters(*rt.engine, base);
    return rt;
}

void convert_merged(const std::string& base, const std::string& adapter, const std::string& out, QuantMode q,
                    const std::string& base_path = "", const std::string& adapter_path = "", double scale = 1.0) {
    auto src = open_model(base_path.empty() ? lora_base_path(base) : base_path);
    ConvertOptions o;
    o.out = out;
    o.quant = q;
    o.lora_path = adapter_path.empty() ? lora_dir(base) + "/" + adapter : adapter_path;
    o.lora_scale = scale;
    LocalComm alone;
    convert_checkpoint(*src, o, alone);
}

}  // namespace

TEST_CASE("LoRA: convert --lora to f32 equals the float64 merged reference and the unmerged adapter") {
    TempDir tmp("lattice_lora_convert");
    // b16: all seven targets, rsLoRA, F16 file; c8 of tp3-base: four targets, BF16 file, plain alpha / r; then
    // llama.cpp's GGUF twin of b16 merged into the GGUF copy of tiny-llama2 (both with q/k rows in RoPE-pair
    // order in their files), and b16 at --lora-scale 0 (the base).
    struct Case {
        std::string base, adapter, base_path, adapter_path, expect;
        double scale = 1.0;
    };
    const std::string gguf_base = std::string(LATTICE_SHARED_DIR) + "/golden/gguf/tiny-llama2.f32.gguf";
    const std::vector<Case> cases_run = {{"tiny-llama2", "b16", "", "", "b16"},
                                         {"tp3-base", "c8", "", "", "c8"},
                                         {"tiny-llama2", "b16", gguf_base, lora_dir("tiny-llama2") + "/b16.gguf", "b16"},
                                         {"tiny-llama2", "b16", "", "", "base", 0.0}};
    for (size_t k = 0; k < cases_run.size(); ++k) {
        const Case& c = cases_run[k];
        CAPTURE(k);
        const std::string out = tmp / ("c" + std::to_string(k));
        convert_merged(c.base, c.adapter, out, QuantMode::kNone, c.base_path, c.adapter_path, c.scale);
        RankRuntime merged = build_from(out, QuantMode::kNone, false, c.base);
        RankRuntime unmerged = build_from(lora_base_path(c.base), QuantMode::kNone, true, c.base);
        EngineClient m(*merged.engine, nullptr, true), u(*unmerged.engine, nullptr, true);
        const LoraCases cases(c.base);
        for (size_t i = 0; i < cases.prompts.size(); ++i) {
            CAPTURE(i);
            const std::vector<float> ref = cases.logits(c.expect, i), ref_base = cases.logits("base", i);
            const std::vector<float> got = m.score(cases.prompts[i]);
            const std::vector<float> run = u.score(cases.prompts[i], c.expect == "base" ? "" : c.adapter);
            REQUIRE(got.size() == ref.size());
            const double err = rel_error(got.data(), ref.data(), ref.size());
            MESSAGE(c.base << " + " << c.adapter << " merged (case " << k << "), prompt " << i << ": rel err " << err);
            CHECK(err < 1e-5);
            CHECK(rel_error(got.data(), run.data(), run.size()) < 1e-5);
            if (c.expect != "base") CHECK(rel_error(got.data(), ref_base.data(), ref.size()) > 1e-2);  // it is in
        }
    }
}

TEST_CASE("LoRA: convert --lora merges before INT8 quantization, within the quantized base's tolerance") {
    // Merged then quantized differs from the quantized base plus the f32 adapter by rounding only: against the
    // float64 merged reference it errs as the quantized base errs against its own, and its greedy token after
    // each of 32 prompts is the float model's with the adapter as often as the quantized base's with the adapter
    // unmerged is (within 2 prompts). (Continuations are not compared: on this tiny random model one flipped
    // near-tie sends a sequence elsewhere, for the unmerged adapter as for the merged one.)
    TempDir tmp("lattice_lora_convert");
    const LoraCases cases("tiny-llama2");
    RankRuntime q_rt = build_from(lora_base_path("tiny-llama2"), QuantMode::kW8A8, true, "tiny-llama2");
    RankRuntime f_rt = build_from(lora_base_path("tiny-llama2"), QuantMode::kNone, true, "tiny-llama2");
    EngineClient q(*q_rt.engine, nullptr, true), f(*f_rt.engine, nullptr, true);
    const std::vector<float> ref_base = cases.logits("base", 0);
    const std::vector<float> got_base = q.score(cases.prompts[0]);
    const double e_base = rel_error(got_base.data(), ref_base.data(), ref_base.size());
    const auto agreement = [](EngineClient& a, const std::string& la, EngineClient& b, const std::string& lb) {
        size_t same = 0;
        for (uint32_t seed = 0; seed < 32; ++seed) {
            const std::vector<int32_t> prompt = random_ids(6, 320, 200 + seed);
            const std::vector<int32_t> x = lora_greedy(a, prompt, la, 1), y = lora_greedy(b, prompt, lb, 1);
            same += x[0] == y[0];
        }
        return same;
    };
    for (const std::string adapter : {"a4", "b16"}) {
        CAPTURE(adapter);
        const std::string out = tmp / adapter;
        convert_merged("tiny-llama2", adapter, out, QuantMode::kW8A8);
        RankRuntime merged = build_from(out, QuantMode::kW8A8, false, "tiny-llama2");
        EngineClient m(*merged.engine, nullptr, true);
        const std::vector<float> ref = cases.logits(adapter, 0), got = m.score(cases.prompts[0]);
        const double e = rel_error(got.data(), ref.data(), ref.size());
        MESSAGE("w8a8 + " << adapter << " merged: rel err " << e << " (base " << e_base << ")");
        CHECK(e < 1.5 * e_base);
        const size_t agree = agreement(m, "", f, adapter), unmerged = agreement(q, adapter, f, adapter);
        MESSAGE("first greedy tokens agreeing with the float model + " << adapter << ": merged w8a8 " << agree
                                                                  << ", unmerged on w8a8 " << unmerged);
        CHECK(agree + 2 >= unmerged);
        CHECK(agreement(m, "", f, "") < agree);  // the merged model follows the adapter, not the base
    }
}

TEST_CASE("LoRA: convert --lora refuses an adapter of another base by name, leaving no folder") {
    TempDir tmp("lattice_lora_convert");
    const std::string out = tmp / "wrong";
    auto src = open_model(lora_base_path("tiny-llama2"));
    ConvertOptions o;
    o.out = out;
    o.lora_path = lora_dir("tp3-base") + "/a4";
    LocalComm alone;
    CHECK_THROWS_WITH_AS(convert_checkpoint(*src, o, alone), doctest::Contains("adapter 'a4'"), Error);
    CHECK_THROWS_WITH_AS(convert_checkpoint(*src, o, alone), doctest::Contains("another base"), Error);
    CHECK(!std::filesystem::exists(out));
    CHECK(std::distance(std::filesystem::directory_iterator(tmp.path), std::filesystem::directory_iterator{}) == 0);
}
