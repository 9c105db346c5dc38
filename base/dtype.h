// Element types and the scalar conversions shared by host and device code.
// fp16/bf16 are stored as raw uint16_t bit patterns so this header needs no CUDA headers;
// conversions are exact (fp16/bf16 -> fp32) or round-to-nearest-even (fp32 -> fp16/bf16).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__CUDACC__)
#define LATTICE_HD __host__ __device__ __forceinline__
#else
#define LATTICE_HD inline
#endif

namespace lattice {

enum class DType : uint8_t {
    kF32,
    kF16,
    kBF16,
    kI8,
    kU8,
    kI32,
    kI64,
    // GGUF block types along the innermost dimension: 32 elements per block (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1),
    // 256 per super-block (the K-quants Q4_K, Q5_K, Q6_K). Layouts: runtime/weights/dequant.h.
    kQ8_0,
    kQ4_0,
    kQ4_1,
    kQ5_0,
    kQ5_1,
    kQ4_K,
    kQ5_K,
    kQ6_K,
};

// Bytes per element for plain types; block types answer per block via block_bytes().
inline int64_t dtype_size(DType t) {
    switch (t) {
        case DType::kF32: return 4;
        case DType::kF16: return 2;
        case DType::kBF16: return 2;
        case DType::kI8: return 1;
        case DType::kU8: return 1;
        case DType::kI32: return 4;
        case DType::kI64: return 8;
        default: return 0;
    }
}

inline bool dtype_is_k_quant(DType t) { return t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K; }
inline bool dtype_is_block(DType t) {
    return t == DType::kQ8_0 || t == DType::kQ4_0 || t == DType::kQ4_1 || t == DType::kQ5_0 || t == DType::kQ5_1 ||
           dtype_is_k_quant(t);
}
// Elements per block: every slice of a block type starts and ends on a multiple of this.
inline int64_t dtype_block_elems(DType t) { return dtype_is_k_quant(t) ? 256 : dtype_is_block(t) ? 32 : 1; }
inline int64_t dtype_block_bytes(DType t) {
    switch (t) {
        case DType::kQ8_0: return 2 + 32;
        case DType::kQ4_0: return 2 + 16;
        case DType::kQ4_1: return 2 + 2 + 16;
        case DType::kQ5_0: return 2 + 4 + 16;
        case DType::kQ5_1: return 2 + 2 + 4 + 16;
        case DType::kQ4_K: return 2 + 2 + 12 + 128;
        case DType::kQ5_K: return 2 + 2 + 12 + 32 + 128;
        case DType::kQ6_K: return 128 + 64 + 16 + 2;
        default: return dtype_size(t);
    }
}
// Bytes of `n` elements (n must be a multiple of the block size for block types).
inline int64_t dtype_bytes(DType t, int64_t n) { return n / dtype_block_elems(t) * dtype_block_bytes(t); }

inline std::string_view dtype_name(DType t) {
    switch (t) {
        case DType::kF32: return "f32";
        case DType::kF16: return "f16";
        case DType::kBF16: return "bf16";
        case DType::kI8: return "i8";
        case DType::kU8: return "u8";
        case DType::kI32: return "i32";
        case DType::kI64: return "i64";
        case DType::kQ8_0: return "q8_0";
        case DType::kQ4_0: return "q4_0";
        case DType::kQ4_1: return "q4_1";
        case DType::kQ5_0: return "q5_0";
        case DType::kQ5_1: return "q5_1";
        case DType::kQ4_K: return "q4_K";
        case DType::kQ5_K: return "q5_K";
        case DType::kQ6_K: return "q6_K";
    }
    return "?";
}

LATTICE_HD float bits_to_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, 4);
    return f;
#endif
}

LATTICE_HD uint32_t f32_to_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
#endif
}

LATTICE_HD float bf16_to_f32(uint16_t h) { return bits_to_f32(uint32_t(h) << 16); }

LATTICE_HD uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

LATTICE_HD float f16_to_f32(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        if (mant == 0) return bits_to_f32(sign);
        // subnormal: value = mant * 2^-24
        float v = float(mant) * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (mant << 13));
    return bits_to_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

LATTICE_HD uint16_t f32_to_f16(float f) {
    uint32_t u = f32_to_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
    if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflow -> inf (rounds past 65504)
    if (a < 0x38800000u) {                                   // subnormal or zero in fp16
        if (a < 0x33000000u) return uint16_t(sign);          // below half the smallest subnormal
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;  // 14 + (113 - e) + ... aligns to 2^-24 units
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) ++r;
        return uint16_t(sign | r);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);  // round to nearest even at bit 13
    return uint16_t(sign | ((r - 0x38000000u) >> 13));
}

}  // namespace lattice
