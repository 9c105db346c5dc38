// Speculative decoding with a draft model: a small model of the same vocabulary (SmolLM2-135M for a
// larger SmolLM2, a 1B Llama for a 70B one) proposes the next k tokens greedily, and the target checks
// them in one step (Scheduler's drafts, Sampler::verify). Greedy drafts are deterministic given the
// sequence, so the one-hot verification keeps the target's output distribution exact at any
// temperature (vLLM's draft-model path samples drafts and uses min(1, p/q) instead; greedy drafts
// need no draft probabilities on the wire and accept as often at temperature 0).
// The draft runs on the leader only (world rank 0), on its own single-rank engine: each proposal is a
// greedy generate of k tokens over the sequence so far, whose prefix cache keeps the full KV blocks
// of earlier proposals, so a proposal recomputes at most a block's worth of tokens and k decodes.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/engine/client.h"
#include "runtime/engine/engine.h"

namespace lattice {

class DraftModel {
public:
    // `draft`: a single-rank engine (leader) with prefix caching; its vocabulary at most `target_vocab`.
    DraftModel(Engine& draft, int64_t target_vocab);
    // Up to k greedy tokens after `tokens` (fewer near the draft's context end; none past it, nor for a
    // sequence holding an id beyond the draft's vocabulary).
    std::vector<int32_t> propose(std::span<const int32_t> tokens, int64_t k);

private:
    Engine& draft_;
    EngineClient client_;  // its every-rank generate (the draft engine has one rank)
    int64_t max_seq_ = 0, vocab_ = 0;
};

}  // namespace lattice
