// Test helper: mean negative log-likelihood per token of a sequence from its logits
// [ids.size(), vocab] (row i predicts ids[i + 1]), in nats; log-softmax in double.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace lattice::testing {

inline double mean_nll(const std::vector<float>& logits, const std::vector<int32_t>& ids, int64_t vocab) {
    if (ids.size() < 2 || logits.size() < ids.size() * size_t(vocab)) return NAN;
    double nll = 0;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
        const float* row = logits.data() + i * size_t(vocab);
        double mx = row[0];
        for (int64_t v = 1; v < vocab; ++v) mx = std::max(mx, double(row[v]));
        double sum = 0;
        for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - mx);
        nll += -(double(row[ids[i + 1]]) - mx - std::log(sum));
    }
    return nll / double(ids.size() - 1);
}

}  // namespace lattice::testing
