// Mixture-of-experts routing (see moe_routing.h).
#include "runtime/model/moe_routing.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"

namespace lattice {

void route_tokens(const float* logits, int64_t tokens, int64_t experts, int64_t k, bool renormalize, MoeRoutes* out) {
    LATTICE_CHECK(tokens >= 0 && experts >= 1 && k >= 1 && k <= experts,
                  "route_tokens: {} tokens, top {} of {} experts", tokens, k, experts);
    std::vector<int32_t> chosen(size_t(tokens * k));
    std::vector<double> weight(size_t(tokens * k));
    std::vector<double> p(static_cast<size_t>(experts));
    out->experts = experts;
    out->begin.assign(size_t(experts) + 1, 0);
    for (int64_t t = 0; t < tokens; ++t) {
        const float* row = logits + t * experts;
        double mx = -INFINITY;
        for (int64_t e = 0; e < experts; ++e) {
            LATTICE_CHECK(std::isfinite(row[e]), "MoE router: logit of token {} for expert {} is {}", t, e, row[e]);
            mx = std::max(mx, double(row[e]));
        }
        double sum = 0;
        for (int64_t e = 0; e < experts; ++e) sum += p[size_t(e)] = std::exp(double(row[e]) - mx);
        // Top k by probability, lower index first among equals (k is small: selection by passes).
        double kept = 0;
        for (int64_t j = 0; j < k; ++j) {
            int64_t best = -1;
            for (int64_t e = 0; e < experts; ++e)
                if (p[size_t(e)] >= 0 && (best < 0 || p[size_t(e)] > p[size_t(best)])) best = e;
            chosen[size_t(t * k + j)] = int32_t(best);
            weight[size_t(t * k + j)] = p[size_t(best)] / sum;
            kept += p[size_t(best)] / sum;
            p[size_t(best)] = -1;  // taken
            out->begin[size_t(best) + 1] += 1;
        }
        if (renormalize)
            for (int64_t j = 0; j < k; ++j) weight[size_t(t * k + j)] /= kept;
    }
    for (int64_t e = 0; e < experts; ++e) out->begin[size_t(e) + 1] += out->begin[size_t(e)];
    out->tokens.assign(size_t(tokens * k), 0);
    out->weights.assign(size_t(tokens * k), 0.0f);
    std::vector<int32_t> fill(out->begin.begin(), out->begin.end() - 1);
    for (int64_t t = 0; t < tokens; ++t)  // tokens in batch order within each expert
        for (int64_t j = 0; j < k; ++j) {
            const size_t slot = size_t(fill[size_t(chosen[size_t(t * k + j)])]++);
            out->tokens[slot] = int32_t(t);
            out->weights[slot] = float(weight[size_t(t * k + j)]);
        }
}

}  // namespace lattice
