// Speculative decoding (runtime/engine/speculative.h, Scheduler's drafts, Sampler::verify) through
// the engine on one rank:
//  - prompt lookup: the longest recent suffix's earlier occurrence, what followed it, at most k;
//  - greedy: the tokens equal decoding without drafts, for single sequences and a batch of them,
//    at the ends of max_new_tokens and of the context, W8A8 and f32 (drafts were fed and accepted);
//    every golden case's reference tokens, one by one and all cases of a model batched;
//  - sampling (temperature 1, top-k 4): the joint distribution of the first two sampled tokens over
//    many seeds matches the exact one from score()'s rows (chi-square at 1e-4), with drafts from a
//    proposer that offers the second row's most likely token, so both the accept and the refuse
//    paths run; stop ids inside accepted drafts end the output there;
//  - a draft model (the target itself: every draft accepted; random weights of its shape: most refused):
//    the target's golden tokens either way; a draft with a larger vocabulary is refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "runtime/engine/client.h"
#include "runtime/builder/build.h"
#include "runtime/engine/speculative.h"
#include "runtime/weights/random_source.h"
#include "tests/test_build.h"
#include "tests/runtime/model/golden.h"

// The file's own namespace: its test compiles as unity files (tests/CMakeLists.txt), whose files'
// local names must not meet.
namespace test_speculative {

using namespace lattice;
using namespace lattice::testing;

namespace {

ModelConfig tiny() { return test::tiny_config("tiny random (test_speculative)"); }

BuildOptions options(int64_t spec, QuantMode q = QuantMode::kNone) {
    BuildOptions o = test::cpu_options();
    o.model.max_seq = 64;
    o.model.quant = q;
    o.engine.speculative_tokens = spec;
    return o;
}

GenerateRequest request(std::vector<int32_t> prompt, int64_t n) {
    GenerateRequest r;
    r.prompt = std::move(prompt);
    r.max_new_tokens = n;
    r.ignore_eos = true;
    return r;
}

// Upper quantile of chi-square with k degrees of freedom at alpha = 1e-4 (Wilson-Hilferty).
double chi2_critical(int k) {
    const double z = 3.719, a = 2.0 / (9.0 * k);
    return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// softmax(row / t) over the k most likely ids (0 elsewhere).
std::vector<double> top_k_softmax(const float* row, int64_t V, double t, int k) {
    std::vector<int32_t> idx(static_cast<size_t>(V));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
        return row[a] > row[b] || (row[a] == row[b] && a < b);
    });
    std::vector<double> p(static_cast<size_t>(V), 0.0);
    double z = 0;
    for (int i = 0; i < k; ++i) z += p[size_t(idx[size_t(i)])] = std::exp((row[idx[size_t(i)]] - row[idx[0]]) / t);
    for (double& x : p) x /= z;
    return p;
}

}  // namespace

TEST_CASE("prompt lookup: what followed the last n tokens' most recent earlier occurrence") {
    const std::vector<int32_t> t = {5, 6, 7, 8, 1, 5, 6, 9, 2, 5, 6};
    // [5 6] occurs at 5 (followed by 9 2 ...) and at 0 (followed by 7 8 ...): the most recent first.
    CHECK(ngram_drafts(t, 3, 1, 3) == std::vector<int32_t>{9, 2, 5});
    CHECK(ngram_drafts(t, 1, 1, 3) == std::vector<int32_t>{9});
    // the longest suffix that occurs wins: [2 5 6] does not occur before, [5 6] does
    const std::vector<int32_t> u = {1, 2, 3, 9, 2, 3, 4, 7, 1, 2, 3};
    CHECK(ngram_drafts(u, 2, 1, 3) == std::vector<int32_t>{9, 2});  // [1 2 3] at 0
    CHECK(ngram_drafts(u, 2, 1, 2) == std::vector<int32_t>{4, 7});  // [2 3] most recently at 4
    // a run repeats itself (the occurrence may overlap the suffix); drafts stop at the end
    CHECK(ngram_drafts(std::vector<int32_t>{4, 4, 4, 4}, 5, 1, 3) == std::vector<int32_t>{4});
    CHECK(ngram_drafts(std::vector<int32_t>{1, 2, 3}, 4, 1, 3).empty());  // nothing repeats
    CHECK(ngram_drafts(std::vector<int32_t>{1, 2, 1}, 4, 2, 3).empty());  // only 1-grams repeat
    CHECK(ngram_drafts(t, 0, 1, 3).empty());
    CHECK(ngram_drafts(std::vector<int32_t>{}, 3, 1, 3).empty());
}

TEST_CASE("speculative greedy decoding gives the tokens of plain decoding") {
    for (const QuantMode q : {QuantMode::kNone, QuantMode::kW8A8}) {
        CAPTURE(quant_mode_name(q));
        auto src = make_random_source(tiny(), 13, DType::kF32);
        // Prompts that repeat themselves (drafts to find), one that does not, and limits: max_new_tokens
        // 1 and 2 (no room for drafts, then one), a prompt near the end of the 64-position context.
        std::vector<GenerateRequest> reqs = {request({3, 9, 14, 3, 9, 14, 3, 9}, 40),
                                             request({7, 7, 7, 7, 7, 7}, 24),
                                             request({11, 22, 33, 44}, 30),
                                             request({5, 8, 5, 8, 5}, 1),
                                             request({5, 8, 5, 8, 5}, 2),
                                             request(std::vector<int32_t>(50, 19), 14)};
        RankRuntime plain = build(options(0, q), *src);
        std::vector<std::vector<int32_t>> want;
        for (const auto& r : reqs) want.push_back(EngineClient(*plain.engine, nullptr, true).generate(r).tokens);
        RankRuntime spec = build(options(4, q), *src);
        int64_t drafted = 0, accepted = 0;
        for (size_t i = 0; i < reqs.size(); ++i) {
            CAPTURE(i);
            const GenerateResult got = EngineClient(*spec.engine, nullptr, true).generate(reqs[i]);
            CHECK(got.tokens == want[i]);
            drafted += got.stats.drafted_tokens;
            accepted += got.stats.accepted_tokens;
        }
        CHECK(drafted > 0);
        CHECK(accepted > 0);
        CHECK(accepted <= drafted);
        // all at once: continuous batching with several speculating sequences in a step
        GenerateStats st;
        const std::vector<GenerateResult> batch = EngineClient(*spec.engine, nullptr, true).generate_batch(reqs, {}, &st);
        for (size_t i = 0; i < reqs.size(); ++i) CHECK(batch[i].tokens == want[i]);
        CHECK(st.drafted_tokens > 0);
        MESSAGE(quant_mode_name(q) << ": " << accepted << " of " << drafted << " drafts accepted one by one, "
                                   << st.accepted_tokens << " of " << st.drafted_tokens << " in a batch");
    }
}

TEST_CASE("speculative sampling keeps the target distribution; a stop id inside accepted drafts ends there") {
    auto src = make_random_source(tiny(), 17, DType::kF32);
    const std::vector<int32_t> prompt = {4, 15, 26, 37, 48};
    constexpr double kTemp = 1.0;
    constexpr int kTopK = 4;
    RankRuntime plain = build(options(0), *src);
    const int64_t V = tiny().vocab;
    // The exact joint distribution of (t1, t2) and, per t1, the most likely t2 (the proposer's draft).
    const std::vector<float> l0 = EngineClient(*plain.engine, nullptr, true).score(prompt);
    const std::vector<double> p1 = top_k_softmax(l0.data() + (prompt.size() - 1) * size_t(V), V, kTemp, kTopK);
    std::vector<std::vector<double>> p2(static_cast<size_t>(V));
    std::vector<int32_t> likely(static_cast<size_t>(V), 0);
    for (int32_t a = 0; a < V; ++a) {
        if (p1[size_t(a)] == 0) continue;
        std::vector<int32_t> seq = prompt;
        seq.push_back(a);
        const std::vector<float> l = EngineClient(*plain.engine, nullptr, true).score(seq);
        p2[size_t(a)] = top_k_softmax(l.data() + prompt.size() * size_t(V), V, kTemp, kTopK);
        likely[size_t(a)] = int32_t(std::max_element(p2[size_t(a)].begin(), p2[size_t(a)].end()) - p2[size_t(a)].begin());
    }
    BuildOptions o = options(2);
    o.engine.max_seqs = 64;
    o.engine.draft_proposer = [&](std::span<const int32_t> t, int64_t) {
        return std::vector<int32_t>{likely[size_t(t.back())]};
    };
    RankRuntime spec = build(o, *src);
    constexpr int kRuns = 3000;
    std::vector<GenerateRequest> reqs;
    for (int i = 0; i < kRuns; ++i) {
        GenerateRequest r = request(prompt, 3);
        r.sampling.temperature = float(kTemp);
        r.sampling.top_k = kTopK;
        r.sampling.seed = uint64_t(1000 + i);
        reqs.push_back(r);
    }
    GenerateStats st;
    const std::vector<GenerateResult> out = EngineClient(*spec.engine, nullptr, true).generate_batch(reqs, {}, &st);
    std::vector<int64_t> counts(size_t(V * V), 0);
    for (const GenerateResult& r : out) {
        REQUIRE(r.tokens.size() == 3);
        ++counts[size_t(r.tokens[0] * V + r.tokens[1])];
    }
    double x = 0;
    int cells = 0;
    for (int32_t a = 0; a < V; ++a)
        for (int32_t b = 0; b < V; ++b) {
            const double p = p1[size_t(a)] * (p2[size_t(a)].empty() ? 0.0 : p2[size_t(a)][size_t(b)]);
            const int64_t c = counts[size_t(a * V + b)];
            if (p == 0) {
                CHECK_MESSAGE(c == 0, "(" << a << ", " << b << ") has probability 0 but was drawn " << c << " times");
                continue;
            }
            ++cells;
            x += (double(c) - kRuns * p) * (double(c) - kRuns * p) / (kRuns * p);
        }
    MESSAGE("joint (t1, t2) over " << cells << " cells: chi-square " << x << " (critical " << chi2_critical(cells - 1)
                                   << "); " << st.accepted_tokens << " of " << st.drafted_tokens << " drafts accepted");
    CHECK(x < chi2_critical(cells - 1));
    // Both paths ran: the drafts were accepted often (the most likely token), and refused often.
    CHECK(st.drafted_tokens >= kRuns);
    CHECK(st.accepted_tokens > st.drafted_tokens / 10);
    CHECK(st.accepted_tokens < st.drafted_tokens * 9 / 10);

    SUBCASE("a stop id among accepted drafts ends the output at it") {
        RankRuntime g = build(options(4), *src);
        const std::vector<int32_t> rep = {3, 9, 14, 3, 9, 14, 3, 9};
        const std::vector<int32_t> full = EngineClient(*plain.engine, nullptr, true).generate(request(rep, 30)).tokens;
        GenerateRequest r = request(rep, 30);
        r.stop_ids = {full[7]};
        const GenerateResult got = EngineClient(*g.engine, nullptr, true).generate(r);
        const size_t at = size_t(std::find(full.begin(), full.end(), full[7]) - full.begin());
        CHECK(got.tokens == std::vector<int32_t>(full.begin(), full.begin() + ptrdiff_t(at) + 1));
        CHECK(got.finish == FinishReason::kStop);
    }
}

TEST_CASE("speculative greedy decoding gives every golden case's reference tokens") {
    int64_t drafted = 0, accepted = 0;
    for (const auto& m : golden_models()) {
        CAPTURE(m);
        auto src = open_model(golden_dir(m));
        const auto cases = load_golden(m);
        BuildOptions o = test::cpu_options();
        o.engine.speculative_tokens = 4;
        RankRuntime rt = build(o, *src);
        std::vector<GenerateRequest> reqs;
        for (const auto& c : cases) reqs.push_back(request(c.prompt, int64_t(c.greedy.size())));
        for (size_t i = 0; i < cases.size(); ++i) CHECK(EngineClient(*rt.engine, nullptr, true).generate(reqs[i]).tokens == cases[i].greedy);
        GenerateStats st;
        const std::vector<GenerateResult> all = EngineClient(*rt.engine, nullptr, true).generate_batch(reqs, {}, &st);
        for (size_t i = 0; i < cases.size(); ++i) CHECK(all[i].tokens == cases[i].greedy);
        drafted += st.drafted_tokens;
        accepted += st.accepted_tokens;
    }
    MESSAGE("golden cases batched: " << accepted << " of " << drafted << " drafts accepted");
    CHECK(accepted > 0);
}

TEST_CASE("speculative decoding with a draft model: the target's greedy tokens; a larger vocabulary is refused") {
    // The draft is the target's own checkpoint (every draft is the target's argmax: all accepted) and
    // random weights of its shape (most drafts refused): the output is the target's either way.
    const std::string target = golden_dir("tiny-gqa-llama3");
    const auto cases = load_golden("tiny-gqa-llama3");
    for (const bool random : {false, true}) {
        CAPTURE(random);
        BuildOptions o = test::cpu_options();
        o.engine.speculative_tokens = 3;
        o.draft = ModelSpec{target, random, "", 99};
        RankRuntime rt = build(o, ModelSpec{target});
        REQUIRE(rt.draft != nullptr);
        std::vector<GenerateRequest> reqs;
        for (const auto& c : cases) reqs.push_back(request(c.prompt, int64_t(c.greedy.size())));
        GenerateStats st;
        const std::vector<GenerateResult> got = EngineClient(*rt.engine, nullptr, true).generate_batch(reqs, {}, &st);
        for (size_t i = 0; i < cases.size(); ++i) CHECK(got[i].tokens == cases[i].greedy);
        MESSAGE(std::string(random ? "random" : "the target's") << " draft: " << st.accepted_tokens << " of " << st.drafted_tokens
                                                     << " accepted");
        CHECK(st.drafted_tokens > 0);
        if (!random) CHECK(st.accepted_tokens == st.drafted_tokens);
        if (random) CHECK(st.accepted_tokens < st.drafted_tokens / 2);
    }
    BuildOptions o = test::cpu_options();
    o.engine.speculative_tokens = 3;
    o.draft.path = golden_dir("tiny-gqa-llama3");  // 1024 tokens for a target of 320
    CHECK_THROWS_WITH_AS(build(o, ModelSpec{golden_dir("tiny-llama2")}),
                         doctest::Contains("vocabulary of 1024 tokens is larger than the target's 320"), Error);
    o.engine.speculative_tokens = 0;
    CHECK_THROWS_WITH_AS(build(o, ModelSpec{golden_dir("tiny-llama2")}), doctest::Contains("needs speculative tokens"),
                         Error);
}

}  // namespace test_speculative
