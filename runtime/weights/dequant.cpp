// Block dequantization of the 32-element types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; the K-quants are in
// dequant_k.cpp) and row-slice conversion for the GGUF loader. Scalar on purpose: this runs once at load time
// over each weight (the compute path never reads block formats), so clarity beats SIMD here. Layouts are in
// dequant.h.
#include "runtime/weights/dequant.h"

#include <algorithm>
#include <cstring>

#include "base/convert.h"
#include "base/error.h"
#include "kernels/common/byte_loads.h"

namespace lattice {

namespace {
constexpr int64_t kBlock = 32;

}  // namespace

void dequant_q8_0(const uint8_t* blocks, float* out, int64_t n) {
    for (int64_t b = 0; b < n / kBlock; ++b) {
        const uint8_t* p = blocks + b * 34;
        float d = f16_to_f32(load_u16(p));
        for (int k = 0; k < 32; ++k) out[b * kBlock + k] = float(int8_t(p[2 + k])) * d;
    }
}

void dequant_q4_0(const uint8_t* blocks, float* out, int64_t n) {
    for (int64_t b = 0; b < n / kBlock; ++b) {
        const uint8_t* p = blocks + b * 18;
        float d = f16_to_f32(load_u16(p));
        float* o = out + b * kBlock;
        for (int k = 0; k < 16; ++k) {
            o[k] = float(int(p[2 + k] & 15) - 8) * d;
            o[k + 16] = float(int(p[2 + k] >> 4) - 8) * d;
        }
    }
}

void dequant_q4_1(const uint8_t* blocks, float* out, int64_t n) {
    for (int64_t b = 0; b < n / kBlock; ++b) {
        const uint8_t* p = blocks + b * 20;
        float d = f16_to_f32(load_u16(p));
        float m = f16_to_f32(load_u16(p + 2));
        float* o = out + b * kBlock;
        for (int k = 0; k < 16; ++k) {
            o[k] = float(p[4 + k] & 15) * d + m;
            o[k + 16] = float(p[4 + k] >> 4) * d + m;
        }
    }
}

void dequant_q5_0(const uint8_t* blocks, float* out, int64_t n) {
    for (int64_t b = 0; b < n / kBlock; ++b) {
        const uint8_t* p = blocks + b * 22;
        const float d = f16_to_f32(load_u16(p));
        const uint32_t qh = load_u32(p + 2);
        float* o = out + b * kBlock;
        for (int k = 0; k < 16; ++k) {
            o[k] = float(int((p[6 + k] & 15) | ((qh >> k) & 1) << 4) - 16) * d;
            o[k + 16] = float(int((p[6 + k] >> 4) | ((qh >> (k + 16)) & 1) << 4) - 16) * d;
        }
    }
}

void dequant_q5_1(const uint8_t* blocks, float* out, int64_t n) {
    for (int64_t b = 0; b < n / kBlock; ++b) {
        const uint8_t* p = blocks + b * 24;
        const float d = f16_to_f32(load_u16(p)), m = f16_to_f32(load_u16(p + 2));
        const uint32_t qh = load_u32(p + 4);
        float* o = out + b * kBlock;
        for (int k = 0; k < 16; ++k) {
            o[k] = float((p[8 + k] & 15) | ((qh >> k) & 1) << 4) * d + m;
            o[k + 16] = float((p[8 + k] >> 4) | ((qh >> (k + 16)) & 1) << 4) * d + m;
        }
    }
}

void dequant_blocks(DType t, const uint8_t* blocks, float* out, int64_t n) {
    switch (t) {
        case DType::kQ8_0:
            return dequant_q8_0(blocks, out, n);
        case DType::kQ4_0:
            return dequant_q4_0(blocks, out, n);
        case DType::kQ4_1:
            return dequant_q4_1(blocks, out, n);
        case DType::kQ5_0:
            return dequant_q5_0(blocks, out, n);
        case DType::kQ5_1:
            return dequant_q5_1(blocks, out, n);
        case DType::kQ4_K:
            return dequant_q4_k(blocks, out, n);
        case DType::kQ5_K:
            return dequant_q5_k(blocks, out, n);
        case DType::kQ6_K:
            return dequant_q6_k(blocks, out, n);
        default:
            LATTICE_FAIL("dequant_blocks: {} is not a block type", dtype_name(t));
    }
}

int64_t first_non_finite_block(const uint8_t* blocks, DType t, int64_t n) {
    // Byte offsets of the block's f16 scales: d first (Q6_K: last), then the minimum of the affine types.
    const bool two = t == DType::kQ4_1 || t == DType::kQ5_1 || t == DType::kQ4_K || t == DType::kQ5_K;
    const int64_t bytes = dtype_block_bytes(t), first = t == DType::kQ6_K ? 208 : 0;
    for (int64_t b = 0; b < n; ++b)
        for (int64_t i = 0; i < (two ? 2 : 1); ++i)
            if ((load_u16(blocks + b * bytes + first + 2 * i) & 0x7C00) == 0x7C00) return b;  // f16 exponent all ones
    return -1;
}

void convert_row_slice(const void* row, DType src_t, int64_t col0, int64_t cols, void* dst, DType dst_t) {
    LATTICE_CHECK(col0 >= 0 && cols >= 0, "convert_row_slice: negative range [{}, +{})", col0, cols);
    LATTICE_CHECK(dst_t == DType::kF32 || dst_t == DType::kF16 || dst_t == DType::kBF16,
                  "convert_row_slice: output dtype {} unsupported (f32, f16, bf16)", dtype_name(dst_t));
    const auto* src = static_cast<const uint8_t*>(row);
    const int64_t be = dtype_block_elems(src_t);
    if (dtype_is_block(src_t)) {
        LATTICE_CHECK(col0 % be == 0 && cols % be == 0,
                      "convert_row_slice: {} slice [{}, {}) is not aligned to {}-element blocks", dtype_name(src_t),
                      col0, col0 + cols, be);
    } else {
        LATTICE_CHECK(src_t == DType::kF32 || src_t == DType::kF16 || src_t == DType::kBF16,
                      "convert_row_slice: source dtype {} unsupported", dtype_name(src_t));
    }
    if (!dtype_is_block(src_t)) {
        convert_elements(src + col0 * dtype_size(src_t), src_t, dst, dst_t, cols);
        return;
    }
    // Through f32 in chunks on the stack (no per-row heap allocation); kChunk is a multiple of 32 and 256.
    constexpr int64_t kChunk = 512;
    float buf[kChunk];
    const int64_t out_size = dtype_size(dst_t);
    for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
        const int64_t n = std::min(kChunk, cols - c0);
        const int64_t first = col0 + c0;
        float* out = dst_t == DType::kF32 ? static_cast<float*>(dst) + c0 : buf;
        dequant_blocks(src_t, src + first / be * dtype_block_bytes(src_t), out, n);
        if (dst_t != DType::kF32)
            convert_elements(out, DType::kF32, static_cast<uint8_t*>(dst) + c0 * out_size, dst_t, n);
    }
}

}  // namespace lattice
