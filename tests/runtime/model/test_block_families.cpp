// The families assembled from the shared blocks beyond Llama's skeleton (runtime/model/blocks.cpp): Qwen3
// (QK-norm, a window shorter than the prompts, head_dim != hidden / heads), Gemma 2 ((1 + w) norms,
// embedding scale, GeGLU, sandwich norms, query_pre_attn_scalar, alternating windows, attention and
// final-logit soft-caps that bind), Gemma 3 (5:1 local / global layers, local rope base, linear rope
// scaling on the global layers, QK-norm, one kv head: replicated under tp), Phi-3 (fused qkv_proj /
// gate_up_proj split at load, so each tp rank reads its rows of every part; a window in every layer;
// LongRoPE's long factors and attention factor past original_max_position_embeddings) and Qwen3-MoE
// (8 experts top 3, norm_topk_prob, duplicated router rows: exact ties at the top-k boundary). Each fixture
// (tests/runtime/model/families/<name>, scripts/make_block_family_fixtures.py: the float64 NumPy forward
// of scripts/numpy_forward.py, written from transformers' modeling code) has 12 or 6 query heads, 6, 1
// or 6 kv heads and sizes that tp 2 and tp 3 both divide. Under mpirun -np 2 (test_block_families_np2):
// 1 rank, tp 2 and pp 2; under -np 3 (test_block_families_np3, the same binary): tp 3. Each: the logits
// of every prompt position within 1e-5 relative of the reference and every greedy token; where the fixture
// has router ties (ties.safetensors: the logits under the opposite tie rule), far from the other rule's
// logits, so every rank broke every tie to the lower expert index. W8A16 and W8A8 at 1 rank near the
// reference (the int8 paths run these blocks too; -np 2 only); W4A16 within 1e-4 of an fp32 run over the
// same dequantized 4-bit weights and W4A8 near it (-np 2 only).
#include <doctest/doctest.h>

#include "parallel/mpi_session.h"
#include "tests/runtime/model/golden.h"
#include "tests/runtime/model/quant_test_util.h"

#include <cstring>
#include <fstream>

using namespace lattice;
using namespace lattice::testing;

namespace {

// The logits of case i under the tie rule lattice does not take (the higher expert index first), where
// the fixture has exact router ties (ties.safetensors); empty otherwise.
std::vector<float> other_tie_rule_logits(const std::string& name, size_t i) {
    const std::string path = golden_dir(name) + "/ties.safetensors";
    if (!std::ifstream(path)) return {};
    SafetensorsFile st(path);
    const SafetensorsEntry* e = st.find("case" + std::to_string(i) + ".logits");
    REQUIRE(e != nullptr);
    const float* p = reinterpret_cast<const float*>(st.bytes(*e));
    return std::vector<float>(p, p + (e->end - e->begin) / 4);
}

// The layouts of this world size: 1 rank, tp 2 and pp 2 under -np 2; tp 3 under -np 3.
std::vector<std::pair<int, int>> layouts(int world) {
    if (world == 2) return {{1, 1}, {2, 1}, {1, 2}};
    return {{world, 1}};
}

}  // namespace

TEST_CASE("block families: 1 rank, tp 2, pp 2 and tp 3 equal the float64 reference") {
    const int world = mpi_session().size();
    REQUIRE((world == 2 || world == 3));
    int tie_checks = 0;
    for (const auto& name : block_family_models()) {
        auto src = open_model(golden_dir(name));
        const std::vector<GoldenCase> cases = load_golden(name);
        for (size_t i = 0; i < cases.size(); ++i) {
            const GoldenCase& c = cases[i];
            const std::vector<float> other_rule = other_tie_rule_logits(name, i);
            for (const auto& layout : layouts(world)) {
                CAPTURE(name);
                CAPTURE(i);
                CAPTURE(layout.first);
                CAPTURE(layout.second);
                if (layout.first * layout.second == 1 && mpi_session().rank() != 0) continue;
                const CaseRun r = run_case(*src, layout.first, layout.second, c);
                CHECK(r.tokens == c.greedy);  // every rank agrees on every token
                if (r.rank != 0) continue;     // logits are delivered to world rank 0
                REQUIRE(r.logits.size() == c.logits.size());
                CHECK(rel_error(r.logits.data(), c.logits.data(), c.logits.size()) < 1e-5);
                if (other_rule.empty()) continue;
                REQUIRE(other_rule.size() == c.logits.size());
                CHECK(rel_error(r.logits.data(), other_rule.data(), other_rule.size()) > 1e-3);
                ++tie_checks;
            }
        }
    }
    if (mpi_session().rank() == 0) CHECK(tie_checks > 0);  // the Qwen3-MoE fixture's ties were checked
}

TEST_CASE("block families: the Qwen3-MoE fixture ties experts exactly at the top-k boundary") {
    // Its router rows duplicated in the checkpoint (expert b's row is expert a's in each layer), and the
    // reference saw ties straddle the top-k boundary in every prompt (expected.json).
    if (mpi_session().rank() != 0) return;
    std::ifstream f(golden_dir("families/qwen3-moe") + "/expected.json");
    const nlohmann::json j = nlohmann::json::parse(f);
    CHECK(j.at("tie_rule").get<std::string>() == "lower expert index first");
    for (const auto& n : j.at("boundary_ties")) CHECK(n.get<int>() > 0);
    SafetensorsFile st(golden_dir("families/qwen3-moe") + "/model.safetensors");
    int pairs = 0;
    for (const auto& t : j.at("router_ties")) {
        const int64_t layer = t[0], a = t[1], b = t[2];
        const SafetensorsEntry* e = st.find("model.layers." + std::to_string(layer) + ".mlp.gate.weight");
        REQUIRE(e != nullptr);
        REQUIRE(e->shape.size() == 2);
        const int64_t row = e->shape[1] * 2;  // F16 bytes
        CHECK(std::memcmp(st.bytes(*e) + a * row, st.bytes(*e) + b * row, size_t(row)) == 0);
        CHECK(a != b);
        ++pairs;
    }
    CHECK(pairs == 2);
}

TEST_CASE("block families: W8A16 and W8A8 at 1 rank stay near the reference") {
    if (mpi_session().size() != 2 || mpi_session().rank() != 0) return;
    for (const auto& name : block_family_models()) {
        auto src = open_model(golden_dir(name));
        const GoldenCase c = load_golden(name).front();
        for (QuantMode q : {QuantMode::kW8A16, QuantMode::kW8A8}) {
            CAPTURE(name);
            CAPTURE(quant_mode_name(q));
            const CaseRun r = run_case(*src, 1, 1, c, q);
            REQUIRE(r.logits.size() == c.logits.size());
            const double e = rel_error(r.logits.data(), c.logits.data(), c.logits.size());
            MESSAGE(name << " " << quant_mode_name(q) << ": rel err " << e);
            CHECK(e > 0);  // quantized: not the float path by accident
            CHECK(e < 5e-2);
        }
    }
}

TEST_CASE("block families: W4A16 / W4A8 against a float forward over the dequantized 4-bit weights") {
    // As the golden models' 4-bit test (test_int4_accuracy.cpp): W4A16 differs from an fp32 run over the
    // same dequantized weights (FakeInt4Source) only in summation order, so a family's projection read with
    // the wrong rows, groups or fused part shows; W4A8 rounds the activations too.
    if (mpi_session().size() != 2 || mpi_session().rank() != 0) return;
    for (const auto& name : block_family_models()) {
        CAPTURE(name);
        auto src = open_model(golden_dir(name));
        FakeInt4Source fq(open_model(golden_dir(name)));
        const std::vector<std::vector<int32_t>> prompts = {load_golden(name).front().prompt};
        const auto ref = score_all(fq, quant_options(QuantMode::kNone), prompts)[0];
        const auto f32 = score_all(*src, quant_options(QuantMode::kNone), prompts)[0];
        const auto w16 = score_all(*src, quant_options(QuantMode::kW4A16), prompts)[0];
        const auto w8 = score_all(*src, quant_options(QuantMode::kW4A8), prompts)[0];
        REQUIRE(w16.size() == ref.size());
        REQUIRE(w8.size() == ref.size());
        const double e16 = rel_error(w16.data(), ref.data(), ref.size());
        const double e8 = rel_error(w8.data(), ref.data(), ref.size());
        const double eq = rel_error(ref.data(), f32.data(), f32.size());
        MESSAGE(name << ": against the dequantized-weights reference: W4A16 " << e16 << ", W4A8 " << e8
                     << " (the reference's distance from fp32: " << eq << ")");
        CHECK(e16 < 1e-4);
        CHECK(eq > 100 * e16);  // the 4-bit rounding happened, and W4A16 follows it
        CHECK(e8 > e16);        // W4A8 rounds the activations too
        CHECK(e8 < 5e-2);
    }
}
