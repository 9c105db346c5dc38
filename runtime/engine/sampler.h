// Sampler: picks the next token from a row of logits on the host. The order, per token:
//  1. penalties on a copy of the row (the caller's logits stay raw: logprobs are of the model's row):
//     - repetition (llama.cpp's repeat_penalty): each distinct id among the last repeat_last_n
//       tokens of the sequence (prompt and output; the caller passes them as `recent`) has its logit
//       divided by repeat_penalty when positive, multiplied when negative (1: off);
//     - presence / frequency (OpenAI's): logit -= frequency_penalty * count + presence_penalty *
//       (count > 0), where count is how often the id was generated so far: the tokens this Sampler
//       returned (one Sampler per sequence; every token it returns is taken as generated);
//  2. temperature == 0: greedy, the argmax of the penalized row (lowest id on ties). Otherwise:
//     (logits - max) / temperature (stable for any temperature > 0: a tiny one gives the argmax,
//     never inf or NaN);
//  3. keep the top_k most likely (0 = all), then the smallest set whose probability reaches top_p
//     (1 = all), then the ids with p >= min_p * p_max (0 = all; p_max is the most likely token,
//     which is always kept, so min_p and top_p intersect in either order);
//  4. renormalize, draw with a seeded mt19937_64 — the same seed gives the same tokens on every run.
// Cost: no sort of the vocabulary (top-k by a one-pass selection; otherwise the row's weights in one
// vectorized pass, a top-p set's edge by a histogram of the weights, the draw by a scan in id order);
// tokens more than ln(vocab) + 24 ln 2 below the top scaled logit, which together weigh less than
// 2^-24 of the top token, are never candidates.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/backend/backend.h"

namespace lattice {

struct SamplingParams {
    float temperature = 0.0f;
    int64_t top_k = 0;
    float top_p = 1.0f;
    uint64_t seed = 0;
    float repeat_penalty = 1.0f;   // > 0; 1: off
    int64_t repeat_last_n = 64;    // window of the repetition penalty; 0: off, -1: the whole sequence
    float presence_penalty = 0.0f;   // [-2, 2]
    float frequency_penalty = 0.0f;  // [-2, 2]
    float min_p = 0.0f;              // [0, 1]; 0: off
    int32_t logprobs = 0;  // [0, kMaxLogprobs]: the k most likely tokens of the raw row are returned with
                           // each sampled token (their log-softmax; sampling itself is unchanged)
    static constexpr int32_t kMaxLogprobs = 20;
    void validate() const;  // throws Error naming the bad value
    // The repetition penalty looks at the sequence's last tokens (the caller must pass them).
    bool uses_recent() const { return repeat_penalty != 1.0f && repeat_last_n != 0; }
    // How many of the sequence's last tokens the repetition penalty reads (max_seq for -1).
    int64_t recent_window(int64_t max_seq) const { return !uses_recent() ? 0 : repeat_last_n < 0 ? max_seq : repeat_last_n; }
};

int32_t argmax(const float* logits, int64_t n);

// Structured output: sets logits[id] = -inf for every id whose bit (id % 32 of words[id / 32]) is
// clear. A mask without any bit set in [0, n) leaves the row as it is (the caller's grammar then
// refuses whatever is sampled and ends the output).
void apply_token_mask(float* logits, int64_t n, const uint32_t* words);

// The k most likely ids of `logits` (k <= n) and their log-probabilities logits[id] - lse, most
// likely first, equal logits by lower id (the order OpenAI's top_logprobs lists). O(n log k).
void top_logprobs(const float* logits, int64_t n, double lse, int32_t k, int32_t* ids, float* lps);

// Sampling internals, public for their tests.
namespace sampling_detail {
using Candidate = std::pair<float, int32_t>;  // weight (or scaled logit), token id
// Larger weight first, equal weights by lower id (a total order: kept sets are exact, ties included).
bool before_by_weight(const Candidate& a, const Candidate& b);
// Reorders `c` so that its first k entries are the shortest prefix of `c` in before_by_weight order
// whose weights sum to at least `mass`, and returns k (c.size() when they never do). Expected O(n):
// a quickselect on the cumulative weight, sorting at most a few dozen entries.
size_t nucleus_prefix(std::span<Candidate> c, double mass);
}  // namespace sampling_detail

class Sampler {
public:
    explicit Sampler(const SamplingParams& p);
    // `recent`: the sequence's last recent_window() tokens (fewer at its start); ignored when the
    // repetition penalty is off. Ids outside [0, n) are ignored.
    int32_t sample(const float* logits, int64_t n, std::span<const int32_t> recent = {});
    // Speculative decoding's check of a drafted token (one proposed deterministically, e.g. by n-gram
    // lookup): greedy returns the argmax, accepted when it is the draft. Otherwise, with p the
    // distribution sample() draws from: the draft is accepted with probability p(draft), else a token
    // is drawn from p without the draft, renormalized, so the returned token follows p exactly
    // (rejection sampling with a one-hot draft distribution). Not for penalized sequences (Error).
    int32_t verify(const float* logits, int64_t n, int32_t draft, bool* accepted);

    // For a backend that selects the token itself (Backend::select_tokens): whether this sequence
    // needs its history on the host (a penalty is on), then one uniform [0, 1) draw from the
    // sequence's generator per token, and the token picked (for the penalties' counts).
    bool penalized() const {
        return p_.uses_recent() || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f;
    }
    const SamplingParams& params() const { return p_; }
    // The penalties of this sequence's next token as per-id edits for Backend::select_tokens (the
    // same ids and values penalize() applies on the host): each distinct id of `recent` in [0, n)
    // with repeat set when the repetition penalty is on, each generated id with its presence and
    // frequency term. Cleared first; empty when no penalty applies.
    void penalty_list(std::span<const int32_t> recent, int64_t n, std::vector<TokenPenalty>& out);
    float draw();
    void accept(int32_t token);

private:
    const float* penalize(const float* logits, int64_t n, std::span<const int32_t> recent);
    int32_t sample_scaled(const float* logits, int64_t n);  // temperature > 0
    // The kept set of a row at temperature > 0 (top-k candidates, or the row's weights over a threshold),
    // its weights summed; then a draw at r in [0, that sum), the weight of an id in it, its removal.
    double prepare_scaled(const float* logits, int64_t n);
    double prepare_top_k(const float* logits, int64_t n);  // ... with 0 < top_k < n
    int32_t draw_prepared(int64_t n, double r) const;
    double kept_weight(int32_t id, int64_t n) const;
    void remove_kept(int32_t id);

    SamplingParams p_;
    std::mt19937_64 rng_;
    std::vector<sampling_detail::Candidate> cand_;
    bool top_k_mode_ = false;                       // the prepared set is cand_ (else weights_ >= thr_)
    float thr_ = 0.0f;
    std::vector<float> weights_;                    // the row's weights (no top-k)
    std::vector<double> hist_;                      // top-p's histogram of the weights
    std::vector<uint16_t> keys_;                    // ... each weight's bucket
    std::vector<double> blocks_;                    // the kept weights' sum per block
    std::vector<float> work_;                       // the penalized row
    std::unordered_map<int32_t, int32_t> counts_;   // generated id -> times (presence / frequency)
    std::vector<int32_t> seen_;                     // scratch: distinct ids of `recent`
};

}  // namespace lattice
