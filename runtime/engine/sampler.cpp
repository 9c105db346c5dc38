// Sampler implementation (see sampler.h).
#include "runtime/engine/sampler.h"
#include "runtime/backend/backend.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "base/error.h"
#include "kernels/common/fast_exp.h"
#include "kernels/common/multiversion.h"

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

void apply_token_mask(float* logits, int64_t n, const uint32_t* words) {
    const int64_t nw = (n + 31) / 32;
    uint32_t any = 0;
    for (int64_t w = 0; w < nw; ++w) any |= words[w] & (w == nw - 1 && n % 32 ? (1u << (n % 32)) - 1 : ~0u);
    if (!any) return;
    for (int64_t w = 0; w < nw; ++w) {
        const uint32_t bits = words[w];
        if (bits == ~0u) continue;
        const int64_t base = w * 32, end = std::min<int64_t>(base + 32, n);
        for (int64_t id = base; id < end; ++id)
            if (!(bits >> (id - base) & 1u)) logits[id] = -INFINITY;
    }
}

int32_t argmax(const float* x, int64_t n) {
    return host_argmax(x, n);
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

void Sampler::penalty_list(std::span<const int32_t> recent, int64_t n, std::vector<TokenPenalty>& out) {
    out.clear();
    const bool rep = p_.uses_recent() && !recent.empty();
    const bool other = (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) && !counts_.empty();
    if (rep) {
        // Each distinct id once, as penalize() does (llama.cpp's semantics); out's ids then sorted.
        seen_.assign(recent.begin(), recent.end());
        std::sort(seen_.begin(), seen_.end());
        seen_.erase(std::unique(seen_.begin(), seen_.end()), seen_.end());
        for (int32_t t : seen_)
            if (t >= 0 && t < n) out.push_back(TokenPenalty{t, 1, 0.0f});
    }
    if (!other) return;
    const size_t n_rep = out.size();  // out[0, n_rep): the repetition entries, sorted by id
    for (const auto& [t, c] : counts_) {
        if (t < 0 || t >= n) continue;
        const float sub = p_.frequency_penalty * float(c) + p_.presence_penalty;
        // An id of the window too: one edit with both.
        const auto it = std::lower_bound(out.begin(), out.begin() + ptrdiff_t(n_rep), t,
                                         [](const TokenPenalty& e, int32_t id) { return e.id < id; });
        if (it != out.begin() + ptrdiff_t(n_rep) && it->id == t)
            it->sub = sub;
        else
            out.push_back(TokenPenalty{t, 0, sub});
    }
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

namespace {

// The loops below keep kLanes independent partial results (sums in float over one block of kBlock
// weights, blocks summed in double): they vectorize without -ffast-math, which the project does not
// use, and a block's float sum of <= 256 weights in (0, 1] is exact to ~1e-5 of itself.
constexpr int kLanes = 16;
constexpr int64_t kBlock = 256;

LATTICE_MULTIVERSION float row_max(const float* x, int64_t n) {
    float m[kLanes];
    for (int j = 0; j < kLanes; ++j) m[j] = x[0];
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (int j = 0; j < kLanes; ++j) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    float top = m[0];
    for (int j = 1; j < kLanes; ++j) top = std::max(top, m[j]);
    for (; i < n; ++i) top = std::max(top, x[i]);
    return top;
}

// w[i] = e^((x[i] - top) / t) for x[i] >= floor, else exactly 0 (n rounded up to whole blocks: the
// padding weighs 0). Returns the sum of w.
LATTICE_MULTIVERSION double scaled_weights(const float* __restrict x, int64_t n, float top, float t, float floor,
                                           float* __restrict w) {
    double sum = 0;
    for (int64_t b = 0; b < n; b += kBlock) {
        float acc[kLanes] = {};
        const int64_t len = std::min(kBlock, n - b);
        if (len == kBlock) {
            for (int64_t i = b; i < b + kBlock; i += kLanes)
                for (int j = 0; j < kLanes; ++j) {
                    const float v = x[i + j];
                    const float y = exp_neg((v - top) / t);
                    w[i + j] = v >= floor ? y : 0.0f;
                    acc[j] += w[i + j];
                }
        } else {
            for (int64_t i = b; i < b + kBlock; ++i) {
                w[i] = i < n && x[i] >= floor ? exp_neg((x[i] - top) / t) : 0.0f;
                acc[0] += w[i];
            }
        }
        for (int j = 0; j < kLanes; ++j) sum += double(acc[j]);
    }
    return sum;
}

// Per block of kBlock weights, the sum of those >= thr (and > 0), into blocks[]; returns their sum.
LATTICE_MULTIVERSION double kept_blocks(const float* __restrict w, int64_t padded, float thr,
                                        double* __restrict blocks) {
    double sum = 0;
    for (int64_t b = 0; b < padded; b += kBlock) {
        float acc[kLanes] = {};
        for (int64_t i = b; i < b + kBlock; i += kLanes)
            for (int j = 0; j < kLanes; ++j) acc[j] += w[i + j] >= thr ? w[i + j] : 0.0f;
        double s = 0;
        for (int j = 0; j < kLanes; ++j) s += double(acc[j]);
        blocks[b / kBlock] = s;
        sum += s;
    }
    return sum;
}

// The first id, in id order, at which the running sum of the kept weights (>= thr, > 0) passes r:
// whole blocks are passed by their sums, one block is walked. Rounding can leave r at the very end:
// the last kept id then.
int32_t draw_in_order(const float* w, int64_t n, float thr, const double* blocks, double r) {
    const int64_t nb = (n + kBlock - 1) / kBlock;
    double acc = 0;
    int64_t b = 0;
    while (b + 1 < nb && acc + blocks[b] <= r) acc += blocks[b++];
    int64_t last = -1;
    for (int64_t i = b * kBlock; i < n; ++i) {
        if (!(w[i] >= thr && w[i] > 0)) continue;
        acc += double(w[i]);
        last = i;
        if (r < acc) return int32_t(i);
    }
    for (int64_t i = std::min(n, b * kBlock) - 1; last < 0 && i >= 0; --i)  // r past the end: the last kept
        if (w[i] >= thr && w[i] > 0) last = i;
    return int32_t(last);
}

// The float bits of a weight in (0, 1] grow with its value: their top bits are a histogram key in
// weight order (kShift: 7 mantissa bits, buckets 1/128 of an octave wide).
constexpr int kShift = 16;
inline uint32_t weight_key(float v) { return std::bit_cast<uint32_t>(v) >> kShift; }

// Whether any of x[0 .. kLanes) is above thr (vectorized).
LATTICE_MULTIVERSION bool any_above(const float* __restrict x, float thr) {
    int hit = 0;
    for (int j = 0; j < kLanes; ++j) hit |= x[j] > thr;
    return hit != 0;
}

// Histogram keys of the weights, in one vectorized pass: key[i] = max(weight_key(w[i]), lo) - lo.
LATTICE_MULTIVERSION void weight_keys(const float* __restrict w, int64_t n, uint32_t lo, uint16_t* __restrict key) {
    for (int64_t i = 0; i < n; ++i) {
        const uint32_t k = std::bit_cast<uint32_t>(w[i]) >> kShift;
        key[i] = uint16_t((k > lo ? k : lo) - lo);
    }
}

// Whether any of key[i .. i + kLanes) equals `edge` (vectorized; the collection below descends into
// the groups that do).
LATTICE_MULTIVERSION bool any_key(const uint16_t* __restrict key, uint16_t edge) {
    int hit = 0;
    for (int j = 0; j < kLanes; ++j) hit |= key[j] == edge;
    return hit != 0;
}

// The edge of top-p's nucleus: the shortest prefix of the weights, in before_by_weight order, whose
// sum reaches `mass`. A histogram of the weights by weight_key (two interleaved ones: no
// store-to-load chain on a popular bucket): every bucket above the edge's is wholly inside; only the
// edge bucket's weights are collected and selected (nucleus_prefix). Returns the edge weight: the kept
// set is w >= edge, after equal weights of higher ids than the prefix's last were zeroed in w (ties go
// by id). Nonzero weights are >= e^-window (lower keys are clamped into the lowest bucket).
float nucleus_edge(float* w, int64_t n, double mass, float window, std::vector<double>& hist,
                   std::vector<uint16_t>& keys, std::vector<sampling_detail::Candidate>& cand) {
    using sampling_detail::before_by_weight;
    const uint32_t hi = weight_key(1.0f);
    const uint32_t lo = std::min(hi, weight_key(exp_neg(-window - 1.0f)));
    const size_t buckets = size_t(hi - lo) + 1;
    keys.resize(size_t(n));
    weight_keys(w, n, lo, keys.data());
    const uint16_t* key = keys.data();
    hist.assign(buckets * 2, 0.0);
    double* h0 = hist.data();
    double* h1 = h0 + buckets;
    int64_t i = 0;
    for (; i + 1 < n; i += 2) {
        h0[key[i]] += double(w[i]);
        h1[key[i + 1]] += double(w[i + 1]);
    }
    if (i < n) h0[key[i]] += double(w[i]);
    double above = 0;
    size_t edge = 0;
    for (size_t b = buckets; b-- > 0;) {
        const double in = h0[b] + h1[b];
        if (above + in >= mass || b == 0) {
            edge = b;
            break;
        }
        above += in;
    }
    cand.clear();
    const uint16_t e = uint16_t(edge);
    for (int64_t g = 0; g < n; g += kLanes) {
        if (g + kLanes <= n && !any_key(key + g, e)) continue;
        for (int64_t j = g; j < std::min(n, g + kLanes); ++j)
            if (key[j] == e && w[j] > 0) cand.push_back({w[j], int32_t(j)});
    }
    if (cand.empty()) return 0.0f;  // (rounding left the mass below the edge bucket: keep every weight)
    const size_t m = sampling_detail::nucleus_prefix(cand, std::max(mass - above, 0.0));
    // The prefix's last entry in before_by_weight order is the edge: larger weights, and equal weights
    // of lower ids, are in; equal weights of higher ids are out.
    size_t last = 0;
    for (size_t j = 1; j < m; ++j)
        if (before_by_weight(cand[last], cand[j])) last = j;
    const float cut = cand[last].first;
    for (size_t j = m; j < cand.size(); ++j)
        if (cand[j].first == cut) w[cand[j].second] = 0.0f;
    return cut;
}

}  // namespace

// Never sorts the vocabulary. With top-k: a one-pass k-heap, then the k candidates as below. Without:
// the weights of the whole row in one vectorized pass (tokens more than `window` below the top scaled
// logit weigh 0: each < e^-window, together < 2^-24 of the top token alone, below float32's
// resolution of the sums: never drawn before either); top-p's exact nucleus by a histogram of the
// weights' float bits (the bucket holding the nucleus's edge is the only one sorted, via
// nucleus_prefix); min-p a threshold (the top token weighs exp(0) = 1 and is always kept); the draw
// a scan in id order over the kept weights.
double Sampler::prepare_scaled(const float* logits, int64_t n) {
    const float t = p_.temperature;
    if (p_.top_k > 0 && p_.top_k < n) return prepare_top_k(logits, n);
    top_k_mode_ = false;
    const float top = row_max(logits, n);
    // min-p drops tokens below min_p of the top's probability anyway: a narrower window (not with
    // top-p, whose nucleus is a share of every token's mass).
    float window = float(std::log(double(n)) + 24.0 * std::log(2.0));
    if (p_.min_p > 0.0f && p_.top_p >= 1.0f) window = std::min(window, -std::log(p_.min_p) + 1e-3f);
    // (logit - max) / T is <= 0 for every T > 0: a tiny temperature (1e-38) sends the others to
    // weight 0 (greedy) instead of overflowing logit / T to inf and inf - inf to NaN.
    const float floor = top - window * t;
    const int64_t padded = (n + kBlock - 1) / kBlock * kBlock;
    weights_.resize(size_t(padded));
    float* w = weights_.data();
    const double sum = scaled_weights(logits, n, top, t, floor, w);
    thr_ = p_.min_p;
    if (p_.top_p < 1.0f)
        thr_ = std::max(thr_, nucleus_edge(w, n, double(p_.top_p) * sum, window, hist_, keys_, cand_));
    blocks_.resize(size_t(padded / kBlock));
    return kept_blocks(w, padded, thr_, blocks_.data());
}

int32_t Sampler::draw_prepared(int64_t n, double r) const {
    if (!top_k_mode_) return draw_in_order(weights_.data(), n, thr_, blocks_.data(), r);
    double acc = 0;
    for (const sampling_detail::Candidate& c : cand_) {
        acc += c.first;
        if (r < acc) return c.second;
    }
    return cand_.back().second;
}

double Sampler::kept_weight(int32_t id, int64_t n) const {
    if (id < 0 || id >= n) return 0.0;
    if (top_k_mode_) {
        for (const sampling_detail::Candidate& c : cand_)
            if (c.second == id) return c.first;
        return 0.0;
    }
    const float w = weights_[size_t(id)];
    return w >= thr_ && w > 0 ? double(w) : 0.0;
}

void Sampler::remove_kept(int32_t id) {
    if (top_k_mode_) {
        std::erase_if(cand_, [&](const sampling_detail::Candidate& c) { return c.second == id; });
        return;
    }
    blocks_[size_t(id / kBlock)] -= double(weights_[size_t(id)]);
    weights_[size_t(id)] = 0.0f;
}

// Never sorts the vocabulary. With top-k: a one-pass k-heap, then the k candidates as below. Without:
// the weights of the whole row in one vectorized pass (tokens more than `window` below the top scaled
// logit weigh 0: each < e^-window, together < 2^-24 of the top token alone, below float32's
// resolution of the sums: never drawn before either); top-p's exact nucleus by a histogram of the
// weights' float bits (the bucket holding the nucleus's edge is the only one sorted, via
// nucleus_prefix); min-p a threshold (the top token weighs exp(0) = 1 and is always kept); the draw
// a scan in id order over the kept weights.
int32_t Sampler::sample_scaled(const float* logits, int64_t n) {
    const double kept = prepare_scaled(logits, n);
    std::uniform_real_distribution<double> u(0.0, kept);
    return draw_prepared(n, u(rng_));
}

// top-k: the k most likely in one pass, a heap whose top is the least likely kept (logit order is
// the scaled order, T > 0); most tokens cost one comparison with it. Then top-p (a quickselect on the
// k) and min-p as filters; the kept candidates' weights sum is returned (the draw scans them).
double Sampler::prepare_top_k(const float* logits, int64_t n) {
    using sampling_detail::Candidate;
    using sampling_detail::before_by_weight;
    top_k_mode_ = true;
    const float t = p_.temperature;
    cand_.clear();
    const size_t k = size_t(p_.top_k);
    for (int64_t g = 0; g < n; g += kLanes) {
        // Once the heap is full, a group of logits none of which beats its least likely is passed
        // whole (a later equal logit has a higher id: it never beats an equal one held).
        if (cand_.size() == k && g + kLanes <= n && !any_above(logits + g, cand_.front().first)) continue;
        for (int64_t i = g; i < std::min(n, g + kLanes); ++i) {
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
    }
    float top = cand_.front().first;
    for (const Candidate& c : cand_) top = std::max(top, c.first);
    double sum = 0;
    for (Candidate& c : cand_) {
        c.first = std::exp((c.first - top) / t);
        sum += c.first;
    }
    if (p_.top_p < 1.0f) cand_.resize(sampling_detail::nucleus_prefix(cand_, double(p_.top_p) * sum));
    if (p_.min_p > 0.0f)
        std::erase_if(cand_, [&](const Candidate& c) { return double(c.first) < double(p_.min_p); });
    sum = 0;
    for (const Candidate& c : cand_) sum += c.first;
    return sum;
}

int32_t Sampler::verify(const float* logits, int64_t n, int32_t draft, bool* accepted) {
    LATTICE_CHECK(!penalized(), "Sampler::verify: a penalized sequence does not speculate");
    if (p_.temperature == 0.0f) {
        const int32_t t = argmax(logits, n);
        *accepted = t == draft;
        return t;
    }
    double kept = prepare_scaled(logits, n);
    const double wd = kept_weight(draft, n);
    if (wd > 0) {
        std::uniform_real_distribution<double> u(0.0, kept);
        if (u(rng_) < wd) {  // with probability p(draft) = wd / kept
            *accepted = true;
            return draft;
        }
        remove_kept(draft);
        kept -= wd;
    }
    *accepted = false;
    std::uniform_real_distribution<double> u(0.0, kept);  // p with the draft removed, renormalized
    return draw_prepared(n, u(rng_));
}

int32_t Sampler::sample(const float* raw, int64_t n, std::span<const int32_t> recent) {
    const float* logits = penalize(raw, n, recent);
    const int32_t chosen = p_.temperature == 0.0f ? argmax(logits, n) : sample_scaled(logits, n);
    if (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) ++counts_[chosen];
    return chosen;
}

}  // namespace lattice
