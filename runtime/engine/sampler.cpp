// Sampler implementation (see sampler.h).
#include "runtime/engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"

namespace lattice {

void SamplingParams::validate() const {
    LATTICE_CHECK(std::isfinite(temperature) && temperature >= 0.0f, "--temperature must be >= 0, got {}", temperature);
    LATTICE_CHECK(top_k >= 0, "--top-k must be >= 0, got {}", top_k);
    LATTICE_CHECK(std::isfinite(top_p) && top_p > 0.0f && top_p <= 1.0f, "--top-p must be in (0, 1], got {}", top_p);
}

int32_t argmax(const float* x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i)
        if (x[i] > x[best]) best = i;
    return int32_t(best);
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {
    p_.validate();
}

int32_t Sampler::sample(const float* logits, int64_t n) {
    if (p_.temperature == 0.0f) return argmax(logits, n);
    cand_.resize(size_t(n));
    // (logit - max) / T is <= 0 for every T > 0: a tiny temperature (1e-38) sends the others to -inf
    // (probability 0, i.e. greedy) instead of overflowing logit / T to inf and inf - inf to NaN.
    const float top = logits[argmax(logits, n)];
    for (int64_t i = 0; i < n; ++i) cand_[size_t(i)] = {(logits[i] - top) / p_.temperature, int32_t(i)};
    auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
    size_t keep = cand_.size();
    if (p_.top_k > 0 && size_t(p_.top_k) < keep) {
        keep = size_t(p_.top_k);
        std::partial_sort(cand_.begin(), cand_.begin() + ptrdiff_t(keep), cand_.end(), by_logit);
    } else {
        std::sort(cand_.begin(), cand_.end(), by_logit);
    }
    cand_.resize(keep);
    const float mx = cand_[0].first;
    double sum = 0;
    for (auto& c : cand_) {
        c.first = std::exp(c.first - mx);
        sum += c.first;
    }
    if (p_.top_p < 1.0f) {
        double acc = 0;
        size_t k = 0;
        while (k < cand_.size()) {
            acc += cand_[k].first / sum;
            ++k;
            if (acc >= p_.top_p) break;
        }
        cand_.resize(k);
        sum = 0;
        for (auto& c : cand_) sum += c.first;
    }
    std::uniform_real_distribution<double> u(0.0, sum);
    double r = u(rng_), acc = 0;
    for (auto& c : cand_) {
        acc += c.first;
        if (r < acc) return c.second;
    }
    return cand_.back().second;
}

}  // namespace lattice
