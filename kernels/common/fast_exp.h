// exp_neg: e^x for x <= 0 (softmax weights; the CPU attention's lazy max also takes x up to 8, where the same
// reduction and polynomial hold: |r| <= ln2 / 2 for any n), written to vectorize, for the attention kernels and the
// sampler. Hand-written because libm's expf is a call the compiler cannot vectorize without
// -ffast-math (which the project does not use: it changes every other float's semantics), and a
// SIMD math library for one function is more than it needs.
// x = n ln2 + r with |r| <= ln2 / 2 (Cody-Waite split of ln2), e^r by its degree-6 Taylor polynomial
// (relative error < 2e-7 on that range), 2^n through the exponent bits. x below -87 (and -inf, NaN)
// gives e^-87 ~ 1.6e-38 instead of a denormal: callers that need an exact 0 mask it themselves.
// n = round(x / ln2) by the 1.5 x 2^23 trick (no floor call, branch-free: the loops that call this
// vectorize; |x / ln2| < 2^22 here).
#pragma once

#include <bit>
#include <cstdint>

namespace lattice {

inline float exp_neg(float x) {
    x = x > -87.0f ? x : -87.0f;
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    const float p =
        1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
    return p * std::bit_cast<float>((int32_t(n) + 127) << 23);
}

// exp_neg of every lane of a GCC vector of floats (F, e.g. float __attribute__((vector_size(64)))), I the
// int32 vector of as many lanes: the same operations in the same order, so each lane has exp_neg's bits.
// For loops that GCC does not vectorize from the scalar form (reductions without -ffast-math).
template <class F, class I>
inline F exp_neg_lanes(F x) {
    x = x > -87.0f ? x : F{} - 87.0f;
    const F n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const F r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    const F p =
        1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
    const I e = (__builtin_convertvector(n, I) + 127) << 23;
    return p * std::bit_cast<F>(e);
}

}  // namespace lattice
