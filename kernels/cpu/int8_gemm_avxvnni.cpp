// AVX-VNNI path of the s8 GEMM (VEX vpdpbusd on ymm; -mavxvnni -mavx2). Same packed layout as the
// zmm path: a 16-channel panel's 64-byte k-group is read as two ymm (channels 0..7 and 8..15), each
// the u8 x s8 operand of vpdpbusd against (a + 128) broadcast; the result minus 128 * col_sums is the
// exact signed sum. 16 ymm registers: decode (m <= 2) keeps m x 2 panels (up to 8 accumulators);
// otherwise a 4-row x 16-channel tile (8 accumulators) reuses each panel across all rows of A.
// W8A16 on this level uses the AVX2 float kernel (VNNI has no float form).
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/int8_gemm_kernels.h"
#include "kernels/cpu/row_blocks.h"

namespace lattice::int8_detail {
namespace {

// acc += dot4(u8 a, s8 b) per int32 lane, VEX encoding. Inline asm with a read-write operand keeps
// each accumulator in one register (GCC 12 otherwise shuffles them every k step).
inline void dpbusd(__m256i& acc, __m256i a_u8, __m256i b_s8) {
    __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(a_u8), "x"(b_s8));
}

inline void store16(__m256i lo, __m256i hi, int64_t r, int64_t p, int64_t n, const Int8Epilogue& ep) {
    const int64_t j0 = p * kInt8PanelN;
    if (n - j0 >= kInt8PanelN) {
        if (ep.y) {
            __m256 rs = _mm256_set1_ps(ep.row_scales[r]);
            __m256 s0 = _mm256_mul_ps(rs, _mm256_loadu_ps(ep.col_scales + j0));
            __m256 s1 = _mm256_mul_ps(rs, _mm256_loadu_ps(ep.col_scales + j0 + 8));
            float* y = ep.y + r * ep.ldy + j0;
            _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_cvtepi32_ps(lo), s0));
            _mm256_storeu_ps(y + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(hi), s1));
        } else {
            int32_t* c = ep.c + r * ep.ldc + j0;
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(c), lo);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + 8), hi);
        }
        return;
    }
    alignas(32) int32_t tmp[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), lo);
    _mm256_store_si256(reinterpret_cast<__m256i*>(tmp + 8), hi);
    store_panel_row(tmp, r, p, n, ep);
}

template <int MR, int NP>
inline void s8_tile(const uint8_t* a, int64_t lda, const PackedInt8& w, int64_t p, int64_t r0,
                    const Int8Epilogue& ep) {
    const int64_t groups = w.k_padded / kInt8GroupK;
    const int64_t ps = w.panel_bytes();
    const int8_t* b = w.panel(p);
    const uint8_t* ar = a + r0 * lda;
    __m256i acc[MR][NP][2];
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
        for (int j = 0; j < NP; ++j) acc[r][j][0] = acc[r][j][1] = _mm256_setzero_si256();
    for (int64_t g = 0; g < groups; ++g) {
        __m256i bv[NP][2];
#pragma GCC unroll 2
        for (int j = 0; j < NP; ++j) {
            bv[j][0] = _mm256_load_si256(reinterpret_cast<const __m256i*>(b + j * ps + g * 64));
            bv[j][1] = _mm256_load_si256(reinterpret_cast<const __m256i*>(b + j * ps + g * 64 + 32));
            _mm_prefetch(reinterpret_cast<const char*>(b + j * ps + g * 64 + 2048), _MM_HINT_T0);  // see avx512 file
        }
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
            int32_t v;
            std::memcpy(&v, ar + r * lda + g * 4, 4);
            __m256i av = _mm256_set1_epi32(v);
#pragma GCC unroll 2
            for (int j = 0; j < NP; ++j) {
                dpbusd(acc[r][j][0], av, bv[j][0]);
                dpbusd(acc[r][j][1], av, bv[j][1]);
            }
        }
    }
#pragma GCC unroll 2
    for (int j = 0; j < NP; ++j) {
        const int32_t* cs = w.col_sums.data() + (p + j) * kInt8PanelN;
        __m256i c0 = _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(cs)), 7);
        __m256i c1 = _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(cs + 8)), 7);
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r)
            store16(_mm256_sub_epi32(acc[r][j][0], c0), _mm256_sub_epi32(acc[r][j][1], c1), r0 + r, p + j, w.n, ep);
    }
}


// All rows of panels [p, p + NP) in tiles of up to MRMAX rows.
template <int NP, int MRMAX>
inline void s8_all_rows(const uint8_t* a, int64_t m, int64_t lda, const PackedInt8& w, int64_t p,
                        const Int8Epilogue& ep) {
    for_row_blocks<MRMAX>(m, [&]<int MR>(int64_t r0) { s8_tile<MR, NP>(a, lda, w, p, r0, ep); });
}

}  // namespace

void s8_panels_avxvnni(const void* a_void, int64_t m, int64_t lda, const PackedInt8& w, int64_t p0, int64_t p1,
                       const Int8Epilogue& ep) {
    const uint8_t* a = static_cast<const uint8_t*>(a_void);
    int64_t p = p0;
    if (m <= 2) {
        for (; p + 2 <= p1; p += 2) s8_all_rows<2, 2>(a, m, lda, w, p, ep);
        for (; p < p1; ++p) s8_all_rows<1, 2>(a, m, lda, w, p, ep);
    } else {
        for (; p < p1; ++p) s8_all_rows<1, 4>(a, m, lda, w, p, ep);
    }
}

}  // namespace lattice::int8_detail
