// Sampler (runtime/engine/sampler.h) on large rows and beyond one draw: the top-p set without a sort
// (nucleus_prefix) against a full sort, on large rows with ties at the kept sets' edges (by id, as a full
// sort orders them), a 32k-vocabulary row drawing only from its exact nucleus, top_logprobs, the token mask
// (apply_token_mask), and verify() (speculative decoding): the output follows p for any draft, accepted at
// rate p(draft). The draws and the chi-square test are sampler_test_util.h's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "base/error.h"
#include "runtime/engine/sampler.h"
#include "tests/runtime/engine/sampler_test_util.h"

using namespace lattice;
using namespace lattice::sampler_test;

TEST_CASE("nucleus_prefix: the shortest prefix in weight order reaching the mass, ties by id, as a full sort") {
    using sampling_detail::Candidate;
    std::mt19937_64 rng(5);
    for (size_t n : {size_t(1), size_t(2), size_t(31), size_t(33), size_t(1000), size_t(5000)}) {
        for (int trial = 0; trial < 6; ++trial) {
            CAPTURE(n);
            CAPTURE(trial);
            std::vector<Candidate> c(n);
            double total = 0;
            for (size_t i = 0; i < n; ++i) {
                // Few distinct weights in some trials: many ties, decided by id.
                const double w = trial % 2 ? double(rng() % 7 + 1) : std::exp(-double(rng() % 100000) / 5000.0);
                c[i] = {float(w), int32_t(i)};
                total += float(w);
            }
            std::shuffle(c.begin(), c.end(), rng);
            const double mass = total * (trial < 2 ? 0.5 : trial < 4 ? 0.9 : 1.1);
            std::vector<Candidate> sorted = c;
            std::sort(sorted.begin(), sorted.end(), sampling_detail::before_by_weight);
            size_t want = 0;
            double acc = 0;
            while (want < n) {
                acc += sorted[want++].first;
                if (acc >= mass) break;
            }
            const size_t k = sampling_detail::nucleus_prefix(c, mass);
            CHECK(k == want);
            std::set<int32_t> got_ids, want_ids;
            for (size_t i = 0; i < k; ++i) got_ids.insert(c[i].second);
            for (size_t i = 0; i < want; ++i) want_ids.insert(sorted[i].second);
            CHECK(got_ids == want_ids);
        }
    }
}

TEST_CASE("a 32k vocabulary: top-p draws only from the exact nucleus, and its head as often as it should") {
    std::mt19937_64 rng(9);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> logits(32000);
    for (float& l : logits) l = normal(rng);
    logits[123] = 14.0f;  // a likely token, as language models have
    const std::vector<double> p = softmax(logits, 1.0);
    const std::vector<size_t> order = order_by_prob(p);
    std::set<size_t> nucleus;
    double acc = 0;
    for (size_t i = 0; i < order.size() && acc < 0.9; ++i) {
        acc += p[order[i]];
        nucleus.insert(order[i]);
    }
    REQUIRE(nucleus.size() > 50);  // a real selection, not a handful
    Sampler s(SamplingParams{1.0f, 0, 0.9f, 77});
    int64_t head = 0;
    const int kN = 1000;
    for (int i = 0; i < kN; ++i) {
        const int32_t t = s.sample(logits.data(), int64_t(logits.size()));
        CHECK(nucleus.count(size_t(t)) == 1);
        head += t == 123;
    }
    // The top token's share of the nucleus, within 5 standard deviations.
    const double q = p[123] / acc, sd = std::sqrt(q * (1 - q) / kN);
    CHECK(std::abs(double(head) / kN - q) < 5 * sd);
}

// Rows of many equal logits: the kept sets' edges fall inside a group of ties, which go by id (the
// lower ids in), in the top-k selection that passes whole groups of logits and in top-p's histogram
// edge. 4096 entries with logits 0..12 (each value ~315 times, in scattered ids).
TEST_CASE("ties at the edge of large top-k and top-p sets go by id, as a full sort orders them") {
    std::vector<float> logits(4096);
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = float((i * 7919) % 13);
    std::vector<size_t> order(logits.size());  // by logit, then id: before_by_weight's order
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return logits[a] > logits[b]; });
    const int kN = 4000;
    SUBCASE("top-k 400: the 12s (about 315) and the lowest-id 11s") {
        const std::set<size_t> want(order.begin(), order.begin() + 400);
        REQUIRE(logits[order[399]] == 11.0f);
        REQUIRE(logits[order[400]] == 11.0f);  // the edge splits the 11s
        Sampler s(SamplingParams{50.0f, 400, 1.0f, 3});  // hot: every kept token is likely
        std::set<size_t> seen;
        for (int i = 0; i < kN; ++i) {
            const size_t t = size_t(s.sample(logits.data(), int64_t(logits.size())));
            CHECK(want.count(t) == 1);
            if (logits[t] == 11.0f) seen.insert(t);
        }
        CHECK(seen.size() > 40);  // the 11s that are in are drawn
    }
    SUBCASE("top-p: the 12s, the 11s, and the 10s up to the one the mass reaches") {
        const std::vector<double> p = softmax(logits, 1.0);
        // The mass that ends half-way through the 100th of the 10s (ids in order), so that the edge is
        // that token whatever the float rounding.
        double acc = 0;
        size_t j = 0, tens = 0;
        for (; j < order.size(); ++j) {
            if (logits[order[j]] == 10.0f && ++tens == 100) break;
            acc += p[order[j]];
        }
        const float top_p = float(acc + p[order[j]] / 2);
        const std::set<size_t> want(order.begin(), order.begin() + ptrdiff_t(j) + 1);
        Sampler s(SamplingParams{1.0f, 0, top_p, 5});
        std::set<size_t> seen_tens;
        for (int i = 0; i < kN; ++i) {
            const size_t t = size_t(s.sample(logits.data(), int64_t(logits.size())));
            CHECK(want.count(t) == 1);
            if (logits[t] == 10.0f) seen_tens.insert(t);
        }
        CHECK(seen_tens.size() > 20);
        CHECK(*seen_tens.rbegin() <= order[j]);
    }
}

TEST_CASE("top_logprobs: the k best of a row by a full sort, ties by lower id, most likely first") {
    std::mt19937 rng(5);
    std::uniform_int_distribution<int> coarse(-40, 40);  // few distinct values: many ties
    for (int64_t n : {1, 7, 1000, 5001}) {
        std::vector<float> row(static_cast<size_t>(n));
        for (float& x : row) x = float(coarse(rng)) / 8.0f;
        double m = -INFINITY, sum = 0;
        for (float x : row) m = std::max(m, double(x));
        for (float x : row) sum += std::exp(double(x) - m);
        const double lse = m + std::log(sum);
        std::vector<int32_t> order(row.size());
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
        for (int32_t k : {0, 1, 5, 20}) {
            if (k > n) continue;
            CAPTURE(n);
            CAPTURE(k);
            std::vector<int32_t> ids(size_t(k), -1);
            std::vector<float> lps(size_t(k), 1.0f);
            top_logprobs(row.data(), n, lse, k, ids.data(), lps.data());
            for (int32_t j = 0; j < k; ++j) {
                CHECK(ids[size_t(j)] == order[size_t(j)]);
                CHECK(lps[size_t(j)] == doctest::Approx(double(row[size_t(order[size_t(j)])]) - lse));
            }
        }
    }
    float two[2] = {0, 0};
    CHECK_THROWS_AS(top_logprobs(two, 2, 0.0, 3, nullptr, nullptr), lattice::Error);
}

TEST_CASE("apply_token_mask: clear bits become -inf, set bits keep their logit; an empty mask changes nothing") {
    const int64_t n = 70;  // three words, the last partial
    std::vector<float> row(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) row[size_t(i)] = float(i) * 0.5f - 3.0f;
    std::vector<uint32_t> words = {0x80000001u, 0x0u, 0x2u | (1u << 5)};  // ids 0, 31, 65, 69
    std::vector<float> got = row;
    apply_token_mask(got.data(), n, words.data());
    for (int64_t i = 0; i < n; ++i) {
        const bool allowed = i == 0 || i == 31 || i == 65 || i == 69;
        CAPTURE(i);
        if (allowed)
            CHECK(got[size_t(i)] == row[size_t(i)]);
        else
            CHECK(got[size_t(i)] == -INFINITY);
    }
    CHECK(argmax(got.data(), n) == 69);
    Sampler s(SamplingParams{1.0f, 0, 1.0f, 5});  // sampled at temperature 1: only allowed ids ever come out
    for (int k = 0; k < 200; ++k) {
        const int32_t t = s.sample(got.data(), n);
        CHECK((t == 0 || t == 31 || t == 65 || t == 69));
    }
    std::vector<uint32_t> none = {0x0u, 0x0u, 0xffffffc0u};  // only bits past n = 70 in the last word
    got = row;
    apply_token_mask(got.data(), n, none.data());
    CHECK(got == row);
}

TEST_CASE("verify (speculative decoding): the returned token follows p whatever the draft; accepted at p(draft)") {
    // Rejection sampling against a one-hot draft: accept with probability p(draft), else draw from p
    // without the draft. The output must follow p itself for any draft: likely, unlikely, or outside the
    // kept set (top-k / top-p), each with temperature, top-k and top-p variants.
    struct Case {
        SamplingParams p;
        std::vector<double> want;
    };
    const std::vector<double> p1 = softmax(kLogits, 0.8);
    const std::vector<size_t> order = order_by_prob(p1);
    std::vector<Case> cases = {{SamplingParams{0.8f, 0, 1.0f, 51}, p1},
                               {SamplingParams{0.8f, 4, 1.0f, 52}, restrict_to(p1, {order.begin(), order.begin() + 4})}};
    size_t n = 0;
    double acc = 0;
    while (acc < 0.6) acc += p1[order[n++]];
    cases.push_back({SamplingParams{0.8f, 0, 0.6f, 53}, restrict_to(p1, {order.begin(), order.begin() + ptrdiff_t(n)})});
    for (const Case& c : cases) {
        for (const size_t draft : {order[0], order[2], order[8]}) {
            CAPTURE(c.p.top_k);
            CAPTURE(c.p.top_p);
            CAPTURE(draft);
            Sampler s(c.p);
            std::vector<int64_t> counts(kLogits.size(), 0);
            int64_t accepted = 0, bad = 0;
            for (int i = 0; i < kDraws; ++i) {
                bool ok = false;
                const int32_t t = s.verify(kLogits.data(), int64_t(kLogits.size()), int32_t(draft), &ok);
                if (t < 0 || t >= int32_t(kLogits.size()) || ok != (t == int32_t(draft))) {
                    ++bad;
                    continue;
                }
                accepted += ok;
                ++counts[size_t(t)];
            }
            REQUIRE(bad == 0);
            int dof = 0;
            const double x = chi2(counts, c.want, &dof);
            CHECK(x < chi2_critical(dof));
            // P(accept) = p(draft): within 4 standard deviations of the binomial
            const double pd = c.want[draft], sd = std::sqrt(kDraws * pd * (1 - pd));
            CHECK(std::abs(double(accepted) - kDraws * pd) <= 4 * sd + 1e-9);
        }
    }
    SUBCASE("greedy: the argmax, accepted when it is the draft") {
        Sampler g(SamplingParams{0.0f, 0, 1.0f, 1});
        bool ok = false;
        CHECK(g.verify(kLogits.data(), int64_t(kLogits.size()), 1, &ok) == 1);
        CHECK(ok);
        CHECK(g.verify(kLogits.data(), int64_t(kLogits.size()), 9, &ok) == 1);
        CHECK_FALSE(ok);
    }
    SUBCASE("a penalized sequence does not speculate") {
        SamplingParams pen{0.8f, 0, 1.0f, 1};
        pen.presence_penalty = 0.5f;
        Sampler q(pen);
        bool ok = false;
        CHECK_THROWS_AS(q.verify(kLogits.data(), int64_t(kLogits.size()), 1, &ok), Error);
    }
}
