// Draft proposals for speculative decoding without a second model: prompt lookup (n-gram), as vLLM's
// ngram proposer and llama.cpp's lookup decoding. Text that repeats its context (summaries, edits,
// code, a rewritten paragraph) continues as it did before: find the last n tokens of the sequence
// earlier in it and propose the tokens that followed them there. The target model checks every draft
// in the same step (runtime/engine/sampler.h Sampler::verify), so drafts change speed, never the output
// distribution.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace lattice {

// A proposer of drafts (the leader's): up to k tokens to follow `tokens` (a sequence's tokens so far).
// Prompt lookup (ngram_drafts) when none is given; a draft model (draft_model.h) or a test's otherwise.
// The drafts are checked in one place, the sampler rank's StepSampler::verify_drafts (step_sampler.h).
using DraftProposer = std::function<std::vector<int32_t>(std::span<const int32_t> tokens, int64_t k)>;

// Up to k drafts for the sequence `tokens` (prompt and output so far): for n from max_n down to min_n,
// the most recent earlier occurrence of its last n tokens that has a token after it; the up to k
// tokens that follow that occurrence. Empty when no suffix of min_n or more tokens occurs earlier.
// O(len(tokens) * max_n).
std::vector<int32_t> ngram_drafts(std::span<const int32_t> tokens, int64_t k, int min_n, int max_n);

}  // namespace lattice
