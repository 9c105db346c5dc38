// Dequantization of ggml block formats and conversion of row slices between element types.
// Block layouts (32 elements per block, little-endian, packed, no padding):
//   Q8_0: f16 d, int8 q[32]                 value_k = q[k] * d
//   Q4_0: f16 d, u8 qs[16]                  value_k = ((qs[k] & 15) - 8) * d       for k < 16
//                                           value_k = ((qs[k-16] >> 4) - 8) * d    for k >= 16
//   Q4_1: f16 d, f16 m, u8 qs[16]           value_k = nibble_k * d + m (same nibble order)
// Invariants: block-typed slices start and end on block boundaries (multiples of 32 elements).
#pragma once

#include <cstdint>

#include "base/convert.h"

namespace lattice {

// Dequantizes `n` elements (multiple of 32) of blocks starting at `blocks` into f32.
void dequant_q8_0(const uint8_t* blocks, float* out, int64_t n);
void dequant_q4_0(const uint8_t* blocks, float* out, int64_t n);
void dequant_q4_1(const uint8_t* blocks, float* out, int64_t n);

// Index of the first of `n` blocks whose f16 scale (or Q4_1 minimum) is not finite, -1 when all are.
int64_t first_non_finite_block(const uint8_t* blocks, DType t, int64_t n);

// Converts elements [col0, col0 + cols) of one row of `src_t` (whose first element is at `row`)
// into dst as dst_t (f32, f16 or bf16). Block types need col0 and cols multiples of 32.
// Throws Error on an unsupported pair or misaligned block slice.
void convert_row_slice(const void* row, DType src_t, int64_t col0, int64_t cols, void* dst, DType dst_t);

}  // namespace lattice
