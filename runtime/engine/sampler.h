// Sampler: picks the next token from a row of logits on the host.
// temperature == 0 is greedy (argmax, lowest id on ties). Otherwise: (logits - max) / temperature
// (stable for any temperature > 0: a tiny one gives the argmax, never inf or NaN), keep the
// top_k most likely (0 = all), then the smallest set whose probability reaches top_p (1 = all),
// renormalize, draw with a seeded mt19937_64 — the same seed gives the same tokens on every run.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace lattice {

struct SamplingParams {
    float temperature = 0.0f;
    int64_t top_k = 0;
    float top_p = 1.0f;
    uint64_t seed = 0;
    void validate() const;  // throws Error naming the bad value
};

int32_t argmax(const float* logits, int64_t n);

class Sampler {
public:
    explicit Sampler(const SamplingParams& p);
    int32_t sample(const float* logits, int64_t n);

private:
    SamplingParams p_;
    std::mt19937_64 rng_;
    std::vector<std::pair<float, int32_t>> cand_;
};

}  // namespace lattice
