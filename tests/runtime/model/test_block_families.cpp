// The families assembled from the shared blocks beyond Llama's skeleton (runtime/model/blocks.cpp): Qwen3
// (QK-norm, a window shorter than the prompts, head_dim != hidden / heads), Gemma 2 ((1 + w) norms,
// embedding scale, GeGLU, sandwich norms, query_pre_attn_scalar, alternating windows, attention and
// final-logit soft-caps that bind), Gemma 3 (5:1 local / global layers, local rope base, linear rope
// scaling on the global layers, QK-norm), Phi-3 (fused qkv_proj / gate_up_proj split at load, so tp 2 reads
// each rank's rows of every part; a window in every layer; LongRoPE's long factors and attention factor
// past original_max_position_embeddings) and Qwen3-MoE (8 experts top 3, norm_topk_prob). Each fixture
// (tests/runtime/model/families/<name>, scripts/make_block_family_fixtures.py: a float64 NumPy forward
// written from transformers' modeling code) at 1 rank, tp 2 and pp 2 (mpirun -np 2): the logits of every
// prompt position within 1e-5 relative of the reference and every greedy token; W8A16 and W8A8 at 1 rank
// near it (the int8 paths run these blocks too).
#include <doctest/doctest.h>

#include "parallel/mpi_session.h"
#include "runtime/builder/build.h"
#include "runtime/engine/client.h"
#include "tests/runtime/model/golden.h"
#include "tests/test_build.h"

using namespace lattice;
using namespace lattice::testing;

namespace {

const std::vector<std::string>& block_families() {
    static const std::vector<std::string> m = {"families/qwen3", "families/gemma2", "families/gemma3",
                                               "families/phi3", "families/phi3-longrope",
                                               "families/qwen3-moe"};
    return m;
}

struct Run {
    int rank = 0;
    std::vector<float> logits;
    std::vector<int32_t> tokens;
};

Run run(const TensorSource& src, int tp, int pp, QuantMode q, const GoldenCase& c) {
    BuildOptions opt = test::cpu_options(1, tp, pp);
    opt.model.quant = q;
    RankRuntime rt = build(opt, src);
    Run r;
    r.rank = rt.world.rank;
    r.logits = EngineClient(*rt.engine, nullptr, true).score(c.prompt);
    r.tokens = EngineClient(*rt.engine, nullptr, true)
                   .generate(GenerateRequest{c.prompt, int64_t(c.greedy.size()), 0, {}, true, {}})
                   .tokens;
    return r;
}

}  // namespace

TEST_CASE("block families: 1 rank, tp 2 and pp 2 equal the float64 reference") {
    REQUIRE(mpi_session().size() == 2);
    for (const auto& name : block_families()) {
        auto src = open_model(golden_dir(name));
        for (const auto& c : load_golden(name)) {
            for (const auto& layout : {std::pair{1, 1}, std::pair{2, 1}, std::pair{1, 2}}) {
                CAPTURE(name);
                CAPTURE(layout.first);
                CAPTURE(layout.second);
                if (layout.first * layout.second == 1 && mpi_session().rank() != 0) continue;
                const Run r = run(*src, layout.first, layout.second, QuantMode::kNone, c);
                CHECK(r.tokens == c.greedy);  // every rank agrees on every token
                if (r.rank != 0) continue;     // logits are delivered to world rank 0
                REQUIRE(r.logits.size() == c.logits.size());
                CHECK(rel_error(r.logits.data(), c.logits.data(), c.logits.size()) < 1e-5);
            }
        }
    }
}

TEST_CASE("block families: W8A16 and W8A8 at 1 rank stay near the reference") {
    if (mpi_session().rank() != 0) return;
    for (const auto& name : block_families()) {
        auto src = open_model(golden_dir(name));
        const GoldenCase c = load_golden(name).front();
        for (QuantMode q : {QuantMode::kW8A16, QuantMode::kW8A8}) {
            CAPTURE(name);
            CAPTURE(quant_mode_name(q));
            const Run r = run(*src, 1, 1, q, c);
            REQUIRE(r.logits.size() == c.logits.size());
            const double e = rel_error(r.logits.data(), c.logits.data(), c.logits.size());
            CHECK(e > 0);  // quantized: not the float path by accident
            CHECK(e < 5e-2);
        }
    }
}
