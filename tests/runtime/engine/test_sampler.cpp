// Sampler (runtime/engine/sampler.h): greedy ties, parameter validation, seeding, and the
// distributions it draws from — empirical frequencies over many draws against the exact
// distribution (temperature softmax, renormalized top-k set, renormalized top-p nucleus) with a
// chi-square test at a 1e-4 false-alarm level. Seeds are fixed, so every run draws the same tokens:
// the statistics decide once whether the algorithm is right, they do not flake. Then the penalties
// (repetition: llama.cpp's, once per distinct id of the window; presence / frequency: OpenAI's, over
// the tokens the sampler produced) moving the argmax exactly where the formulas say, min-p's kept set,
// and the caller's logits left raw. The top-p set without a sort (nucleus_prefix) against a full sort
// on large rows with ties, and a 32k-vocabulary row drawing only from its exact nucleus. verify()
// (speculative decoding): the output follows p for any draft, accepted at rate p(draft).
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

using namespace lattice;

namespace {

// Upper quantile of chi-square with k degrees of freedom at alpha = 1e-4 (Wilson-Hilferty; z = 3.719).
double chi2_critical(int k) {
    const double z = 3.719, a = 2.0 / (9.0 * k);
    return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// Draws n tokens; returns counts per token id.
std::vector<int64_t> draw(const SamplingParams& p, const std::vector<float>& logits, int n) {
    Sampler s(p);
    std::vector<int64_t> counts(logits.size(), 0);
    for (int i = 0; i < n; ++i) {
        const int32_t t = s.sample(logits.data(), int64_t(logits.size()));
        REQUIRE(t >= 0);
        REQUIRE(t < int32_t(logits.size()));
        ++counts[size_t(t)];
    }
    return counts;
}

// Pearson chi-square of counts against probabilities over the support (p > 0); tokens outside the
// support must never be drawn.
double chi2(const std::vector<int64_t>& counts, const std::vector<double>& p, int* dof) {
    const double n = double(std::accumulate(counts.begin(), counts.end(), int64_t(0)));
    double x = 0;
    int support = 0;
    for (size_t i = 0; i < p.size(); ++i) {
        if (p[i] == 0) {
            CHECK_MESSAGE(counts[i] == 0, "token " << i << " is outside the allowed set but was drawn " << counts[i]);
            continue;
        }
        ++support;
        const double e = n * p[i];
        x += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
    }
    *dof = support - 1;
    return x;
}

std::vector<double> softmax(const std::vector<float>& l, double t) {
    std::vector<double> p(l.size());
    const double mx = *std::max_element(l.begin(), l.end());
    double z = 0;
    for (size_t i = 0; i < l.size(); ++i) z += p[i] = std::exp((l[i] - mx) / t);
    for (auto& v : p) v /= z;
    return p;
}

// Keeps the given ids (by descending probability rule computed by the caller) and renormalizes.
std::vector<double> restrict_to(std::vector<double> p, const std::vector<size_t>& keep) {
    std::vector<double> out(p.size(), 0.0);
    double z = 0;
    for (size_t i : keep) z += p[i];
    for (size_t i : keep) out[i] = p[i] / z;
    return out;
}

std::vector<size_t> order_by_prob(const std::vector<double>& p) {
    std::vector<size_t> idx(p.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
    return idx;
}

const std::vector<float> kLogits = {1.0f, 2.5f, -0.5f, 0.3f, 2.0f, -3.0f, 1.7f, 0.9f, -1.2f, 2.2f};
constexpr int kDraws = 40000;

}  // namespace

TEST_CASE("greedy: argmax, lowest id on ties, independent of seed") {
    const std::vector<float> l = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
    CHECK(argmax(l.data(), 5) == 1);
    for (uint64_t seed : {0ull, 7ull, 123456789ull}) {
        Sampler s(SamplingParams{0.0f, 0, 1.0f, seed});
        for (int i = 0; i < 10; ++i) CHECK(s.sample(l.data(), 5) == 1);
    }
}

TEST_CASE("tiny temperatures sample the argmax, never an overflowed logit") {
    // logits / 1e-38 overflows to inf (and inf - inf to NaN); (logit - max) / T does not.
    const std::vector<float> l = {10.0f, 30.0f, -5.0f, 29.0f, 30.0f - 1e-5f, -1e30f};
    for (float t : {1e-38f, 1e-45f, 1e-20f}) {
        for (uint64_t seed : {1ull, 2ull, 99ull}) {
            Sampler s(SamplingParams{t, 0, 1.0f, seed});
            for (int i = 0; i < 20; ++i) CHECK(s.sample(l.data(), int64_t(l.size())) == 1);
            Sampler p(SamplingParams{t, 3, 0.5f, seed});  // with top-k and top-p
            CHECK(p.sample(l.data(), int64_t(l.size())) == 1);
        }
    }
}

TEST_CASE("validate names the bad parameter") {
    CHECK_THROWS_WITH_AS(SamplingParams({-0.1f, 0, 1.0f, 0}).validate(), doctest::Contains("--temperature"), Error);
    CHECK_THROWS_WITH_AS(SamplingParams({NAN, 0, 1.0f, 0}).validate(), doctest::Contains("--temperature"), Error);
    CHECK_THROWS_WITH_AS(SamplingParams({1.0f, -1, 1.0f, 0}).validate(), doctest::Contains("--top-k"), Error);
    CHECK_THROWS_WITH_AS(SamplingParams({1.0f, 0, 0.0f, 0}).validate(), doctest::Contains("--top-p"), Error);
    CHECK_THROWS_WITH_AS(SamplingParams({1.0f, 0, 1.5f, 0}).validate(), doctest::Contains("--top-p"), Error);
    CHECK_THROWS_AS(Sampler(SamplingParams{1.0f, 0, 2.0f, 0}), Error);
}

TEST_CASE("seed: the same seed draws the same tokens, another seed other tokens") {
    auto run = [](uint64_t seed) {
        Sampler s(SamplingParams{1.0f, 0, 1.0f, seed});
        std::vector<int32_t> out;
        for (int i = 0; i < 64; ++i) out.push_back(s.sample(kLogits.data(), int64_t(kLogits.size())));
        return out;
    };
    CHECK(run(5) == run(5));
    CHECK(run(5) != run(6));
}

TEST_CASE("temperature: frequencies follow softmax(logits / T)") {
    for (float t : {1.0f, 0.5f, 2.0f}) {
        CAPTURE(t);
        const auto counts = draw(SamplingParams{t, 0, 1.0f, 11}, kLogits, kDraws);
        int dof = 0;
        const double x = chi2(counts, softmax(kLogits, t), &dof);
        CHECK(dof == int(kLogits.size()) - 1);
        CHECK(x < chi2_critical(dof));
        // The test has power: the distribution of another temperature is rejected.
        const double other = chi2(counts, softmax(kLogits, t * 1.25), &dof);
        CHECK(other > chi2_critical(dof));
    }
}

TEST_CASE("top-k: only the k most likely tokens, renormalized") {
    for (int64_t k : {1, 3, 6}) {
        CAPTURE(k);
        const std::vector<double> p = softmax(kLogits, 1.0);
        const std::vector<size_t> order = order_by_prob(p);
        const std::vector<double> want = restrict_to(p, {order.begin(), order.begin() + k});
        const auto counts = draw(SamplingParams{1.0f, k, 1.0f, 21}, kLogits, kDraws);
        if (k == 1) {
            CHECK(counts[order[0]] == kDraws);
            continue;
        }
        int dof = 0;
        const double x = chi2(counts, want, &dof);
        CHECK(dof == k - 1);
        CHECK(x < chi2_critical(dof));
    }
}

TEST_CASE("top-p: the smallest set reaching p, renormalized") {
    const std::vector<double> p = softmax(kLogits, 1.0);
    const std::vector<size_t> order = order_by_prob(p);
    for (float top_p : {0.3f, 0.6f, 0.9f}) {
        CAPTURE(top_p);
        size_t n = 0;
        double acc = 0;
        while (n < order.size() && acc < top_p) acc += p[order[n++]];
        const std::vector<double> want = restrict_to(p, {order.begin(), order.begin() + ptrdiff_t(n)});
        const auto counts = draw(SamplingParams{1.0f, 0, top_p, 31}, kLogits, kDraws);
        int dof = 0;
        const double x = chi2(counts, want, &dof);
        CHECK(dof == int(n) - 1);
        if (dof > 0) CHECK(x < chi2_critical(dof));
    }
}

TEST_CASE("top-k and top-p together: nucleus taken within the top k") {
    const std::vector<double> p = softmax(kLogits, 0.8);
    const std::vector<size_t> order = order_by_prob(p);
    const int64_t k = 4;
    const std::vector<double> pk = restrict_to(p, {order.begin(), order.begin() + k});
    size_t n = 0;
    double acc = 0;
    while (n < size_t(k) && acc < 0.7) acc += pk[order[n++]];
    const std::vector<double> want = restrict_to(pk, {order.begin(), order.begin() + ptrdiff_t(n)});
    const auto counts = draw(SamplingParams{0.8f, k, 0.7f, 41}, kLogits, kDraws);
    int dof = 0;
    const double x = chi2(counts, want, &dof);
    CHECK(dof == int(n) - 1);
    if (dof > 0) CHECK(x < chi2_critical(dof));
}

TEST_CASE("repetition penalty: divides positive, multiplies negative logits of the window's ids, once each") {
    SamplingParams p{0.0f, 0, 1.0f, 0};
    p.repeat_penalty = 1.1f;
    {
        const std::vector<float> l = {2.0f, 1.9f, 0.5f};  // 2.0 / 1.1 = 1.818 < 1.9
        CHECK(Sampler(SamplingParams{0.0f, 0, 1.0f, 0}).sample(l.data(), 3, std::vector<int32_t>{0}) == 0);  // off
        CHECK(Sampler(p).sample(l.data(), 3, std::vector<int32_t>{0}) == 1);
        CHECK(Sampler(p).sample(l.data(), 3, std::vector<int32_t>{2, 2}) == 0);  // another id penalized
        CHECK(Sampler(p).sample(l.data(), 3, {}) == 0);                          // nothing seen
    }
    {
        const std::vector<float> l = {-1.0f, -1.05f, -3.0f};  // -1.0 * 1.1 = -1.1 < -1.05
        CHECK(Sampler(p).sample(l.data(), 3, std::vector<int32_t>{0}) == 1);
    }
    {
        // Three occurrences count once: 2.0 / 1.1 = 1.818 > 1.7 (2.0 / 1.1^3 = 1.503 would not be).
        const std::vector<float> l = {2.0f, 1.7f};
        CHECK(Sampler(p).sample(l.data(), 2, std::vector<int32_t>{0, 0, 0}) == 0);
    }
    SamplingParams off = p;
    off.repeat_last_n = 0;  // a window of 0 tokens: off, whatever the caller passes
    const std::vector<float> l = {2.0f, 1.9f};
    CHECK_FALSE(off.uses_recent());
    CHECK(Sampler(off).sample(l.data(), 2, std::vector<int32_t>{0}) == 0);
    CHECK(p.recent_window(4096) == 64);
    p.repeat_last_n = -1;
    CHECK(p.recent_window(4096) == 4096);
    // Ids outside the vocab are ignored, not read.
    CHECK(Sampler(p).sample(l.data(), 2, std::vector<int32_t>{-1, 7}) == 0);
}

TEST_CASE("presence and frequency penalties act on the sampler's own output, as OpenAI's formula says") {
    const std::vector<float> l = {1.0f, 0.9f, 0.5f};
    auto greedy = [&](float presence, float frequency) {
        SamplingParams p{0.0f, 0, 1.0f, 0};
        p.presence_penalty = presence;
        p.frequency_penalty = frequency;
        Sampler s(p);
        std::vector<int32_t> out;
        for (int i = 0; i < 4; ++i) out.push_back(s.sample(l.data(), 3));
        return out;
    };
    CHECK(greedy(0, 0) == std::vector<int32_t>{0, 0, 0, 0});
    // presence: -0.2 once a token appeared: 0 (1.0), 1 (0.9 > 0.8), then 0.8 > 0.7 for ever.
    CHECK(greedy(0.2f, 0) == std::vector<int32_t>{0, 1, 0, 0});
    // frequency: -0.2 per occurrence: 0, 1 (0.9 > 0.8), 0 (0.8 > 0.7), 1 (0.7 > 0.6).
    CHECK(greedy(0, 0.2f) == std::vector<int32_t>{0, 1, 0, 1});
}

TEST_CASE("penalties leave the caller's logits raw (logprobs are of the model's row)") {
    std::vector<float> l = {2.0f, -1.0f, 0.5f, 1.5f};
    const std::vector<float> before = l;
    SamplingParams p{0.8f, 0, 1.0f, 3};
    p.repeat_penalty = 1.3f;
    p.presence_penalty = 1.0f;
    p.frequency_penalty = 0.5f;
    Sampler s(p);
    for (int i = 0; i < 20; ++i) s.sample(l.data(), 4, std::vector<int32_t>{0, 1, 3});
    CHECK(l == before);
}

TEST_CASE("min-p: keeps the tokens with p >= min_p * p_max, renormalized") {
    const std::vector<double> p = softmax(kLogits, 1.0);
    const double pmax = *std::max_element(p.begin(), p.end());
    for (float min_p : {0.05f, 0.3f, 0.7f}) {
        CAPTURE(min_p);
        std::vector<size_t> keep;
        for (size_t i = 0; i < p.size(); ++i)
            if (p[i] >= double(min_p) * pmax) keep.push_back(i);
        REQUIRE(keep.size() > 1);
        REQUIRE(keep.size() < p.size());  // the filter removes something: the test can fail
        SamplingParams sp{1.0f, 0, 1.0f, 51};
        sp.min_p = min_p;
        const auto counts = draw(sp, kLogits, kDraws);
        int dof = 0;
        const double x = chi2(counts, restrict_to(p, keep), &dof);
        CHECK(dof == int(keep.size()) - 1);
        CHECK(x < chi2_critical(dof));
    }
    // min_p 1: only the most likely token.
    SamplingParams one{1.0f, 0, 1.0f, 5};
    one.min_p = 1.0f;
    const auto counts = draw(one, kLogits, 1000);
    CHECK(counts[order_by_prob(p)[0]] == 1000);
}

TEST_CASE("seed: reproducible with penalties and min-p too") {
    auto run = [](uint64_t seed) {
        SamplingParams p{1.0f, 0, 1.0f, seed};
        p.repeat_penalty = 1.2f;
        p.frequency_penalty = 0.3f;
        p.min_p = 0.05f;
        Sampler s(p);
        std::vector<int32_t> out;
        for (int i = 0; i < 64; ++i) {
            const std::vector<int32_t> recent(out.end() - std::min<ptrdiff_t>(ptrdiff_t(out.size()), 8), out.end());
            out.push_back(s.sample(kLogits.data(), int64_t(kLogits.size()), recent));
        }
        return out;
    };
    CHECK(run(9) == run(9));
    CHECK(run(9) != run(10));
}

TEST_CASE("validate names the bad penalty or min-p") {
    auto bad = [](auto set, const char* flag) {
        SamplingParams p;
        set(p);
        CHECK_THROWS_WITH_AS(p.validate(), doctest::Contains(flag), Error);
    };
    bad([](SamplingParams& p) { p.repeat_penalty = 0.0f; }, "--repeat-penalty");
    bad([](SamplingParams& p) { p.repeat_penalty = NAN; }, "--repeat-penalty");
    bad([](SamplingParams& p) { p.repeat_last_n = -2; }, "--repeat-last-n");
    bad([](SamplingParams& p) { p.presence_penalty = 2.5f; }, "--presence-penalty");
    bad([](SamplingParams& p) { p.frequency_penalty = -2.5f; }, "--frequency-penalty");
    bad([](SamplingParams& p) { p.min_p = 1.5f; }, "--min-p");
    bad([](SamplingParams& p) { p.min_p = -0.1f; }, "--min-p");
}

TEST_CASE("backend selection hooks: penalized() says which rows need the host, draw() is seeded and in [0, 1)") {
    SamplingParams plain{0.8f, 40, 0.9f, 5};
    plain.min_p = 0.1f;  // min-p needs no history: still a backend row
    CHECK_FALSE(Sampler(plain).penalized());
    SamplingParams rep = plain;
    rep.repeat_penalty = 1.1f;
    CHECK(Sampler(rep).penalized());
    rep.repeat_last_n = 0;  // a window of nothing is no penalty
    CHECK_FALSE(Sampler(rep).penalized());
    SamplingParams freq = plain;
    freq.frequency_penalty = 0.5f;
    CHECK(Sampler(freq).penalized());

    auto draws = [&](uint64_t seed) {
        SamplingParams p = plain;
        p.seed = seed;
        Sampler s(p);
        std::vector<float> u;
        for (int i = 0; i < 1000; ++i) u.push_back(s.draw());
        return u;
    };
    const std::vector<float> a = draws(5);
    CHECK(a == draws(5));
    CHECK(a != draws(6));
    for (float u : a) {
        REQUIRE(u >= 0.0f);
        REQUIRE(u < 1.0f);
    }
    const double mean = std::accumulate(a.begin(), a.end(), 0.0) / double(a.size());
    CHECK(mean == doctest::Approx(0.5).epsilon(0.1));  // 1000 uniform draws: sd of the mean ~0.009
    SamplingParams greedy = plain;
    greedy.temperature = 0.0f;
    CHECK(Sampler(greedy).draw() == 0.0f);
}

TEST_CASE("accept() counts backend-picked tokens for the frequency penalty, as sample() does") {
    // Two samplers, one picks through sample(), one is told the same picks through accept():
    // afterwards both penalize the same way, so greedy picks agree.
    SamplingParams p{0.0f, 0, 1.0f, 0};
    p.frequency_penalty = 2.0f;
    std::vector<float> logits = {3.0f, 2.9f, 2.8f, 0.0f};
    Sampler a(p), b(p);
    for (int i = 0; i < 3; ++i) {
        const int32_t t = a.sample(logits.data(), 4);
        b.accept(t);
    }
    CHECK(a.sample(logits.data(), 4) == b.sample(logits.data(), 4));
    Sampler fresh(p);
    CHECK(fresh.sample(logits.data(), 4) == 0);  // without the counts the argmax wins
    Sampler told(p);
    told.accept(0);
    CHECK(told.sample(logits.data(), 4) == 1);  // 3.0 - 2.0 < 2.9
}

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
