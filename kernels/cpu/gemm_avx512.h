// AVX-512 pieces shared by the int8 and 4-bit kernel files (int8_gemm_avx512.cpp, int8_gemm_amx_avx512.cpp,
// int4_gemm_avx512.cpp, int4_gemm_kq_avx512.cpp; only files compiled with the AVX-512 flags include this): the
// accumulate instructions, the f16 scale load, the panel tail mask, the int8 epilogue's row store and the
// prefill tile over panels dequantized to f32 ([k_padded][16] floats per panel, k-major), which W8A16 and W4A16
// both run once they have converted a panel pair.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/int8_gemm.h"
#include "kernels/cpu/int8_gemm_kernels.h"
#include "kernels/cpu/row_blocks.h"

namespace lattice::avx512 {

// acc += dot4(u8 a, s8 b) per int32 lane. Inline asm with a read-write operand: GCC 12 otherwise copies every
// accumulator through a fresh register (and the stack) each k step for the destructive vpdpbusd, costing
// ~half the throughput of the prefill tile.
inline void dpbusd(__m512i& acc, __m512i a_u8, __m512i b_s8) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a_u8), "v"(b_s8));
}

// acc += a * b, one rounding (vfmadd231ps, as std::fma), for the same reason as dpbusd.
inline void fma_acc(__m512& acc, __m512 a, __m512 b) {
    __asm__("vfmadd231ps %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
}

// 16 f16 values at p (unaligned) as floats: a panel's 16 channels' scales or minimums.
inline __m512 load_f16x16(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// The channels of panel p that exist (n output channels in all).
inline __mmask16 tail_mask(int64_t p, int64_t n) {
    const int64_t cnt = n - p * kInt8PanelN;
    return cnt >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << cnt) - 1u);
}

// Rows [r0, r0 + MR) x NP dequantized panels (bf: NP consecutive [kp][16] blocks) starting at panel p:
// y = acc, times scales[channel] when scales is not null.
template <int MR, int NP>
inline void fd_tile(const float* x, int64_t ldx, const float* bf, int64_t kp, const float* scales, int64_t p,
                    int64_t r0, int64_t n, float* y, int64_t ldy) {
    const float* xr = x + r0 * ldx;
    __m512 acc[MR][NP];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
        for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < kp; ++kk) {
        __m512 bv[NP];
#pragma GCC unroll 2
        for (int j = 0; j < NP; ++j) bv[j] = _mm512_load_ps(bf + j * kp * 16 + kk * 16);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
            const __m512 xv = _mm512_set1_ps(xr[r * ldx + kk]);
#pragma GCC unroll 2
            for (int j = 0; j < NP; ++j) fma_acc(acc[r][j], bv[j], xv);
        }
    }
#pragma GCC unroll 2
    for (int j = 0; j < NP; ++j) {
        const int64_t j0 = (p + j) * kInt8PanelN;
        const __mmask16 mk = tail_mask(p + j, n);
        if (scales) {
            const __m512 sc = _mm512_maskz_loadu_ps(mk, scales + j0);
#pragma GCC unroll 8
            for (int r = 0; r < MR; ++r)
                _mm512_mask_storeu_ps(y + (r0 + r) * ldy + j0, mk, _mm512_mul_ps(acc[r][j], sc));
        } else {
#pragma GCC unroll 8
            for (int r = 0; r < MR; ++r) _mm512_mask_storeu_ps(y + (r0 + r) * ldy + j0, mk, acc[r][j]);
        }
    }
}

// All m rows of NP dequantized panels in 8-row tiles (8 x 32 floats of C in 16 zmm at NP = 2).
template <int NP>
inline void fd_all_rows(const float* x, int64_t m, int64_t ldx, const float* bf, int64_t kp, const float* scales,
                        int64_t p, int64_t n, float* y, int64_t ldy) {
    for_row_blocks<8>(m, [&]<int MR>(int64_t r0) { fd_tile<MR, NP>(x, ldx, bf, kp, scales, p, r0, n, y, ldy); });
}

// One row's 16 corrected int32 sums of panel p through the int8 epilogue (int8_gemm_kernels.h): the float rows
// float(s) * (row scale * channel scale), or the int32 sums; channels past n masked off. The VNNI and AMX kernels.
inline void store16(__m512i s, int64_t r, int64_t p, int64_t n, const int8_detail::Int8Epilogue& ep) {
    const int64_t j0 = p * kInt8PanelN;
    const __mmask16 mk = tail_mask(p, n);
    if (ep.y) {
        __m512 sc = _mm512_mul_ps(_mm512_set1_ps(ep.row_scales[r]), _mm512_maskz_loadu_ps(mk, ep.col_scales + j0));
        _mm512_mask_storeu_ps(ep.y + r * ep.ldy + j0, mk, _mm512_mul_ps(_mm512_cvtepi32_ps(s), sc));
    } else {
        _mm512_mask_storeu_epi32(ep.c + r * ep.ldc + j0, mk, s);
    }
}

}  // namespace lattice::avx512
