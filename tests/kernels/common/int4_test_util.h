// Random 4-bit weights for the 4-bit kernel tests of both backends (tests/kernels/cpu, tests/kernels/cuda), and
// random GGUF K-quant super-blocks (the K-quant layout's kernels, the K-quant GGUF fixtures).
#pragma once

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

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

// Blocks of a [rows, cols] tensor of type t: random bytes, then d (and dmin) set to sane f16 values.
inline std::vector<uint8_t> k_tensor_bytes(DType t, int64_t rows, int64_t cols, std::mt19937& rng) {
    const int64_t bb = dtype_block_bytes(t);
    std::vector<uint8_t> v(size_t(rows * cols / dtype_block_elems(t) * bb));
    for (auto& x : v) x = uint8_t(rng());
    for (size_t o = 0; o < v.size(); o += size_t(bb)) {
        const float scale = t == DType::kQ6_K ? 1e-5f : t == DType::kQ5_K ? 5e-5f : 1e-4f;
        const uint16_t d = f32_to_f16(scale * float(1 + rng() % 20)), dmin = f32_to_f16(scale * float(rng() % 20));
        std::memcpy(&v[o + (t == DType::kQ6_K ? 208 : 0)], &d, 2);
        if (t == DType::kQ4_K || t == DType::kQ5_K) std::memcpy(&v[o + 2], &dmin, 2);
    }
    return v;
}

}  // namespace lattice::test
