// The unpacked 4-bit form's checks and lattice's quantizer of float weights to it (kernels/common/int4.h), shared
// by every backend's make_linear and by `lattice convert` (runtime/converter), which writes what a load would
// make: the same function, so a converted 4-bit folder holds bit for bit the weights a run of the original packs.
// Scalar, host only (load time, never per token).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "base/dtype.h"
#include "base/error.h"
#include "kernels/common/int4.h"
#include "kernels/common/quantize_rows.h"

namespace lattice {

// The largest k every path is exact for.
inline constexpr int64_t kInt4MaxK = 1 << 20;

// Checks an Int4Matrix (shape, group, pointers, zero points <= 16, finite scales, a permutation of 0..k-1);
// throws Error naming `what`.
inline void check_int4_matrix(const Int4Matrix& w, const char* what) {
    LATTICE_CHECK(w.n > 0 && w.k > 0 && w.k <= kInt4MaxK, "{}: 4-bit weights of shape [{}, {}] (k at most {})", what,
                  w.n, w.k, kInt4MaxK);
    LATTICE_CHECK(w.group == 32 || w.group == 64 || w.group == 128, "{}: 4-bit group size {} (32, 64 or 128)", what,
                  w.group);
    LATTICE_CHECK(w.n <= (int64_t(1) << 31), "{}: n = {} too large", what, w.n);
    LATTICE_CHECK(w.qs && w.d, "{}: 4-bit weights without nibbles or scales", what);
    LATTICE_CHECK(w.kind != Int4Kind::kAffine || w.m, "{}: affine 4-bit weights without minimums", what);
    LATTICE_CHECK(w.kind != Int4Kind::kZeroPoint || w.z, "{}: zero-point 4-bit weights without zero points", what);
    if (w.perm) {
        std::vector<uint8_t> seen(size_t(w.k), 0);
        for (int64_t c = 0; c < w.k; ++c) {
            LATTICE_CHECK(w.perm[c] >= 0 && w.perm[c] < w.k && !seen[size_t(w.perm[c])],
                          "{}: the input-channel permutation is not one of 0..{} (column {} maps to {})", what, w.k - 1,
                          c, w.perm[c]);
            seen[size_t(w.perm[c])] = 1;
        }
    }
    const int64_t groups = w.groups();
    for (int64_t i = 0; i < w.n * groups; ++i) {
        const float d = f16_to_f32(w.d[i]);
        LATTICE_CHECK(std::isfinite(d), "{}: scale {} of channel {} group {} is not finite", what, d, i / groups,
                      i % groups);
        if (w.m) {
            const float mn = f16_to_f32(w.m[i]);
            LATTICE_CHECK(std::isfinite(mn), "{}: minimum {} of channel {} group {} is not finite", what, mn,
                          i / groups, i % groups);
        }
        if (w.z)  // 16: a GPTQ v1 file's stored zero of 15 + 1, which AutoGPTQ and exllama use as such
            LATTICE_CHECK(w.z[i] <= 16, "{}: zero point {} of channel {} group {} is not in 0..16", what, int(w.z[i]),
                          i / groups, i % groups);
    }
}

// Affine 4-bit quantization of float weights w [n, k] in groups of `group` along k:
// d = f16((max - min) / 15), m = f16(min) of the group, q = clamp(round((w - m) / d), 0, 15) with the
// rounded d and m (q = 0 where d is 0). Throws Error on non-finite weights or a scale past f16's range,
// naming the element. w is f32, f16 or bf16 (`dtype`), each row widened to f32 as it is quantized (a row of
// scratch, not a float copy of the matrix).
inline Int4Weights quantize_weights_int4(const void* w, DType dtype, int64_t n, int64_t k, int64_t group) {
    LATTICE_CHECK(w, "quantize_weights_int4: null weights");
    LATTICE_CHECK(n > 0 && k > 0 && (group == 32 || group == 64 || group == 128),
                  "quantize_weights_int4: shape [{}, {}] with group {} (groups of 32, 64 or 128)", n, k, group);
    LATTICE_CHECK(dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16,
                  "quantize_weights_int4: {} weights (f32, f16 or bf16)", dtype_name(dtype));
    Int4Weights out(n, k, group, Int4Kind::kAffine);
    const int64_t kp = (k + group - 1) / group * group, groups = kp / group;
    std::vector<float> scratch;
    for (int64_t r = 0; r < n; ++r) {
        const float* row = weight_row_f32(w, dtype, k, r, scratch);
        for (int64_t g = 0; g < groups; ++g) {
            const int64_t c0 = g * group, c1 = std::min(k, c0 + group);
            float mn = FLT_MAX, mx = -FLT_MAX;
            for (int64_t c = c0; c < c1; ++c) {
                LATTICE_CHECK(std::fabs(row[c]) <= FLT_MAX, "quantize_weights_int4: non-finite weight {} at [{}, {}]",
                              row[c], r, c);
                mn = std::min(mn, row[c]);
                mx = std::max(mx, row[c]);
            }
            const uint16_t d16 = f32_to_f16((mx - mn) / 15.0f), m16 = f32_to_f16(mn);
            const float d = f16_to_f32(d16), m = f16_to_f32(m16);
            LATTICE_CHECK(std::isfinite(d) && std::isfinite(m),
                          "quantize_weights_int4: group [{}, {}:{}] spans [{}, {}], past the f16 range of its scale", r,
                          c0, c1, mn, mx);
            out.d[size_t(r * groups + g)] = d16;
            out.m[size_t(r * groups + g)] = m16;
            for (int64_t c = c0; c < c1; ++c) {
                const float v = d > 0.0f ? std::round((row[c] - m) / d) : 0.0f;
                const uint8_t q = uint8_t(std::clamp(v, 0.0f, 15.0f));
                uint8_t& b = out.qs[size_t(r * (kp / 2) + c / kInt4Block * 16 + (c % 16))];
                b = (c % kInt4Block) < 16 ? uint8_t((b & 0xF0) | q) : uint8_t((b & 0x0F) | (q << 4));
            }
        }
    }
    return out;
}

inline Int4Weights quantize_weights_int4(const float* w, int64_t n, int64_t k, int64_t group) {
    return quantize_weights_int4(w, DType::kF32, n, k, group);
}

}  // namespace lattice
