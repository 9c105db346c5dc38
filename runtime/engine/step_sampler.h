// StepSampler: the sampler rank's sampling of a step (vLLM v1's Sampler and RejectionSampler, run
// by the ModelRunner on the logits of the last stage's TP rank 0).
// Per sequence it keeps a Sampler (seeded stream, penalties' counts) from its first sampled token
// until the leader says the sequence ended (release). For a step it takes the logits of the sampled
// rows, [rows, vocab] on the backend, in plan order (a speculating sequence n_draft + 1 rows), and
// gives plan.sample_slots() tokens plus the top logprobs asked for:
//   - rows asking for top logprobs, masked by a grammar, or verifying drafts (and every row where the
//     backend cannot select) go to the host: the log-softmax of the raw row, the bans, the mask,
//     Sampler::sample;
//   - the others are picked by Backend::select_tokens (one draw from their sampler each and their
//     penalties as per-id edits), so on CUDA only ids and log-probabilities leave the device.
// Draft verification happens here and only here (verify_drafts): each draft is checked in order by
// Sampler::verify, which keeps the sampled distribution exact, until one is refused.
// Invariant: the same plan and the same logits give the same tokens on every backend that samples
// on the host, and the sampler state advances once per sampled token.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/engine/model_runner.h"
#include "runtime/engine/sampler.h"

namespace lattice {

class StepSampler {
public:
    // One token per sampled sequence of `p` (its drafts verified) from the logits lg [rows, vocab].
    void sample(const StepPlan& p, const View& lg, Backend& be, int64_t vocab, StepResults* out);
    void release(std::span<const int64_t> ids);

    // A speculating sequence's n_draft + 1 rows (row i follows draft i, row 0 the last verified token):
    // each draft checked in order until one is refused, whose row's token replaces it; when all pass,
    // the last row gives one more token. The tokens go to out[0 ..], each with its raw log-softmax;
    // the slots after them stay as they were (-1).
    static void verify_drafts(int32_t n_draft, const int32_t* drafts, float* rows, int64_t V,
                              std::span<const int32_t> bans, Sampler& sampler, SampledToken* out);

private:
    struct Row {
        const PlanSeq* ps;
        std::span<const int32_t> bans, recent;
        Sampler* sampler;
        const uint32_t* mask;   // structured output: the allowed ids' bits (null: all allowed)
        int64_t row = 0;        // its first logit row (n_draft + 1 rows with drafts)
        size_t slot = 0;        // its first token slot in out->tokens
        size_t top = 0;         // its first top logprob in out->top
        const int32_t* drafts;  // n_draft drafted ids (the fed tokens after the first)
    };
    std::vector<Row> plan_rows(const StepPlan& p, int64_t vocab, int64_t* logit_rows, size_t* slots, size_t* tops);
    void sample_on_backend(const std::vector<Row>& rows, const std::vector<int64_t>& picked, const View& lg,
                           Backend& be, int64_t V, StepResults* out);
    void sample_on_host(const Row& r, float* row, int64_t V, StepResults* out);

    std::unordered_map<int64_t, Sampler> samplers_;
    std::vector<float> host_rows_;                      // logits rows sampled on the host
    std::vector<std::vector<TokenPenalty>> penalties_;  // each backend row's penalty edits
};

}  // namespace lattice
