// Token routing of a mixture-of-experts block (Mixtral's sparse MoE, transformers'
// MixtralSparseMoeBlock): per token, softmax over the router's logits, the top k experts, and their
// probabilities renormalized to sum 1 (renormalize) or kept as they are. The result is grouped by
// expert, so each expert runs once over the contiguous rows of its tokens (Model::run_layers).
//
// Host code on purpose: the logits are [tokens, experts] (a few KB), every TP rank routes the same
// (its residual stream and replicated router are bit-identical across the group), and one routing
// serves every backend. Ties go to the lower expert index, so the choice is deterministic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lattice {

struct MoeRoutes {
    int64_t experts = 0;
    std::vector<int32_t> begin;   // [experts + 1]: expert e's slots are [begin[e], begin[e + 1])
    std::vector<int32_t> tokens;  // per slot: the token (row of the batch)
    std::vector<float> weights;   // per slot: the token's weight for that expert
    int64_t count(int64_t e) const { return begin[size_t(e) + 1] - begin[size_t(e)]; }
};

// Routes `tokens` rows of f32 router logits [tokens, experts] to k experts each. Non-finite logits
// are an Error naming the token and expert.
void route_tokens(const float* logits, int64_t tokens, int64_t experts, int64_t k, bool renormalize, MoeRoutes* out);

}  // namespace lattice
