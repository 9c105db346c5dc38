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
    LATTICE_CHECK(std::isfinite(repeat_penalty) && repeat_penalty > 0.0f, "--repeat-penalty must be > 0, got {}",
                  repeat_penalty);
    LATTICE_CHECK(repeat_last_n >= -1, "--repeat-last-n must be >= -1 (-1: the whole sequence), got {}", repeat_last_n);
    LATTICE_CHECK(std::isfinite(presence_penalty) && presence_penalty >= -2.0f && presence_penalty <= 2.0f,
                  "--presence-penalty must be in [-2, 2], got {}", presence_penalty);
    LATTICE_CHECK(std::isfinite(frequency_penalty) && frequency_penalty >= -2.0f && frequency_penalty <= 2.0f,
                  "--frequency-penalty must be in [-2, 2], got {}", frequency_penalty);
    LATTICE_CHECK(std::isfinite(min_p) && min_p >= 0.0f && min_p <= 1.0f, "--min-p must be in [0, 1], got {}", min_p);
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

// Returns the row to sample from: `logits` itself when no penalty applies, else a penalized copy.
const float* Sampler::penalize(const float* logits, int64_t n, std::span<const int32_t> recent) {
    const bool rep = p_.uses_recent() && !recent.empty();
    const bool other = (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) && !counts_.empty();
    if (!rep && !other) return logits;
    work_.assign(logits, logits + n);
    if (rep) {
        // Each distinct id once (llama.cpp's semantics), however often it occurs in the window.
        seen_.assign(recent.begin(), recent.end());
        std::sort(seen_.begin(), seen_.end());
        seen_.erase(std::unique(seen_.begin(), seen_.end()), seen_.end());
        for (int32_t t : seen_) {
            if (t < 0 || t >= n) continue;
            float& l = work_[size_t(t)];
            l = l > 0 ? l / p_.repeat_penalty : l * p_.repeat_penalty;
        }
    }
    if (other)
        for (const auto& [t, c] : counts_)
            if (t >= 0 && t < n) work_[size_t(t)] -= p_.frequency_penalty * float(c) + p_.presence_penalty;
    return work_.data();
}

float Sampler::draw() {
    if (p_.temperature == 0.0f) return 0.0f;  // greedy draws nothing, as sample() does
    // 24 random bits: a float in [0, 1) exactly (no rounding up to 1).
    return float(rng_() >> 40) * 0x1p-24f;
}

void Sampler::accept(int32_t token) {
    if (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) ++counts_[token];
}

int32_t Sampler::sample(const float* raw, int64_t n, std::span<const int32_t> recent) {
    const float* logits = penalize(raw, n, recent);
    int32_t chosen = -1;
    if (p_.temperature == 0.0f) {
        chosen = argmax(logits, n);
    } else {
        cand_.resize(size_t(n));
        // (logit - max) / T is <= 0 for every T > 0: a tiny temperature (1e-38) sends the others to -inf
        // (probability 0, i.e. greedy) instead of overflowing logit / T to inf and inf - inf to NaN.
        const float top = logits[argmax(logits, n)];
        for (int64_t i = 0; i < n; ++i) cand_[size_t(i)] = {(logits[i] - top) / p_.temperature, int32_t(i)};
        auto by_logit = [](const auto& a, const auto& b) {
            return a.first > b.first || (a.first == b.first && a.second < b.second);
        };
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
        }
        if (p_.min_p > 0.0f) {
            // cand_ is sorted: cand_[0] holds p_max (weight exp(0) = 1), the rest follow in order.
            const double floor = double(p_.min_p) * double(cand_[0].first);
            size_t k = 1;
            while (k < cand_.size() && double(cand_[k].first) >= floor) ++k;
            cand_.resize(k);
        }
        sum = 0;
        for (auto& c : cand_) sum += c.first;
        std::uniform_real_distribution<double> u(0.0, sum);
        double r = u(rng_), acc = 0;
        chosen = cand_.back().second;
        for (auto& c : cand_) {
            acc += c.first;
            if (r < acc) {
                chosen = c.second;
                break;
            }
        }
    }
    if (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) ++counts_[chosen];
    return chosen;
}

}  // namespace lattice
