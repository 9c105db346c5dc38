// AVX-512 pieces of the W4A8 group form shared by its VNNI kernel (int4_gemm_avx512.cpp) and its AMX tile kernel
// (int4_gemm_amx_avx512.cpp); only files compiled with the AVX-512 flags include this. The group epilogue is the
// one sequence of float operations both run on a group's exact int32 sums, so their outputs are the same bits.
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

}  // namespace lattice::int4_detail
