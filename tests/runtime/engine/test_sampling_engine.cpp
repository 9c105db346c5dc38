// Sampling controls through the engine on one rank: the repetition, presence and frequency
// penalties give exactly the tokens of a reference loop (score() the whole sequence, penalize the
// last row by the formulas, argmax) — also when the prompt's first blocks come from the prefix cache,
// which are never fed to the sampler (the window travels in the step plan); the plan's wire format
// keeps the new fields and rejects a miscounted window; a front's callback ends one sequence of a
// batch (kStop) without disturbing the others.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "base/error.h"
#include "runtime/engine/client.h"
#include "runtime/builder/build.h"
#include "runtime/engine/step_plan.h"
#include "runtime/weights/random_source.h"
#include "tests/test_build.h"

using namespace lattice;

namespace {

ModelConfig tiny() { return test::tiny_config("tiny random (test_sampling_engine)"); }

// Greedy with the penalties, by the formulas of runtime/engine/sampler.h on score()'s last row.
std::vector<int32_t> reference(Engine& e, std::vector<int32_t> seq, int n, const SamplingParams& p, int64_t max_seq) {
    const int64_t V = 61;
    std::map<int32_t, int> generated;
    std::vector<int32_t> out;
    for (int k = 0; k < n; ++k) {
        const std::vector<float> logits = EngineClient(e, nullptr, true).score(seq);
        std::vector<float> row(logits.end() - V, logits.end());
        const int64_t w = std::min<int64_t>(p.recent_window(max_seq), int64_t(seq.size()));
        std::vector<int32_t> window(seq.end() - w, seq.end());
        std::sort(window.begin(), window.end());
        window.erase(std::unique(window.begin(), window.end()), window.end());
        for (int32_t t : window) row[size_t(t)] = row[size_t(t)] > 0 ? row[size_t(t)] / p.repeat_penalty
                                                                     : row[size_t(t)] * p.repeat_penalty;
        for (const auto& [t, c] : generated) row[size_t(t)] -= p.frequency_penalty * float(c) + p.presence_penalty;
        const int32_t next = argmax(row.data(), V);
        out.push_back(next);
        seq.push_back(next);
        ++generated[next];
    }
    return out;
}

GenerateRequest greedy(std::vector<int32_t> prompt, int64_t n, const SamplingParams& p) {
    GenerateRequest r;
    r.prompt = std::move(prompt);
    r.max_new_tokens = n;
    r.sampling = p;
    r.ignore_eos = true;
    return r;
}

}  // namespace

TEST_CASE("penalties through the engine equal the reference loop, prefix-cached prompt blocks included") {
    auto src = make_random_source(tiny(), 11, DType::kF32);
    BuildOptions opt = test::cpu_options();
    opt.model.max_seq = 64;
    opt.model.block_size = 4;  // the 20-token prompt spans 5 blocks: 4 of them cached on the second run
    RankRuntime rt = build(opt, *src);
    opt.backend.cpu_select_tokens = true;  // the device path: the penalties go to select_tokens as edits
    RankRuntime dev = build(opt, *src);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 20; ++i) prompt.push_back(int32_t((i * 7 + 3) % 61));
    const int n = 12;
    const std::vector<int32_t> plain = EngineClient(*rt.engine, nullptr, true).generate(greedy(prompt, n, {})).tokens;
    for (int64_t last_n : {int64_t(-1), int64_t(6)}) {
        CAPTURE(last_n);
        SamplingParams p;
        p.repeat_penalty = 50.0f;  // a seen token is practically banned: a short window would show
        p.repeat_last_n = last_n;
        p.presence_penalty = 0.5f;
        p.frequency_penalty = 0.7f;
        const std::vector<int32_t> want = reference(*rt.engine, prompt, n, p, 64);
        CHECK(want != plain);  // the penalties change the output: the comparison below can fail
        const GenerateResult first = EngineClient(*rt.engine, nullptr, true).generate(greedy(prompt, n, p));
        CHECK(first.tokens == want);
        const GenerateResult on_dev = EngineClient(*dev.engine, nullptr, true).generate(greedy(prompt, n, p));
        CHECK(on_dev.tokens == want);
        REQUIRE(on_dev.logprobs.size() == first.logprobs.size());
        for (size_t k = 0; k < first.logprobs.size(); ++k)
            CHECK(on_dev.logprobs[k] == doctest::Approx(first.logprobs[k]).epsilon(1e-4));
        // Again: the prompt's full blocks now come from the prefix cache (never fed this time).
        GenerateStats st;
        const std::vector<GenerateResult> again = EngineClient(*rt.engine, nullptr, true).generate_batch({greedy(prompt, n, p)}, {}, &st);
        CHECK(st.cached_prompt_tokens >= 16);
        CHECK(again[0].tokens == want);
        // Logprobs are of the raw model row, not of the penalized one: the same as without penalties
        // for the same token at the same position (the first token's context is the prompt alone).
        const GenerateResult raw = EngineClient(*rt.engine, nullptr, true).generate(greedy(prompt, 1, {}));
        const std::vector<float> logits = EngineClient(*rt.engine, nullptr, true).score(prompt);
        std::vector<float> row(logits.end() - 61, logits.end());
        const float mx = *std::max_element(row.begin(), row.end());
        double z = 0;
        for (float v : row) z += std::exp(double(v - mx));
        const double lp = double(row[size_t(first.tokens[0])] - mx) - std::log(z);
        CHECK(std::abs(first.logprobs[0] - lp) < 1e-4);
        CHECK(std::abs(raw.logprobs[0] - (double(row[size_t(raw.tokens[0])] - mx) - std::log(z))) < 1e-4);
    }
}

TEST_CASE("the step plan carries the sampling params and the recent window; a miscount is refused") {
    StepPlan p;
    p.number = 3;
    p.tokens = {5, 6, 7};
    PlanSeq s;
    s.id = 9;
    s.start = 10;
    s.count = 3;
    s.sample = true;
    s.sampling.temperature = 0.5f;
    s.sampling.seed = 77;
    s.sampling.repeat_penalty = 1.3f;
    s.sampling.repeat_last_n = 4;
    s.sampling.presence_penalty = -0.5f;
    s.sampling.frequency_penalty = 1.5f;
    s.sampling.min_p = 0.1f;
    s.sampling.logprobs = 7;
    s.n_recent = 4;
    p.seqs = {s};
    p.width = 2;
    p.tables = {0, 1};
    p.recent_ids = {4, 5, 6, 7};
    const std::vector<uint8_t> bytes = encode_plan(p);
    const StepPlan q = decode_plan(bytes.data(), int64_t(bytes.size()));
    REQUIRE(q.seqs.size() == 1);
    const SamplingParams& g = q.seqs[0].sampling;
    CHECK(g.temperature == 0.5f);
    CHECK(g.seed == 77);
    CHECK(g.repeat_penalty == 1.3f);
    CHECK(g.repeat_last_n == 4);
    CHECK(g.presence_penalty == -0.5f);
    CHECK(g.frequency_penalty == 1.5f);
    CHECK(g.min_p == 0.1f);
    CHECK(g.logprobs == 7);
    CHECK(q.seqs[0].n_recent == 4);
    CHECK(q.recent_ids == p.recent_ids);
    StepPlan bad = p;
    bad.recent_ids = {4, 5, 6};  // 3 listed, 4 announced
    const std::vector<uint8_t> b2 = encode_plan(bad);
    CHECK_THROWS_WITH_AS(decode_plan(b2.data(), int64_t(b2.size())), doctest::Contains("recent ids"), Error);
    StepPlan many = p;
    many.seqs[0].sampling.logprobs = SamplingParams::kMaxLogprobs + 1;
    const std::vector<uint8_t> b3 = encode_plan(many);
    CHECK_THROWS_WITH_AS(decode_plan(b3.data(), int64_t(b3.size())), doctest::Contains("top logprobs"), Error);
}

TEST_CASE("a front's callback ends one sequence of a batch; the others run on") {
    auto src = make_random_source(tiny(), 12, DType::kF32);
    RankRuntime rt = build(test::cpu_options(), *src);
    const std::vector<GenerateRequest> reqs = {greedy({1, 2, 3}, 10, {}), greedy({4, 5}, 10, {})};
    const std::vector<GenerateResult> free_run = EngineClient(*rt.engine, nullptr, true).generate_batch(reqs);
    int seen0 = 0;
    const std::vector<GenerateResult> got = EngineClient(*rt.engine, nullptr, true).generate_batch(reqs, [&](int64_t i, int32_t) {
        return i == 0 && ++seen0 == 3 ? FinishReason::kStop : FinishReason::kNone;
    });
    CHECK(got[0].tokens == std::vector<int32_t>(free_run[0].tokens.begin(), free_run[0].tokens.begin() + 3));
    CHECK(got[0].finish == FinishReason::kStop);
    CHECK(got[1].tokens == free_run[1].tokens);
    CHECK(got[1].finish == FinishReason::kLength);
    CHECK_FALSE(rt.engine->busy());
    CHECK(EngineClient(*rt.engine, nullptr, true).generate_batch(reqs)[0].tokens == free_run[0].tokens);  // usable after
}

TEST_CASE("backend token selection (the device path, run by the CPU backend): greedy rows equal the host path, "
          "penalized ones too (their penalties as per-id edits), seeds reproduce") {
    auto src = make_random_source(tiny(), 17, DType::kF32);
    auto make = [&](bool backend_select) {
        BuildOptions opt = test::cpu_options();
        opt.model.max_seq = 64;
        opt.backend.cpu_select_tokens = backend_select;
        return build(opt, *src);
    };
    RankRuntime host = make(false), dev = make(true);
    REQUIRE_FALSE(host.backend->selects_tokens());
    REQUIRE(dev.backend->selects_tokens());
    std::vector<int32_t> prompt = {5, 9, 13, 17, 21, 25, 29};
    SamplingParams pen;
    pen.repeat_penalty = 30.0f;
    pen.frequency_penalty = 0.5f;
    SamplingParams hot{0.9f, 20, 0.95f, 123};
    hot.min_p = 0.01f;
    SamplingParams hot_pen = hot;
    hot_pen.seed = 7;
    hot_pen.presence_penalty = 1.0f;
    // One batch mixes every kind, so the backend's rows are compacted around the host's.
    const std::vector<GenerateRequest> reqs = {greedy(prompt, 10, pen), greedy(prompt, 10, {}),
                                               greedy(prompt, 10, hot_pen), greedy(prompt, 10, hot),
                                               greedy({3, 4}, 10, {})};
    const std::vector<GenerateResult> a = EngineClient(*host.engine, nullptr, true).generate_batch(reqs);
    const std::vector<GenerateResult> b = EngineClient(*dev.engine, nullptr, true).generate_batch(reqs);
    REQUIRE(a.size() == reqs.size());
    REQUIRE(b.size() == reqs.size());
    for (size_t i : {size_t(0), size_t(1), size_t(4)}) {  // greedy rows, penalized or not: the same picks and logprobs
        CAPTURE(i);
        CHECK(b[i].tokens == a[i].tokens);
        REQUIRE(b[i].logprobs.size() == a[i].logprobs.size());
        for (size_t k = 0; k < a[i].logprobs.size(); ++k) CHECK(b[i].logprobs[k] == doctest::Approx(a[i].logprobs[k]).epsilon(1e-4));
    }
    CHECK(a[0].tokens != a[1].tokens);  // the penalties changed that row: it was not taken as plain
    // The sampled plain row: a seed reproduces on the same backend; every token in range, with a
    // log-probability of the raw row.
    // The sampled penalized row (2) is drawn on the backend too: the same checks.
    const std::vector<GenerateResult> again = EngineClient(*dev.engine, nullptr, true).generate_batch(reqs);
    for (size_t i : {size_t(2), size_t(3)}) {
        CAPTURE(i);
        CHECK(again[i].tokens == b[i].tokens);
        CHECK(b[i].tokens.size() == 10);
        for (size_t k = 0; k < b[i].tokens.size(); ++k) {
            CHECK(b[i].tokens[k] >= 0);
            CHECK(b[i].tokens[k] < 61);
            CHECK(b[i].logprobs[k] <= 0.0f);
            CHECK(std::isfinite(b[i].logprobs[k]));
        }
    }
    SamplingParams other = hot;
    other.seed = 124;
    std::vector<GenerateRequest> reseeded = reqs;
    reseeded[3].sampling = other;
    CHECK(EngineClient(*dev.engine, nullptr, true).generate_batch(reseeded)[3].tokens != b[3].tokens);
}

TEST_CASE("step graphs (replay re-runs the captured body on CPU): padded decode buckets give the eager tokens") {
    auto src = make_random_source(tiny(), 23, DType::kF32);
    auto make = [&](bool graphs, int64_t kv_blocks) {
        BuildOptions opt = test::cpu_options();
        opt.model.max_seq = 64;
        opt.model.block_size = 4;
        opt.kv_blocks = kv_blocks;
        opt.engine.max_seqs = 8;
        opt.backend.cpu_step_graphs = graphs;
        opt.backend.cpu_select_tokens = graphs;  // the device path end to end: graphs, then selection
        return build(opt, *src);
    };
    RankRuntime eager = make(false, 64), graphs = make(true, 65);  // one more block: the padding's trash block
    REQUIRE(graphs.backend->captures_steps());
    // Seven sequences of different lengths: the running batch shrinks 7 -> ... -> 1 as they finish,
    // crossing the buckets 8, 4, 2, 1, each warmed, captured, then replayed.
    std::vector<GenerateRequest> reqs;
    for (int i = 0; i < 7; ++i) {
        std::vector<int32_t> prompt;
        for (int k = 0; k < 3 + i; ++k) prompt.push_back(int32_t((k * 11 + i * 5 + 1) % 61));
        reqs.push_back(greedy(prompt, 4 + 3 * i, {}));
    }
    SamplingParams pen;
    pen.repeat_penalty = 5.0f;
    reqs[2].sampling = pen;  // a penalized row inside a graph step goes through the host sampler
    const std::vector<GenerateResult> a = EngineClient(*eager.engine, nullptr, true).generate_batch(reqs);
    const std::vector<GenerateResult> b = EngineClient(*graphs.engine, nullptr, true).generate_batch(reqs);
    REQUIRE(a.size() == b.size());
    CHECK(eager.engine->counters().graph_steps == 0);
    const EngineCounters g = graphs.engine->counters();
    CHECK(g.graphs_captured == 4);  // buckets 8, 4, 2 and 1
    CHECK(g.graph_replays >= 15);   // the longest: 22 tokens, 21 of them decode steps, 4 of those warm-ups
    CHECK(g.graph_steps == g.graph_replays + 4);
    for (size_t i = 0; i < a.size(); ++i) {
        CAPTURE(i);
        CHECK(a[i].tokens.size() == size_t(4 + 3 * i));
        CHECK(b[i].tokens == a[i].tokens);
        REQUIRE(b[i].logprobs.size() == a[i].logprobs.size());
        for (size_t k = 0; k < a[i].logprobs.size(); ++k)
            CHECK(b[i].logprobs[k] == doctest::Approx(a[i].logprobs[k]).epsilon(1e-4));
    }
    // Again on the same engine: every bucket now replays its captured graph from the first step.
    const std::vector<GenerateResult> c = EngineClient(*graphs.engine, nullptr, true).generate_batch(reqs);
    for (size_t i = 0; i < a.size(); ++i) CHECK(c[i].tokens == a[i].tokens);
    CHECK(graphs.engine->counters().graphs_captured == 4);  // nothing captured twice
    CHECK(graphs.engine->counters().graph_steps - g.graph_steps == graphs.engine->counters().graph_replays - g.graph_replays);
}

// Buckets that are not powers of two: the default list (1, 2, 4, 8, 16, 24 for 24 sequences) and a
// given one ({3, 5, 13}): a running batch of T sequences replays the smallest bucket >= T, padded, and
// every sequence gets the eager engine's tokens. 20 sequences, one finishing per step, shrink through
// the buckets 24 (20..17 running), 16, 8, 4 (two steps: warm-up, capture), 2 and 1 (one step each:
// warm-up only), so 4 captures (a power-of-two list would have run 20..17 eagerly: max 16); with
// {3, 5, 13}: 20..14 eagerly, then 13, 5 and 3 captured.
TEST_CASE(
    "step graph buckets that are not powers of two (default 1, 2, 4, 8, 16, 24, ...; or given) pad to the "
    "smallest bucket and give the eager tokens") {
    auto src = make_random_source(tiny(), 31, DType::kF32);
    auto make = [&](bool graphs, std::vector<int64_t> buckets) {
        BuildOptions opt = test::cpu_options();
        opt.model.max_seq = 64;
        opt.model.block_size = 4;
        opt.model.max_batch_tokens = 128;
        opt.kv_blocks = 20 * 16 + 1;  // one more block: the padding's trash block
        opt.engine.max_seqs = 24;
        opt.engine.graph_buckets = std::move(buckets);
        opt.backend.cpu_step_graphs = graphs;
        opt.backend.cpu_select_tokens = graphs;
        return build(opt, *src);
    };
    std::vector<GenerateRequest> reqs;
    for (int i = 0; i < 20; ++i) {
        std::vector<int32_t> prompt;
        for (int k = 0; k < 2 + i % 5; ++k) prompt.push_back(int32_t((k * 7 + i * 3 + 1) % 61));
        reqs.push_back(greedy(prompt, 2 + i, {}));
    }
    RankRuntime eager = make(false, {});
    const std::vector<GenerateResult> want = EngineClient(*eager.engine, nullptr, true).generate_batch(reqs);
    for (const auto& run : {std::pair<std::vector<int64_t>, int64_t>{{}, 4}, {{3, 5, 13}, 3}}) {
        const std::vector<int64_t>& buckets = run.first;  // (no structured binding: clang 14 cannot capture one)
        const int64_t captures = run.second;
        CAPTURE(buckets.size());
        RankRuntime graphs = make(true, buckets);
        const std::vector<GenerateResult> got = EngineClient(*graphs.engine, nullptr, true).generate_batch(reqs);
        for (size_t i = 0; i < reqs.size(); ++i) {
            CAPTURE(i);
            CHECK(got[i].tokens == want[i].tokens);
        }
        const EngineCounters c = graphs.engine->counters();
        CHECK(c.graphs_captured == captures);
        CHECK(c.graph_replays > 0);
    }
    BuildOptions bad = test::cpu_options();
    bad.backend.cpu_step_graphs = true;
    bad.kv_blocks = 64;
    bad.engine.graph_buckets = {4, 2};
    CHECK_THROWS_WITH_AS(build(bad, *src), doctest::Contains("increasing positive"), Error);
}
