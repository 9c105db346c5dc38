// Sampler (runtime/engine/sampler.h): greedy ties, parameter validation, seeding, and the
// distributions it draws from — empirical frequencies over many draws against the exact
// distribution (temperature softmax, renormalized top-k set, renormalized top-p nucleus) with a
// chi-square test at a 1e-4 false-alarm level (sampler_test_util.h). Seeds are fixed, so every run draws
// the same tokens: the statistics decide once whether the algorithm is right, they do not flake. Then the
// penalties (repetition: llama.cpp's, once per distinct id of the window; presence / frequency: OpenAI's,
// over the tokens the sampler produced) moving the argmax exactly where the formulas say, min-p's kept
// set, the caller's logits left raw, and the backend selection hooks. Large rows, the token mask and
// verify() are test_sampler_rows.cpp's.
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
