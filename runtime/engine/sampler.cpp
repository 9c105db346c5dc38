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
    LATTICE_CHECK(logprobs >= 0 && logprobs <= kMaxLogprobs, "top logprobs must be in [0, {}], got {}", kMaxLogprobs,
                  logprobs);
}

void top_logprobs(const float* x, int64_t n, double lse, int32_t k, int32_t* ids, float* lps) {
    LATTICE_CHECK(k >= 0 && k <= n, "top_logprobs: {} of a row of {}", k, n);
    if (k == 0) return;
    // A min-heap of the k best so far (the worst on top); `better` is the total order of the result.
    auto better = [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
    std::vector<int32_t> heap;
    heap.reserve(size_t(k));
    for (int32_t i = 0; i < int32_t(n); ++i) {
        if (int32_t(heap.size()) < k) {
            heap.push_back(i);
            std::push_heap(heap.begin(), heap.end(), better);
        } else if (better(i, heap.front())) {
            std::pop_heap(heap.begin(), heap.end(), better);
            heap.back() = i;
            std::push_heap(heap.begin(), heap.end(), better);
        }
    }
    std::sort_heap(heap.begin(), heap.end(), better);
    for (int32_t j = 0; j < k; ++j) {
        ids[j] = heap[size_t(j)];
        lps[j] = float(double(x[heap[size_t(j)]]) - lse);
    }
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

namespace sampling_detail {

bool before_by_weight(const Candidate& a, const Candidate& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
}

size_t nucleus_prefix(std::span<Candidate> c, double mass) {
    // Quickselect on the cumulative weight: [0, lo) is in the nucleus, the cut lies in [lo, hi].
    size_t lo = 0, hi = c.size();
    double need = mass;
    while (hi - lo > 32) {
        const size_t mid = lo + (hi - lo) / 2;
        std::nth_element(c.begin() + ptrdiff_t(lo), c.begin() + ptrdiff_t(mid), c.begin() + ptrdiff_t(hi),
                         before_by_weight);
        double upper = 0;
        for (size_t i = lo; i < mid; ++i) upper += c[i].first;
        if (upper >= need) {
            hi = mid;
        } else {
            need -= upper;
            lo = mid;
        }
    }
    std::sort(c.begin() + ptrdiff_t(lo), c.begin() + ptrdiff_t(hi), before_by_weight);
    double acc = 0;
    size_t k = lo;
    while (k < hi) {
        acc += c[k++].first;
        if (acc >= need) break;
    }
    return k;
}

}  // namespace sampling_detail

// Never sorts the vocabulary: the candidates are the tokens within `window` of the top (scaled)
// logit (the others weigh < e^-window each, together < 2^-24 of the top token alone, below float32's
// resolution of the sums: never drawn before either), top-k is a selection, top-p a quickselect on
// the cumulative weight, min-p a filter (the top token weighs exp(0) = 1 and is always kept).
int32_t Sampler::sample_scaled(const float* logits, int64_t n) {
    using sampling_detail::Candidate;
    using sampling_detail::before_by_weight;
    const float t = p_.temperature;
    cand_.clear();
    if (p_.top_k > 0 && p_.top_k < n) {
        // The k most likely in one pass: a heap whose top is the least likely kept (logit order is
        // the scaled order, T > 0); most tokens cost one comparison with it.
        const size_t k = size_t(p_.top_k);
        for (int64_t i = 0; i < n; ++i) {
            const Candidate c{logits[i], int32_t(i)};
            if (cand_.size() < k) {
                cand_.push_back(c);
                std::push_heap(cand_.begin(), cand_.end(), before_by_weight);
            } else if (before_by_weight(c, cand_.front())) {
                std::pop_heap(cand_.begin(), cand_.end(), before_by_weight);
                cand_.back() = c;
                std::push_heap(cand_.begin(), cand_.end(), before_by_weight);
            }
        }
        float top = cand_.front().first;
        for (const Candidate& c : cand_) top = std::max(top, c.first);
        // (logit - max) / T is <= 0 for every T > 0: a tiny temperature (1e-38) sends the others to
        // -inf (weight 0, i.e. greedy) instead of overflowing logit / T to inf and inf - inf to NaN.
        for (Candidate& c : cand_) c.first = (c.first - top) / t;
    } else {
        const float top = logits[argmax(logits, n)];
        // min-p drops tokens below min_p of the top's probability anyway: a narrower window (not with
        // top-p, whose nucleus is a share of every token's mass).
        float window = float(std::log(double(n)) + 24.0 * std::log(2.0));
        if (p_.min_p > 0.0f && p_.top_p >= 1.0f) window = std::min(window, -std::log(p_.min_p) + 1e-3f);
        const float floor = top - window * t;
        for (int64_t i = 0; i < n; ++i)
            if (logits[i] >= floor) cand_.push_back({(logits[i] - top) / t, int32_t(i)});
    }
    double sum = 0;
    for (Candidate& c : cand_) {
        c.first = std::exp(c.first);
        sum += c.first;
    }
    if (p_.top_p < 1.0f) cand_.resize(sampling_detail::nucleus_prefix(cand_, double(p_.top_p) * sum));
    if (p_.min_p > 0.0f)
        std::erase_if(cand_, [&](const Candidate& c) { return double(c.first) < double(p_.min_p); });
    sum = 0;
    for (const Candidate& c : cand_) sum += c.first;
    std::uniform_real_distribution<double> u(0.0, sum);
    const double r = u(rng_);
    double acc = 0;
    for (const Candidate& c : cand_) {
        acc += c.first;
        if (r < acc) return c.second;
    }
    return cand_.back().second;
}

int32_t Sampler::sample(const float* raw, int64_t n, std::span<const int32_t> recent) {
    const float* logits = penalize(raw, n, recent);
    const int32_t chosen = p_.temperature == 0.0f ? argmax(logits, n) : sample_scaled(logits, n);
    if (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) ++counts_[chosen];
    return chosen;
}

}  // namespace lattice
