// Per-channel int8 quantization of a float weight matrix's rows (f32, f16 or bf16 [n, k]), the one loop behind
// the CPU backend's make_linear (kernels/cpu/int8_gemm.h, quantize_weights_per_channel: rows over its pool), the
// CUDA backend's make_linear (rows over host threads) and `lattice convert` (RankWeights' quantize_per_channel):
// each row widened to f32 one at a time (never the whole matrix), checked finite, then quantize_row_int8
// (quantize.h) or a bit-identical row quantizer the caller passes (the CPU's SIMD one).
//
// A row holding an Inf or a NaN is not quantized: the range functions return the first such row and the caller
// names its culprit with fail_non_finite_row after every range is done (a worker thread's task must not throw).
// Inf and NaN are the floats whose exponent bits are all set, so the test is the largest masked exponent over
// the row (an integer max the compiler vectorizes; the per-element isfinite it replaced ran as a scalar loop,
// ~10% of a load).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "base/convert.h"
#include "base/error.h"
#include "kernels/common/quantize.h"

namespace lattice {

using QuantizeRowFn = float (*)(const float* x, int64_t k, int8_t* q);

// Row i of w as k floats: w's own memory for f32, else widened into `scratch` (k floats).
inline const float* weight_row_f32(const void* w, DType dtype, int64_t k, int64_t i, std::vector<float>& scratch) {
    const void* src = static_cast<const uint8_t*>(w) + i * k * int64_t(dtype_size(dtype));
    if (dtype == DType::kF32) return static_cast<const float*>(src);
    scratch.resize(size_t(k));
    convert_elements(src, dtype, scratch.data(), DType::kF32, k);
    return scratch.data();
}

// Whether any of x[0, k) is an Inf or a NaN.
inline bool row_has_non_finite(const float* x, int64_t k) {
    uint32_t exp_max = 0;
    for (int64_t j = 0; j < k; ++j) {
        uint32_t bits;
        std::memcpy(&bits, x + j, 4);
        exp_max = std::max(exp_max, bits & 0x7f800000u);
    }
    return exp_max == 0x7f800000u;
}

// Rows [r0, r1) of w (f32, f16 or bf16, k columns) into q (row i at q + i * k) and scales[i]. Returns the first
// row of the range holding an Inf or a NaN (that row is left as it was; the others are quantized), or r1.
inline int64_t quantize_rows_int8(const void* w, DType dtype, int64_t k, int64_t r0, int64_t r1, int8_t* q,
                                  float* scales, QuantizeRowFn quantize_row = &quantize_row_int8) {
    std::vector<float> scratch;
    int64_t first_bad = r1;
    for (int64_t i = r0; i < r1; ++i) {
        const float* row = weight_row_f32(w, dtype, k, i, scratch);
        if (row_has_non_finite(row, k)) {
            first_bad = std::min(first_bad, i);
            continue;
        }
        scales[i] = quantize_row(row, k, q + i * k);
    }
    return first_bad;
}

// Throws Error "`what`: non-finite weight V at [i, j]" for the first non-finite element of row i.
[[noreturn]] inline void fail_non_finite_row(const void* w, DType dtype, int64_t k, int64_t i, std::string_view what) {
    std::vector<float> scratch;
    const float* row = weight_row_f32(w, dtype, k, i, scratch);
    for (int64_t j = 0; j < k; ++j)
        LATTICE_CHECK(std::isfinite(row[j]), "{}: non-finite weight {} at [{}, {}]", what, row[j], i, j);
    LATTICE_FAIL("{}: row {} was reported non-finite but holds only finite weights", what, i);
}

}  // namespace lattice
