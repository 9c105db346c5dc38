// Every TP x PP layout that fits this world size against the single-rank result, on every golden
// model whose heads allow the layout: identical greedy tokens, logits within 1e-5 relative, with
// one micro-batch and with many (1 token each); plus vocab padding (vocab % tp != 0, random
// weights), tp > kv heads, and layout errors that every rank reports without hanging.
// Run under mpirun -np 2 and -np 4 (CTest).
#include "../runtime/golden.h"

#include "parallel/mpi_session.h"
#include "parallel/parallel_context.h"
#include "runtime/cpu_backend.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "runtime/random_source.h"

#include <doctest/doctest.h>

#include <mpi.h>

using namespace lattice;
using namespace lattice::testing;

namespace {

struct Result {
    std::vector<float> logits;
    std::vector<int32_t> tokens;
};

Result run_single(const TensorSource& src, const std::vector<int32_t>& prompt, int64_t n_new) {
    CpuBackend be(CpuBackendOptions{1, false, false});
    Model m(src, be, ModelOptions{}, nullptr);
    Generator g(m);
    Result r;
    r.logits = g.score(prompt);
    r.tokens = g.generate(GenerateRequest{prompt, n_new, {}, true, {}}).tokens;
    return r;
}

Result run_layout(const TensorSource& src, ParallelContext& ctx, const std::vector<int32_t>& prompt, int64_t n_new,
                  int64_t micro) {
    CpuBackend be(CpuBackendOptions{1, false, false});
    ModelOptions mo = rank_model_options(ModelOptions{}, ctx, src.config().n_layers);
    Model m(src, be, mo, ctx.tp.get());
    Generator g(m, rank_pipeline_links(ctx), micro);
    Result r;
    r.logits = g.score(prompt);
    r.tokens = g.generate(GenerateRequest{prompt, n_new, {}, true, {}}).tokens;
    return r;
}

bool heads_allow(const ModelConfig& c, int tp) {
    if (c.n_heads % tp || c.intermediate % tp) return false;
    return tp <= c.n_kv_heads ? c.n_kv_heads % tp == 0 : tp % c.n_kv_heads == 0;
}

std::vector<std::pair<int, int>> layouts_for(int world) {
    std::vector<std::pair<int, int>> out;
    for (int tp : {1, 2, 4})
        for (int pp : {1, 2, 4})
            if (tp * pp == world) out.emplace_back(tp, pp);
    return out;
}

void compare(const Result& got, const Result& want, int world_rank) {
    if (world_rank == 0) {  // logits are delivered to world rank 0
        REQUIRE(got.logits.size() == want.logits.size());
        CHECK(rel_error(got.logits.data(), want.logits.data(), want.logits.size()) < 1e-5);
    }
    CHECK(got.tokens == want.tokens);  // every rank agrees on every token
}

}  // namespace

TEST_CASE("golden models: every layout equals the single-rank run") {
    const int world = mpi_session().size();
    for (auto [tp, pp] : layouts_for(world)) {
        for (const auto& name : golden_models()) {
            auto src = open_model(golden_dir(name));
            if (!heads_allow(src->config(), tp) || src->config().n_layers < pp) continue;
            CAPTURE(name);
            CAPTURE(tp);
            CAPTURE(pp);
            ParallelContext ctx = make_parallel_context(tp, pp, 30.0);
            for (const auto& c : load_golden(name)) {
                Result want = run_single(*src, c.prompt, 24);
                CHECK(want.tokens == c.greedy);
                for (int64_t micro : {int64_t(0), int64_t(1), int64_t(3)}) {
                    CAPTURE(micro);
                    compare(run_layout(*src, ctx, c.prompt, 24, micro), want, ctx.world.rank);
                }
            }
        }
    }
}

TEST_CASE("vocab padding: vocab % tp != 0 (random weights), padded logits never produced") {
    const int world = mpi_session().size();
    ModelConfig cfg;
    cfg.source = "test";
    cfg.hidden = 64;
    cfg.intermediate = 96;
    cfg.n_layers = 4;
    cfg.n_heads = 4;
    cfg.n_kv_heads = 1;  // tp > kv heads for tp >= 2: replicated kv head
    cfg.head_dim = 16;
    cfg.vocab = 301;  // prime: padding on every tp > 1
    cfg.max_position = 128;
    cfg.eos_ids = {2};
    auto src = make_random_source(cfg, 7, DType::kF32);
    const std::vector<int32_t> prompt = {1, 17, 300, 42, 99, 250, 3};
    Result want = run_single(*src, prompt, 12);
    for (auto [tp, pp] : layouts_for(world)) {
        CAPTURE(tp);
        CAPTURE(pp);
        ParallelContext ctx = make_parallel_context(tp, pp, 30.0);
        Result got = run_layout(*src, ctx, prompt, 12, 2);
        compare(got, want, ctx.world.rank);
        for (int32_t t : got.tokens) CHECK(t < cfg.vocab);
    }
}

TEST_CASE("layout errors are reported by every rank, with the same message, without a hang") {
    const int world = mpi_session().size();
    std::string msg;
    try {
        make_parallel_context(world + 1, 1, 5.0);
    } catch (const Error& e) {
        msg = e.what();
    }
    CHECK(msg.find("world size") != std::string::npos);
    // A tp the model's heads do not allow: every rank throws while loading, naming the field.
    if (world >= 2) {
        auto src = open_model(golden_dir("tiny-fp16-tied"));  // 6 heads, 2 kv heads
        ParallelContext ctx = make_parallel_context(world, 1, 5.0);
        if (6 % world != 0) {
            CpuBackend be(CpuBackendOptions{1, false, false});
            ModelOptions mo = rank_model_options(ModelOptions{}, ctx, src->config().n_layers);
            std::string e;
            try {
                Model m(*src, be, mo, ctx.tp.get());
            } catch (const Error& err) {
                e = err.what();
            }
            CHECK(e.find("does not divide num_attention_heads 6") != std::string::npos);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);  // everyone got here: nobody hung
}

TEST_CASE("several sequences in flight (pipelined decode) equal their single-sequence runs") {
    const int world = mpi_session().size();
    auto src = open_model(golden_dir("tiny-gqa-llama3"));
    auto cases = load_golden("tiny-gqa-llama3");
    REQUIRE(cases.size() >= 2);
    // Three sequences of different prompt lengths; the second stops early on a stop id, the third
    // generates fewer tokens.
    std::vector<GenerateRequest> reqs = {{cases[0].prompt, 24, {}, true, {}},
                                         {cases[1].prompt, 24, {}, false, {cases[1].greedy[5]}},
                                         {std::vector<int32_t>{7, 8, 9, 10, 11}, 9, {}, true, {}}};
    std::vector<std::vector<int32_t>> want;
    {
        CpuBackend be(CpuBackendOptions{1, false, false});
        Model m(*src, be, ModelOptions{}, nullptr);
        Generator g(m);
        for (const auto& r : reqs) want.push_back(g.generate(r).tokens);
    }
    CHECK(want[0] == cases[0].greedy);
    CHECK(want[1].size() <= 6);  // stopped at the stop id
    CHECK(want[1].back() == cases[1].greedy[5]);
    CHECK(want[2].size() == 9);
    for (auto [tp, pp] : layouts_for(world)) {
        if (!heads_allow(src->config(), tp)) continue;
        CAPTURE(tp);
        CAPTURE(pp);
        ParallelContext ctx = make_parallel_context(tp, pp, 30.0);
        CpuBackend be(CpuBackendOptions{1, false, false});
        ModelOptions mo = rank_model_options(ModelOptions{}, ctx, src->config().n_layers);
        mo.slots = 3;
        Model m(*src, be, mo, ctx.tp.get());
        Generator g(m, rank_pipeline_links(ctx), 2);
        GenerateStats st;
        std::vector<GenerateResult> got = g.generate_batch(reqs, {}, &st);
        for (size_t i = 0; i < reqs.size(); ++i) CHECK(got[i].tokens == want[i]);
        CHECK(st.generated_tokens == int64_t(want[0].size() + want[1].size() + want[2].size()));
        CHECK(st.sequences == 3);
    }
}
