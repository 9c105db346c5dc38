// Random 4-bit weights for the 4-bit kernel tests of both backends (tests/kernels/cpu, tests/kernels/cuda).
#pragma once

#include <algorithm>
#include <numeric>
#include <random>

#include "base/dtype.h"
#include "kernels/common/int4_quantize.h"

namespace lattice::test {

// Random weights of a kind: every nibble, scales of both signs (f16), minimums, zero points 0..16 (16: GPTQ v1's
// stored 15 + 1), corners q = 0 and q = 15; with perm, a random act-order permutation.
template <class Rng>
Int4Weights random_int4(int64_t n, int64_t k, int64_t group, Int4Kind kind, Rng& rng, bool perm = false) {
    Int4Weights w(n, k, group, kind);
    std::uniform_int_distribution<int> byte(0, 255), zp(0, 16);
    std::normal_distribution<float> nd(0.0f, 0.02f);
    for (auto& b : w.qs) b = uint8_t(byte(rng));
    w.qs[0] = 0xF0;
    for (auto& d : w.d) d = f32_to_f16(nd(rng));
    for (auto& m : w.m) m = f32_to_f16(nd(rng) * 8);
    for (auto& z : w.z) z = uint8_t(zp(rng));
    if (perm) {
        w.perm.resize(size_t(k));
        std::iota(w.perm.begin(), w.perm.end(), 0);
        std::shuffle(w.perm.begin(), w.perm.end(), rng);
    }
    return w;
}

}  // namespace lattice::test
