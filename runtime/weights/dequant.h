// Dequantization of ggml block formats and conversion of row slices between element types.
// Block layouts (little-endian, packed, no padding). 32 elements per block:
//   Q8_0: f16 d, int8 q[32]                 value_k = q[k] * d
//   Q4_0: f16 d, u8 qs[16]                  value_k = ((qs[k] & 15) - 8) * d       for k < 16
//                                           value_k = ((qs[k-16] >> 4) - 8) * d    for k >= 16
//   Q4_1: f16 d, f16 m, u8 qs[16]           value_k = nibble_k * d + m (same nibble order)
//   Q5_0: f16 d, u32 qh, u8 qs[16]          value_k = ((nibble_k | bit k of qh << 4) - 16) * d
//   Q5_1: f16 d, f16 m, u32 qh, u8 qs[16]   value_k = (nibble_k | bit k of qh << 4) * d + m
// 256 elements per super-block (K-quants), eight sub-blocks of 32 (Q6_K: sixteen scales of 16):
//   Q4_K (144 B): f16 d, f16 dmin, u8 scales[12], u8 qs[128]
//     sub-block j has 6-bit scale sc_j and min mn_j: for j < 4 sc_j = scales[j] & 63, mn_j = scales[j+4] & 63;
//     for j >= 4 sc_j = (scales[j+4] & 15) | (scales[j-4] >> 6) << 4, mn_j = (scales[j+4] >> 4) | (scales[j] >> 6)
//     << 4. Nibbles per 64 elements: 32 bytes, low nibbles = sub-block 2i, high nibbles = sub-block 2i + 1. value = (d
//     * sc_j) * q - (dmin * mn_j)
//   Q5_K (176 B): f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]: Q4_K's nibbles plus a fifth bit,
//     bit j of qh[t] for element t of sub-block j; value as Q4_K with q in 0..31
//   Q6_K (210 B): u8 ql[128], u8 qh[64], int8 scales[16], f16 d. Per 128 elements (half h): element r of it
//     (0..127) has low 4 bits ql[64h + r % 64] >> 4 (r / 64) and high 2 bits qh[32h + r % 32] >> 2 (r / 32);
//     value = (d * scales[element / 16]) * (q - 32)
// Every f32 value is computed in the order written, as gguf-py's gguf.quants.dequantize does (and ggml's
// dequantize_row_*): the scale products (d * sc) and the products with q are exact in f32 (at most 24
// significant bits), so the one rounding is a K-quant's final subtraction, and results are bit-identical.
// Invariants: block-typed slices start and end on block boundaries (dtype_block_elems: 32 or 256).
#pragma once

#include <cstdint>

#include "base/convert.h"

namespace lattice {

// Dequantizes `n` elements (a multiple of the type's block size) of blocks starting at `blocks` into f32.
void dequant_q8_0(const uint8_t* blocks, float* out, int64_t n);
void dequant_q4_0(const uint8_t* blocks, float* out, int64_t n);
void dequant_q4_1(const uint8_t* blocks, float* out, int64_t n);
void dequant_q5_0(const uint8_t* blocks, float* out, int64_t n);
void dequant_q5_1(const uint8_t* blocks, float* out, int64_t n);
void dequant_q4_k(const uint8_t* blocks, float* out, int64_t n);
void dequant_q5_k(const uint8_t* blocks, float* out, int64_t n);
void dequant_q6_k(const uint8_t* blocks, float* out, int64_t n);
// Any of the above by type.
void dequant_blocks(DType t, const uint8_t* blocks, float* out, int64_t n);

// Index of the first of `n` blocks whose f16 scale (or minimum: Q4_1, Q5_1, Q4_K's and Q5_K's dmin) is not
// finite, -1 when all are.
int64_t first_non_finite_block(const uint8_t* blocks, DType t, int64_t n);

// Q4_K super-blocks (`n` elements) as 4-bit affine groups of 32 (kernels/common/int4.h, w = q d' + m'): each
// sub-block j becomes one group with d' = f16(d * sc_j) and m' = f16(-(dmin * mn_j)), the f32 products (exact)
// rounded to the nearest f16, the one rounding of this form: at most half an f16 ulp, 2^-11 of the scale or
// minimum relative (2^-25 absolute below f16's normal range), and none when the product is an f16 (e.g. sc_j
// and mn_j powers of two or zero), where q d' + m' is bit for bit gguf-py's value. Nibbles are repacked into
// int4.h's order (16 bytes per group). Writes n / 32 groups to qs (16 bytes each), d and m; returns -1, or the
// index of the first group whose d' or m' overflows f16 (|product| beyond 65504: impossible in files from
// llama.cpp's quantizer, whose super-block scales are small; the caller names the tensor).
int64_t q4_k_to_int4(const uint8_t* blocks, int64_t n, uint8_t* qs, uint16_t* d, uint16_t* m);

// Converts elements [col0, col0 + cols) of one row of `src_t` (whose first element is at `row`)
// into dst as dst_t (f32, f16 or bf16). Block types need col0 and cols multiples of their block size.
// Throws Error on an unsupported pair or misaligned block slice.
void convert_row_slice(const void* row, DType src_t, int64_t col0, int64_t cols, void* dst, DType dst_t);

}  // namespace lattice
