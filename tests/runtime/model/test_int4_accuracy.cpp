// 4-bit accuracy on the golden models, single rank: W4A16 and W4A8 logits (float weights quantized to 4-bit
// affine groups of 32 at load) against a float reference forward over the same dequantized weights
// (FakeInt4Source, fp32), within the tolerances the int8 tests use (test_quant_accuracy: W8A16 3e-2 / W8A8
// 5e-2, 1e-1 / 1.5e-1 for the ill-conditioned tiny-fp16-tied), and W4A16 much tighter (1e-4: it differs
// from the reference only in float summation order, so a wrong scale, group or nibble shows); the 4-bit
// rounding itself must be visible against the unquantized fp32 run. The distance to the float64 golden
// logits is reported. AWQ / GPTQ checkpoints against their NumPy-dequantized twins (tests/runtime/weights/data).
// Layouts (tp 2, pp 2): test_int4_layouts.cpp.
#include <doctest/doctest.h>

#include <algorithm>

#include "runtime/builder/build.h"
#include "tests/runtime/model/golden.h"
#include "tests/runtime/model/quant_test_util.h"

using namespace lattice;
using namespace lattice::testing;

TEST_CASE("golden models: W4A16 / W4A8 logits against a float forward over the dequantized 4-bit weights") {
    for (const auto& name : golden_models()) {
        CAPTURE(name);
        const bool ill = name == "tiny-fp16-tied";
        const double kMaxW16 = ill ? 1e-1 : 3e-2, kMaxW8 = ill ? 1.5e-1 : 5e-2;
        auto src = open_model(golden_dir(name));
        FakeInt4Source fq(open_model(golden_dir(name)));
        const auto cases = load_golden(name);
        REQUIRE(!cases.empty());
        std::vector<std::vector<int32_t>> prompts;
        for (const auto& c : cases) prompts.push_back(c.prompt);
        const auto ref = score_all(fq, quant_options(QuantMode::kNone), prompts);
        const auto f32 = score_all(*src, quant_options(QuantMode::kNone), prompts);
        const auto w16 = score_all(*src, quant_options(QuantMode::kW4A16), prompts);
        const auto w8 = score_all(*src, quant_options(QuantMode::kW4A8), prompts);
        double e16 = 0, e8 = 0, eq = 0, g16 = 0, g8 = 0;
        for (size_t i = 0; i < prompts.size(); ++i) {
            REQUIRE(w16[i].size() == ref[i].size());
            REQUIRE(w8[i].size() == ref[i].size());
            e16 = std::max(e16, rel_error(w16[i].data(), ref[i].data(), ref[i].size()));
            e8 = std::max(e8, rel_error(w8[i].data(), ref[i].data(), ref[i].size()));
            eq = std::max(eq, rel_error(ref[i].data(), f32[i].data(), f32[i].size()));
            g16 = std::max(g16, rel_error(w16[i].data(), cases[i].logits.data(), cases[i].logits.size()));
            g8 = std::max(g8, rel_error(w8[i].data(), cases[i].logits.data(), cases[i].logits.size()));
        }
        MESSAGE(name << ": worst relative logits error against the dequantized-weights reference: W4A16 " << e16
                     << ", W4A8 " << e8 << " (the reference's distance from fp32: " << eq
                     << "); against float64: W4A16 " << g16 << ", W4A8 " << g8);
        CHECK(e16 < kMaxW16);
        CHECK(e8 < kMaxW8);
        CHECK(e16 < 1e-4);
        CHECK(eq > 100 * e16);  // the 4-bit rounding happened, and W4A16 follows it
        CHECK(e8 > e16);        // W4A8 rounds the activations too
    }
}

TEST_CASE("AWQ / GPTQ checkpoints: W4A16 equals their NumPy-dequantized twin in fp32; auto picks W4A8") {
    // tests/runtime/weights/data (make_awq_gptq_fixtures.py): the 4-bit checkpoint and "-ref", the same weights
    // dequantized by NumPy into an ordinary f32 checkpoint. W4A16 runs the stored groups (GPTQ's act-order
    // through the activation permutation) and differs from the fp32 run only in float summation order.
    for (const char* model : {"tiny-awq", "tiny-gptq"}) {
        CAPTURE(model);
        const std::string dir = std::string(LATTICE_SOURCE_DIR) + "/tests/runtime/weights/data/" + model;
        auto src = open_model(dir);
        auto ref = open_model(dir + "-ref");
        const QuantChoice q = auto_quant(*src, false, QuantMode::kW4A8);
        CHECK(q.quant == QuantMode::kW4A8);
        CHECK(q.quant_head);
        const std::vector<std::vector<int32_t>> prompts = {random_ids(20, src->config().vocab, 7)};
        const auto want = score_all(*ref, quant_options(QuantMode::kNone), prompts)[0];
        const auto f32 = score_all(*src, quant_options(QuantMode::kNone), prompts)[0];  // dequantized on load
        const auto w16 = score_all(*src, quant_options(QuantMode::kW4A16), prompts)[0];
        const auto w8 = score_all(*src, quant_options(QuantMode::kW4A8), prompts)[0];
        const double e16 = rel_error(w16.data(), want.data(), want.size());
        const double e8 = rel_error(w8.data(), want.data(), want.size());
        MESSAGE(std::string(model) << ": against the NumPy-dequantized checkpoint in fp32: W4A16 " << e16 << ", W4A8 "
                                   << e8);
        CHECK(f32 == want);  // the float read dequantizes to the same f32 weights
        CHECK(e16 < 1e-5);
        CHECK(e8 < 5e-2);
        CHECK(e8 > e16);
    }
}
