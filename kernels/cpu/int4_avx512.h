// AVX-512 pieces of the W4A8 kernels shared by the VNNI kernels (int4_gemm_avx512.cpp: the group form;
// int4_gemm_kq_avx512.cpp: the K-quant layout) and the AMX tile kernel (int4_gemm_amx_avx512.cpp); only files
// compiled with the AVX-512 flags include this. Each form's group epilogue is the one sequence of float operations
// every kernel runs on a group's exact int32 sums, so their outputs are the same bits.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/gemm_avx512.h"
#include "kernels/cpu/int4_gemm_kernels.h"

namespace lattice::int4_detail {

// A panel's per-group parameters at its block bs: the f16 scales d, and the minima (affine) or zero points
// (zero-point); the others zero.
struct GroupParams {
    __m512 d, mn;
    __m512i z;
};
template <Int4Kind K>
inline GroupParams group_params(const uint8_t* bs, int64_t G) {
    GroupParams q{avx512::load_f16x16(bs + scale_offset(G)), _mm512_setzero_ps(), _mm512_setzero_si512()};
    if constexpr (K == Int4Kind::kAffine) q.mn = avx512::load_f16x16(bs + extra_offset(G));
    if constexpr (K == Int4Kind::kZeroPoint)
        q.z = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bs + extra_offset(G))));
    return q;
}

// The group epilogue of int4_gemm.h for one row and panel: the group's exact int32 sums isum (X: the row's sum of
// the group's activations, s their scale) into acc, in the float operations every path performs. The tiles
// and the decode GEMV both end each group here, so their results are the same bits.
template <Int4Kind K>
inline void group_epilogue(__m512& acc, __m512i isum, const GroupParams& q, int32_t X, float s) {
    const __m512 sg = _mm512_set1_ps(s);
    const __m512 ds = _mm512_mul_ps(q.d, sg);
    if constexpr (K == Int4Kind::kOffset8) {
        avx512::fma_acc(acc, _mm512_cvtepi32_ps(_mm512_sub_epi32(isum, _mm512_set1_epi32(8 * X))), ds);
    } else if constexpr (K == Int4Kind::kZeroPoint) {
        const __m512i corr = _mm512_mullo_epi32(q.z, _mm512_set1_epi32(X));
        avx512::fma_acc(acc, _mm512_cvtepi32_ps(_mm512_sub_epi32(isum, corr)), ds);
    } else {
        avx512::fma_acc(acc, _mm512_cvtepi32_ps(isum), ds);
        avx512::fma_acc(acc, _mm512_mul_ps(q.mn, sg), _mm512_set1_ps(float(X)));
    }
}

// ---- The K-quant layout (int4_gemm.h): shared by its VNNI kernels (int4_gemm_kq_avx512.cpp) and the AMX tiles ----

inline __m128i load128(const uint8_t* p) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

inline __m512 u8_to_ps(__m128i v) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
}

// A Q4_K super-block's d sc_g (D) and -(dmin mn_g) (Mn) for the 16 channels, g = 0..7.
inline void q4k_scales(const uint8_t* sb, float (*D)[16], float (*Mn)[16]) {
    const __m512 d = avx512::load_f16x16(sb + kKqQ4D), dmin = avx512::load_f16x16(sb + kKqQ4Dmin);
    __m128i s[12];
    for (int b = 0; b < 12; ++b) s[b] = load128(sb + kKqQ4Scales + 16 * b);
    const __m128i m63 = _mm_set1_epi8(63), m15 = _mm_set1_epi8(15), m48 = _mm_set1_epi8(48);
    for (int g = 0; g < 8; ++g) {
        __m128i sc, mn;
        if (g < 4) {
            sc = _mm_and_si128(s[g], m63);
            mn = _mm_and_si128(s[g + 4], m63);
        } else {  // top 2 bits: (byte >> 6) << 4 = (byte >> 2) & 48 (bits shifted in from the next byte masked)
            sc = _mm_or_si128(_mm_and_si128(s[g + 4], m15), _mm_and_si128(_mm_srli_epi16(s[g - 4], 2), m48));
            mn = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(s[g + 4], 4), m15),
                              _mm_and_si128(_mm_srli_epi16(s[g], 2), m48));
        }
        _mm512_storeu_ps(D[g], _mm512_mul_ps(d, u8_to_ps(sc)));
        // -(dmin mn): the negation is exact, and -(M) * s rounds as -(M * s).
        _mm512_storeu_ps(Mn[g], _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(dmin, u8_to_ps(mn))));
    }
}

// Prefill: the D / Mn tables of every super-block of NP panels, once per panel group (not per row block):
// tab[((j * supers + sb) * 2 + {0: D, 1: Mn}) * 8 + g][16].
inline void q4k_panel_tables(const PackedInt4& w, int64_t p, int np, float (*tab)[16]) {
    const int64_t supers = w.k / 256;
    for (int j = 0; j < np; ++j)
        for (int64_t sbi = 0; sbi < supers; ++sbi) {
            float(*t)[16] = tab + (j * supers + sbi) * 16;
            q4k_scales(w.kq_block(p + j, sbi), t, t + 8);
        }
}

// The Q4_K group epilogue for one row and panel: isum the group's exact int32 sums (q in 0..15), D = d sc_g and
// Mn = -(dmin mn_g) of the 16 channels (exact in f32), s and X the row's group scale and sum of activations.
inline void q4k_epilogue(__m512& acc, __m512i isum, __m512 D, __m512 Mn, float s, int32_t X) {
    const __m512 sv = _mm512_set1_ps(s);
    avx512::fma_acc(acc, _mm512_cvtepi32_ps(isum), _mm512_mul_ps(D, sv));
    avx512::fma_acc(acc, _mm512_mul_ps(Mn, sv), _mm512_set1_ps(float(X)));
}

// q (0..63) of chunk c's low (sub-block a) and high (sub-block b) elements: 4-bit parts | top bits << 4.
struct Q6Pair {
    __m512i lo, hi;
};
inline Q6Pair q6_chunk(__m512i v, __m512i hb) {
    const __m512i m15 = _mm512_set1_epi8(0x0F), m48 = _mm512_set1_epi8(0x30);
    const __m512i tlo = _mm512_and_si512(_mm512_slli_epi16(hb, 4), m48);
    const __m512i thi = _mm512_and_si512(_mm512_slli_epi16(hb, 2), m48);
    // (A & B) | C: vpternlogd 0xEA.
    return {_mm512_ternarylogic_epi32(v, m15, tlo, 0xEA),
            _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 4), m15, thi, 0xEA)};
}

// Group g's scales in a Q6_K super-block sblock for the 16 channels: its sub-blocks a and b's int8 scales, and the
// super-block's d (dv, loaded once per super-block by the caller).
struct Q6Scales {
    __m512i sa, sb;
    __m512 d;
    Q6Scales(const uint8_t* sblock, int g, __m512 dv)
        : sa(_mm512_cvtepi8_epi32(load128(sblock + kKqQ6Scales + 16 * (2 * g)))),
          sb(_mm512_cvtepi8_epi32(load128(sblock + kKqQ6Scales + 16 * (2 * g + 1)))),
          d(dv) {}
};

// The Q6_K group epilogue for one row and panel: ia, ib the exact int32 sums of sub-blocks a and b (q in 0..63),
// `at` the row's index into the activations' group sums and scales.
inline void q6k_epilogue(__m512& acc, __m512i ia, __m512i ib, const Q6Scales& q, const Int4Acts& a, int64_t at) {
    const int32_t xa = a.xsum16[at], xb = a.xsum[at] - xa;
    const __m512i ta = _mm512_sub_epi32(ia, _mm512_set1_epi32(32 * xa));
    const __m512i tb = _mm512_sub_epi32(ib, _mm512_set1_epi32(32 * xb));
    const __m512i t = _mm512_add_epi32(_mm512_mullo_epi32(q.sa, ta), _mm512_mullo_epi32(q.sb, tb));
    avx512::fma_acc(acc, _mm512_cvtepi32_ps(t), _mm512_mul_ps(q.d, _mm512_set1_ps(a.scales[at])));
}

}  // namespace lattice::int4_detail
