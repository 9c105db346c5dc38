// Prompt-lookup drafts (see speculative.h).
#include "runtime/engine/speculative.h"

#include <algorithm>

namespace lattice {

std::vector<int32_t> ngram_drafts(std::span<const int32_t> tokens, int64_t k, int min_n, int max_n) {
    const int64_t len = int64_t(tokens.size());
    if (k <= 0 || min_n < 1) return {};
    for (int64_t n = std::min<int64_t>(max_n, len - 1); n >= min_n; --n) {
        const int32_t* suffix = tokens.data() + len - n;
        // Earlier occurrences (they may overlap the suffix: a run repeats itself) with a token after
        // them: starts i with i + n < len, latest first.
        for (int64_t i = len - n - 1; i >= 0; --i) {
            if (!std::equal(suffix, suffix + n, tokens.data() + i)) continue;
            const int64_t from = i + n, to = std::min(len, from + k);
            return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + to);
        }
    }
    return {};
}

}  // namespace lattice
