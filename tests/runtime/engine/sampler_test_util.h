// Helpers of the sampler tests (test_sampler.cpp, test_sampler_rows.cpp): n seeded draws counted per id, the
// Pearson chi-square of the counts against exact probabilities (tokens outside the support must never be
// drawn) and its critical value at a 1e-4 false-alarm level, softmax at a temperature, a kept set
// renormalized, ids by descending probability, and a small row of logits. Header-only, doctest's assertions.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "runtime/engine/sampler.h"

namespace lattice::sampler_test {

// Upper quantile of chi-square with k degrees of freedom at alpha = 1e-4 (Wilson-Hilferty; z = 3.719).
inline double chi2_critical(int k) {
    const double z = 3.719, a = 2.0 / (9.0 * k);
    return k * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// Draws n tokens; returns counts per token id.
inline std::vector<int64_t> draw(const SamplingParams& p, const std::vector<float>& logits, int n) {
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
inline double chi2(const std::vector<int64_t>& counts, const std::vector<double>& p, int* dof) {
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

inline std::vector<double> softmax(const std::vector<float>& l, double t) {
    std::vector<double> p(l.size());
    const double mx = *std::max_element(l.begin(), l.end());
    double z = 0;
    for (size_t i = 0; i < l.size(); ++i) z += p[i] = std::exp((l[i] - mx) / t);
    for (auto& v : p) v /= z;
    return p;
}

// Keeps the given ids (by descending probability rule computed by the caller) and renormalizes.
inline std::vector<double> restrict_to(std::vector<double> p, const std::vector<size_t>& keep) {
    std::vector<double> out(p.size(), 0.0);
    double z = 0;
    for (size_t i : keep) z += p[i];
    for (size_t i : keep) out[i] = p[i] / z;
    return out;
}

inline std::vector<size_t> order_by_prob(const std::vector<double>& p) {
    std::vector<size_t> idx(p.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
    return idx;
}

// A small row with distinct logits, and the draws per frequency test (chi-square at 1e-4).
inline const std::vector<float> kLogits = {1.0f, 2.5f, -0.5f, 0.3f, 2.0f, -3.0f, 1.7f, 0.9f, -1.2f, 2.2f};
constexpr int kDraws = 40000;

}  // namespace lattice::sampler_test
