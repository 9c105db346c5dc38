// Every TP x PP layout that fits this world size against the single-rank result, on every golden
// model whose heads allow the layout: identical greedy tokens, logits within 1e-5 relative, with
// one micro-batch and with many (1 token each); plus vocab padding (vocab % tp != 0, random
// weights), tp > kv heads, and layout errors that every rank reports without hanging. At -np 4 the
// golden cases rotate over the micro-batch sizes (each layout and model still runs all three): the
// whole product took 116-167 s on a loaded CI machine, where 4 ranks share 2 cores and every hand-off
// between ranks waits for a scheduler slice.
// Structured output: a grammar's mask (made by the leader, carried in the plan) followed by the
// sampler rank of every layout, with the single rank's tokens.
// Top logprobs (sampling.logprobs = k) through every layout, with backend token selection on (rows
// that ask for them fall back to the host path): the k best of a host log-softmax of score()'s row.
// Speculative decoding (prompt lookup, 4 drafts): the single rank's greedy tokens in every layout.
// Start-up: a rank whose load ends seconds after the others' is waited for (BuildOptions::start_timeout).
// Run under mpirun -np 2 and -np 4 (CTest).
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <regex>
#include <thread>

#include "parallel/mpi_session.h"
#include "runtime/builder/build.h"
#include "runtime/engine/client.h"
#include "runtime/engine/grammar.h"
#include "runtime/weights/random_source.h"
#include "tests/runtime/model/golden.h"
#include "tests/test_build.h"

using namespace lattice;
using namespace lattice::testing;

namespace {

struct Result {
    std::vector<float> logits;
    std::vector<int32_t> tokens;
};

BuildOptions layout_options(int tp, int pp, int64_t micro = 0) {
    BuildOptions opt = test::cpu_options(1, tp, pp);
    opt.mpi = true;
    opt.micro_batch = micro;
    return opt;
}

Result run_layout(const TensorSource& src, int tp, int pp, const std::vector<int32_t>& prompt, int64_t n_new,
                  int64_t micro, int* world_rank = nullptr) {
    RankRuntime rt = build(layout_options(tp, pp, micro), src);
    if (world_rank) *world_rank = rt.world.rank;
    Result r;
    r.logits = EngineClient(*rt.engine, nullptr, true).score(prompt);
    r.tokens = EngineClient(*rt.engine, nullptr, true).generate(GenerateRequest{prompt, n_new, 0, {}, true, {}}).tokens;
    return r;
}

// The single-rank reference: the same build, one rank, no MPI.
Result run_single(const TensorSource& src, const std::vector<int32_t>& prompt, int64_t n_new) {
    BuildOptions opt = layout_options(1, 1);
    opt.mpi = false;
    RankRuntime rt = build(opt, src);
    Result r;
    r.logits = EngineClient(*rt.engine, nullptr, true).score(prompt);
    r.tokens = EngineClient(*rt.engine, nullptr, true).generate(GenerateRequest{prompt, n_new, 0, {}, true, {}}).tokens;
    return r;
}

// Each request alone on one rank, no MPI: its tokens.
std::vector<std::vector<int32_t>> single_rank_tokens(const TensorSource& src, const std::vector<GenerateRequest>& reqs,
                                                     bool prefix_caching) {
    BuildOptions opt = layout_options(1, 1);
    opt.mpi = false;
    opt.engine.prefix_caching = prefix_caching;
    RankRuntime rt = build(opt, src);
    std::vector<std::vector<int32_t>> out;
    for (const auto& r : reqs) out.push_back(EngineClient(*rt.engine, nullptr, true).generate(r).tokens);
    return out;
}

// The layout rules' verdict (parallel/world_config.h), not a copy of them.
bool layout_fits(const ModelConfig& c, int tp, int pp) {
    try {
        check_model_layout(c.dims(), tp, pp);
        return true;
    } catch (const Error&) {
        return false;
    }
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
    const std::vector<int64_t> micros = {0, 1, 3};
    const std::vector<std::pair<int, int>> layouts = layouts_for(world);
    for (size_t li = 0; li < layouts.size(); ++li) {
        const int tp = layouts[li].first, pp = layouts[li].second;
        for (const auto& name : golden_models()) {
            auto src = open_model(golden_dir(name));
            if (!layout_fits(src->config(), tp, pp)) continue;
            CAPTURE(name);
            CAPTURE(tp);
            CAPTURE(pp);
            const std::vector<GoldenCase> cases = load_golden(name);
            for (size_t ci = 0; ci < cases.size(); ++ci) {
                const GoldenCase& c = cases[ci];
                Result want = run_single(*src, c.prompt, 24);
                CHECK(want.tokens == c.greedy);
                for (size_t mi = 0; mi < micros.size(); ++mi) {
                    // -np 2: every case at every micro-batch size. -np 4 (three layouts, 4 ranks on 2 cores):
                    // the sizes rotate over the cases, so each (layout, model) still runs all three.
                    if (world > 2 && mi != (li + ci) % micros.size()) continue;
                    const int64_t micro = micros[mi];
                    CAPTURE(micro);
                    int rank = 0;
                    Result got = run_layout(*src, tp, pp, c.prompt, 24, micro, &rank);
                    compare(got, want, rank);
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
    for (const auto& layout : layouts_for(world)) {
        const int tp = layout.first, pp = layout.second;
        CAPTURE(tp);
        CAPTURE(pp);
        int rank = 0;
        Result got = run_layout(*src, tp, pp, prompt, 12, 2, &rank);
        compare(got, want, rank);
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
        if (6 % world != 0) {
            std::string e;
            try {
                RankRuntime rt = build(layout_options(world, 1), *src);
            } catch (const Error& err) {
                e = err.what();
            }
            CHECK(e.find("does not divide num_attention_heads 6") != std::string::npos);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);  // everyone got here: nobody hung
}

TEST_CASE("start-up: a rank that finishes loading seconds after the others is waited for, not timed out") {
    // Rank 1 starts its load 3 s late (on_context runs after the communicators exist, before the weights):
    // the ranks' first meeting after their loads is under start_timeout, so six per-call deadlines of lag pass.
    const int world = mpi_session().size();
    ModelConfig cfg = test::tiny_config("late loader");
    cfg.n_layers = 4;  // a stage per rank at -np 2 and 4
    auto src = make_random_source(cfg, 3, DType::kF32);
    BuildOptions opt = layout_options(1, world);
    opt.comm_timeout = 0.5;
    opt.start_timeout = 60.0;
    opt.on_context = [](const WorldConfig& w) {
        if (w.rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(3000));
    };
    if (world >= 2) {
        std::string err;
        try {
            RankRuntime rt = build(opt, *src);
            CHECK(rt.engine);
        } catch (const Error& e) {
            err = e.what();
        }
        CHECK(err == "");
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("several sequences in flight (pipelined decode) equal their single-sequence runs") {
    const int world = mpi_session().size();
    auto src = open_model(golden_dir("tiny-gqa-llama3"));
    auto cases = load_golden("tiny-gqa-llama3");
    REQUIRE(cases.size() >= 2);
    // Three sequences of different prompt lengths; the second stops early on a stop id, the third
    // generates fewer tokens.
    std::vector<GenerateRequest> reqs = {{cases[0].prompt, 24, 0, {}, true, {}},
                                         {cases[1].prompt, 24, 0, {}, false, {cases[1].greedy[5]}},
                                         {std::vector<int32_t>{7, 8, 9, 10, 11}, 9, 0, {}, true, {}}};
    const std::vector<std::vector<int32_t>> want = single_rank_tokens(*src, reqs, true);
    CHECK(want[0] == cases[0].greedy);
    CHECK(want[1].size() <= 6);  // stopped at the stop id
    CHECK(want[1].back() == cases[1].greedy[5]);
    CHECK(want[2].size() == 9);
    for (const auto& layout : layouts_for(world)) {
        const int tp = layout.first, pp = layout.second;
        if (!layout_fits(src->config(), tp, pp)) continue;
        CAPTURE(tp);
        CAPTURE(pp);
        RankRuntime rt = build(layout_options(tp, pp, 2), *src);
        GenerateStats st;
        std::vector<GenerateResult> got = EngineClient(*rt.engine, nullptr, true).generate_batch(reqs, {}, &st);
        for (size_t i = 0; i < reqs.size(); ++i) CHECK(got[i].tokens == want[i]);
        CHECK(st.generated_tokens == int64_t(want[0].size() + want[1].size() + want[2].size()));
        CHECK(st.sequences == 3);
    }
}

TEST_CASE("speculative decoding (prompt lookup) in every layout: the single rank's greedy tokens") {
    const int world = mpi_session().size();
    // This model's greedy continuations run the same token many times over: prompt lookup drafts them.
    auto src = open_model(golden_dir("tiny-fp16-tied"));
    const auto cases = load_golden("tiny-fp16-tied");
    const std::vector<GenerateRequest> reqs = {{cases[1].prompt, 24, 0, {}, true, {}},
                                               {cases[0].prompt, 24, 0, {}, true, {}}};
    const std::vector<std::vector<int32_t>> want = single_rank_tokens(*src, reqs, true);
    CHECK(want[0] == cases[1].greedy);
    int ran = 0;
    for (const auto& layout : layouts_for(world)) {
        const int tp = layout.first, pp = layout.second;
        if (!layout_fits(src->config(), tp, pp)) continue;
        CAPTURE(tp);
        CAPTURE(pp);
        BuildOptions opt = layout_options(tp, pp);
        opt.engine.speculative_tokens = 4;
        RankRuntime rt = build(opt, *src);
        GenerateStats st;
        const std::vector<GenerateResult> got = EngineClient(*rt.engine, nullptr, true).generate_batch(reqs, {}, &st);
        for (size_t i = 0; i < reqs.size(); ++i) CHECK(got[i].tokens == want[i]);
        CHECK(st.drafted_tokens > 0);  // every rank learns the leader's counts
        CHECK(st.accepted_tokens > 0);
        ++ran;
    }
    CHECK(ran > 0);
}

TEST_CASE("the per-step breakdown: every rank's, parts that sum to its wall time, in the right places") {
    const int world = mpi_session().size();
    auto src = open_model(golden_dir("tiny-gqa-llama3"));
    const std::vector<GenerateRequest> reqs = {{{5, 9, 14, 3, 77, 21}, 12, 0, {}, true, {}}, {{7, 8, 9}, 8, 0, {}, true, {}}};
    for (const auto& layout : layouts_for(world)) {
        const int tp = layout.first, pp = layout.second;
        if (!layout_fits(src->config(), tp, pp)) continue;
        CAPTURE(tp);
        CAPTURE(pp);
        RankRuntime rt = build(layout_options(tp, pp), *src);
        GenerateStats st;
        EngineClient(*rt.engine, nullptr, true).generate_batch(reqs, {}, &st);
        REQUIRE(st.per_rank.size() == size_t(world));  // every rank holds every rank's
        const int sampler = rt.world.rank_of(0, pp - 1);
        for (int r = 0; r < world; ++r) {
            const StepBreakdown& x = st.per_rank[size_t(r)];
            CAPTURE(r);
            const WorldConfig w = WorldConfig::make(world, tp, pp, r);
            CHECK(x.rank == r);
            CHECK(x.tp_rank == w.tp_rank());
            CHECK(x.pp_rank == w.pp_rank());
            CHECK(x.steps > 0);
            for (double v : {x.compute, x.communication, x.pipeline_bubble, x.sampling, x.host_overhead}) CHECK(v >= 0);
            CHECK(x.compute > 0);
            const double sum = x.compute + x.communication + x.pipeline_bubble + x.sampling + x.host_overhead;
            CHECK(sum == doctest::Approx(x.wall).epsilon(1e-6));
            // only the TP group's collectives count as communication; only the sampler samples
            if (tp == 1) CHECK(x.communication == 0);
            if (tp > 1) CHECK(x.communication > 0);
            if (r == sampler) CHECK(x.sampling > 0);
            if (r != sampler) CHECK(x.sampling == 0);
            // with stages, every rank waits on one: the leader for tokens, the others for activations
            if (pp > 1) CHECK(x.pipeline_bubble > 0);
            // only the leader sends plans; the time it waited to is part of its host overhead
            CHECK(x.plan_wait >= 0);
            CHECK(x.plan_wait <= x.host_overhead + 1e-6);
            CHECK(x.plan_blocked >= 0);
            CHECK(x.plan_blocked <= x.plan_wait + 1e-6);
            CHECK((x.plan_bytes > 0) == (r == 0));
        }
    }
}

TEST_CASE("16 mixed sequences with preemption and prefix hits: every layout equals one rank") {
    const int world = mpi_session().size();
    auto src = open_model(golden_dir("tiny-gqa-llama3"));
    const int64_t vocab = src->config().vocab;
    std::vector<GenerateRequest> reqs;
    std::vector<int32_t> shared = {5, 9, 14, 3, 77, 21, 8, 40, 41, 42, 43, 44, 45, 46, 47, 48};
    for (int i = 0; i < 16; ++i) {
        GenerateRequest r;
        if (i % 2 == 0) r.prompt = shared;  // shared 16-token prefix: prefix-cache hits
        for (int j = 0; j < 3 + (i * 7) % 23; ++j) r.prompt.push_back(int32_t((i * 31 + j * 17) % (vocab - 3) + 3));
        r.max_new_tokens = 4 + i % 9;
        r.ignore_eos = true;
        reqs.push_back(std::move(r));
    }
    const std::vector<std::vector<int32_t>> want = single_rank_tokens(*src, reqs, false);
    for (const auto& layout : layouts_for(world)) {
        const int tp = layout.first, pp = layout.second;
        if (!layout_fits(src->config(), tp, pp)) continue;
        CAPTURE(tp);
        CAPTURE(pp);
        BuildOptions opt = layout_options(tp, pp, 32);  // 32 tokens per step: longer prompts are chunked
        opt.model.block_size = 4;
        opt.kv_blocks = 16;  // 64 positions for 16 sequences of up to 53: preemption
        RankRuntime rt = build(opt, *src);
        GenerateStats st;
        std::vector<GenerateResult> got = EngineClient(*rt.engine, nullptr, true).generate_batch(reqs, {}, &st);
        for (size_t i = 0; i < reqs.size(); ++i) CHECK(got[i].tokens == want[i]);
        CHECK(st.preemptions > 0);
        CHECK(st.cached_prompt_tokens > 0);
        if (rt.engine->is_leader())
            CHECK(rt.engine->scheduler().pool().num_free() == rt.engine->scheduler().pool().num_blocks());
    }
}

TEST_CASE("the device step path (step graphs, backend token selection; the CPU mirrors) in every layout equals one rank") {
    const int world = mpi_session().size();
    auto src = open_model(golden_dir("tiny-gqa-llama3"));
    const int64_t vocab = src->config().vocab;
    std::vector<GenerateRequest> reqs;
    for (int i = 0; i < 6; ++i) {
        GenerateRequest r;
        for (int j = 0; j < 4 + 3 * i; ++j) r.prompt.push_back(int32_t((i * 13 + j * 29) % (vocab - 3) + 3));
        r.max_new_tokens = 3 + 2 * i;  // the batch shrinks: several graph buckets
        r.ignore_eos = true;
        reqs.push_back(std::move(r));
    }
    const std::vector<std::vector<int32_t>> want = single_rank_tokens(*src, reqs, true);
    for (const auto& layout : layouts_for(world)) {
        const int tp = layout.first, pp = layout.second;
        if (!layout_fits(src->config(), tp, pp)) continue;
        CAPTURE(tp);
        CAPTURE(pp);
        BuildOptions opt = layout_options(tp, pp);
        opt.backend.cpu_step_graphs = true;
        opt.backend.cpu_select_tokens = true;
        RankRuntime rt = build(opt, *src);
        std::vector<GenerateResult> got = EngineClient(*rt.engine, nullptr, true).generate_batch(reqs);
        for (size_t i = 0; i < reqs.size(); ++i) CHECK(got[i].tokens == want[i]);
        // Every rank of every stage replayed: TP collectives and the stages' hand-offs around the
        // graphs matched (a pipeline stage captures its own part, receiving and sending outside it).
        CHECK(rt.engine->counters().graph_replays > 0);
    }
}

TEST_CASE("top logprobs in every layout: the k best of a host log-softmax of the same position, sorted") {
    const int world = mpi_session().size();
    auto src = open_model(golden_dir("tiny-gqa-llama3"));
    const int64_t V = src->config().vocab;
    for (const auto& layout : layouts_for(world)) {
        const int tp = layout.first, pp = layout.second;
        if (!layout_fits(src->config(), tp, pp)) continue;
        CAPTURE(tp);
        CAPTURE(pp);
        BuildOptions opt = layout_options(tp, pp);
        opt.backend.cpu_select_tokens = true;  // the plain request is picked by the backend, beside the host rows
        RankRuntime rt = build(opt, *src);
        EngineClient client(*rt.engine, nullptr);
        std::vector<ClientRequest> reqs(2);
        for (size_t i = 0; i < reqs.size(); ++i) {
            reqs[i].prompt = {int32_t(3 + i), 17, 40, int32_t(9 + 5 * i)};
            reqs[i].max_tokens = 5;
            reqs[i].ignore_eos = true;
            reqs[i].sampling.temperature = 1.0f;
            reqs[i].sampling.seed = 7 + i;
        }
        reqs[0].sampling.logprobs = 6;
        const std::vector<ClientOutput> outs = client.run(reqs);
        // The output's tokens to every rank, then the scored sequence (score is every-rank).
        std::vector<int32_t> seq = reqs[0].prompt;
        int32_t n = rt.world.rank == 0 ? int32_t(outs[0].tokens.size()) : 0;
        MPI_Bcast(&n, 1, MPI_INT32_T, 0, MPI_COMM_WORLD);
        std::vector<int32_t> toks(size_t(n), 0);
        if (rt.world.rank == 0) toks = outs[0].tokens;
        MPI_Bcast(toks.data(), n, MPI_INT32_T, 0, MPI_COMM_WORLD);
        seq.insert(seq.end(), toks.begin(), toks.end());
        const std::vector<float> logits = EngineClient(*rt.engine, nullptr, true).score(seq);
        if (rt.world.rank != 0) continue;
        REQUIRE(n == 5);
        REQUIRE(outs[0].top.size() == 5);
        CHECK(outs[1].top.empty());
        const size_t P = reqs[0].prompt.size();
        for (size_t t = 0; t < size_t(n); ++t) {
            const float* row = logits.data() + (P - 1 + t) * size_t(V);
            double m = row[0], sum = 0;
            for (int64_t v = 0; v < V; ++v) m = std::max(m, double(row[v]));
            for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - m);
            const double lse = m + std::log(sum);
            std::vector<int32_t> order(static_cast<size_t>(V));
            for (int64_t v = 0; v < V; ++v) order[size_t(v)] = int32_t(v);
            std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
            CHECK(std::abs(outs[0].logprobs[t] - (row[toks[t]] - lse)) < 1e-4);
            const std::vector<SampledToken>& top = outs[0].top[t];
            REQUIRE(top.size() == 6);
            for (size_t j = 0; j < top.size(); ++j) {
                CHECK(top[j].token == order[j]);
                CHECK(std::abs(top[j].logprob - (row[order[j]] - lse)) < 1e-4);
                if (j > 0) CHECK(top[j].logprob <= top[j - 1].logprob);
            }
        }
    }
}

namespace {

// A made-up vocabulary over the tiny model's ids: one or two characters of "0123456789-abcxy" per
// id (ids below 3: special, never allowed), so a regex grammar can be followed by any layout.
std::shared_ptr<const TokenVocab> toy_vocab(int64_t V) {
    const std::string chars = "0123456789-abcxy";
    std::vector<std::string> bytes(static_cast<size_t>(V));
    for (int64_t id = 3; id < V; ++id) {
        bytes[size_t(id)] = std::string(1, chars[size_t(id % 16)]);
        if (id >= V / 2) bytes[size_t(id)] += chars[size_t(id / 16 % 16)];
    }
    return std::make_shared<const TokenVocab>(std::move(bytes), std::vector<int32_t>{});
}

// The text of ids under a vocabulary.
std::string text_of(const TokenVocab& v, const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) s += v.bytes(id);
    return s;
}

// n requests sampled at temperature 1 with one seed, prompt {first + i, rest...}, each with a matcher
// of its own (a matcher is one sequence's position in the grammar).
std::vector<GenerateRequest> grammar_requests(size_t n, std::vector<int32_t> prompt, int64_t max_new, uint64_t seed,
                                              const std::shared_ptr<const Grammar>& g,
                                              const std::shared_ptr<const TokenVocab>& v) {
    std::vector<GenerateRequest> reqs(n);
    for (size_t i = 0; i < n; ++i) {
        reqs[i].prompt = prompt;
        reqs[i].prompt[0] += int32_t(i);
        reqs[i].max_new_tokens = max_new;
        reqs[i].ignore_eos = true;
        reqs[i].sampling.temperature = 1.0f;
        reqs[i].sampling.seed = seed;
        reqs[i].grammar = std::make_shared<GrammarMatcher>(g, v);
    }
    return reqs;
}

}  // namespace

TEST_CASE("structured output in every layout: the leader's grammar mask reaches the sampler rank") {
    const int world = mpi_session().size();
    auto src = open_model(golden_dir("tiny-gqa-llama3"));
    const int64_t V = src->config().vocab;
    const std::shared_ptr<const TokenVocab> vocab = toy_vocab(V);
    GrammarSpec spec;
    spec.kind = GrammarSpec::Kind::kRegex;
    spec.source = "[0-9]{2,4}-[abc]{1,6}x";  // bounded: it must end within 12 characters
    const std::shared_ptr<const Grammar> grammar = Grammar::compile(spec);
    auto run = [&](BuildOptions opt) {
        RankRuntime rt = build(opt, *src);
        std::vector<std::vector<int32_t>> out;
        const std::vector<GenerateRequest> reqs = grammar_requests(3, {5, 17, 40}, 40, 11, grammar, vocab);
        for (const GenerateResult& r : EngineClient(*rt.engine, nullptr, true).generate_batch(reqs)) out.push_back(r.tokens);
        return out;
    };
    BuildOptions single = layout_options(1, 1);
    single.mpi = false;
    const std::vector<std::vector<int32_t>> want = run(single);
    REQUIRE(want.size() == 3);
    for (const std::vector<int32_t>& toks : want) {
        const std::string text = text_of(*vocab, toks);
        CAPTURE(text);
        CHECK(std::regex_match(text, std::regex(spec.source)));  // and it ended there: finished, not cut
    }
    for (const auto& layout : layouts_for(world)) {
        const int tp = layout.first, pp = layout.second;
        if (!layout_fits(src->config(), tp, pp)) continue;
        CAPTURE(tp);
        CAPTURE(pp);
        CHECK(run(layout_options(tp, pp)) == want);  // every rank, every token (the mask went with the plan)
    }
    // Near max_tokens the mask keeps only tokens that shorten the shortest completion: with 6 tokens for
    // a grammar that needs at least 5 bytes (and, free, would rather go on for 20 characters) every output
    // still ends matched.
    spec.source = "[0-9]{2,4}-[abc]{1,20}x";
    const std::shared_ptr<const Grammar> tight = Grammar::compile(spec);
    RankRuntime rt = build(single, *src);
    for (const GenerateResult& r : EngineClient(*rt.engine, nullptr, true).generate_batch(grammar_requests(4, {9, 3, 50}, 6, 3, tight, vocab))) {
        const std::string text = text_of(*vocab, r.tokens);
        CAPTURE(text);
        CHECK(std::regex_match(text, std::regex(spec.source)));
    }
}
