// AVX2 paths of the int8 GEMMs (-mavx2 -mfma), for CPUs without VNNI.
//   s8: vpmaddubsw would saturate (255 * 127 * 2 > 32767), so both operands are sign-extended to
//     int16 (activations once per call, weights per k-group with vpmovsxbw) and multiplied with
//     vpmaddwd: |a0 b0 + a1 b1| <= 2 * 128 * 128 = 32768 fits int32, so the sum is exact. A 16-byte
//     quarter of a k-group (4 channels x 4 k) widens to one ymm; vpmaddwd leaves two partial sums per
//     channel, folded at the end by vphaddd + vpermq. Tile: 2 rows x 16 channels (8 accumulators).
//   quantize_row_int8_avx2: the W8A8 activation quantize (quantize.h) in ymm, bit-identical to the
//     scalar function: IEEE division, round half away from zero rebuilt from truncation (v - trunc(v)
//     is exact), NaN -> 0, clamp to +-127. Used by every SIMD level.
//   W8A16 (also used on the AVX-VNNI level): each 32-byte half k-group is 8 int32 (one per channel),
//     byte t sign-extended by shifts, converted to f32, FMA'd against broadcast x[4g + t]; for m >= 32
//     each panel is converted to f32 once (thread-local) and a 6 x 16 FMA tile runs over it.
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "kernels/cpu/int8_gemm_kernels.h"
#include "kernels/cpu/row_blocks.h"
#include "kernels/common/quantize.h"

namespace lattice::int8_detail {
namespace {

// Pair layouts of channels 0..3 (x) and 4..7 (y) -> the 8 channel sums in order.
inline __m256i fold_pairs(__m256i x, __m256i y) {
    return _mm256_permute4x64_epi64(_mm256_hadd_epi32(x, y), 0xD8);
}

// acc += t in place; inline asm keeps each accumulator in one register (GCC 12 otherwise adds into a
// fresh register and copies back, and spills one accumulator to the stack).
inline void add_acc(__m256i& acc, __m256i t) { __asm__("vpaddd %1, %0, %0" : "+x"(acc) : "x"(t)); }

template <int MR>
inline void s8_tile(const int16_t* a, int64_t lda, const PackedInt8& w, int64_t p, int64_t r0,
                    const Int8Epilogue& ep) {
    const int64_t groups = w.k_padded / kInt8GroupK;
    const int8_t* b = w.panel(p);
    const int16_t* ar = a + r0 * lda;
    __m256i acc[MR][4];
#pragma GCC unroll 2
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) acc[r][q] = _mm256_setzero_si256();
    // Weights widened one quarter at a time against every row: 4 * MR accumulators + 1 + MR live registers.
    for (int64_t g = 0; g < groups; ++g) {
        _mm_prefetch(reinterpret_cast<const char*>(b + g * 64 + 2048), _MM_HINT_T0);
        __m256i av[MR];
#pragma GCC unroll 2
        for (int r = 0; r < MR; ++r) {
            long long v;
            std::memcpy(&v, ar + r * lda + g * 4, 8);
            av[r] = _mm256_set1_epi64x(v);
        }
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) {
            const __m256i bw =
                _mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(b + g * 64 + q * 16)));
#pragma GCC unroll 2
            for (int r = 0; r < MR; ++r) add_acc(acc[r][q], _mm256_madd_epi16(bw, av[r]));
        }
    }
    alignas(32) int32_t tmp[16];
#pragma GCC unroll 2
    for (int r = 0; r < MR; ++r) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), fold_pairs(acc[r][0], acc[r][1]));
        _mm256_store_si256(reinterpret_cast<__m256i*>(tmp + 8), fold_pairs(acc[r][2], acc[r][3]));
        store_panel_row(tmp, r0 + r, p, w.n, ep);
    }
}

template <int MR, int NP>
inline void f_tile(const float* x, int64_t ldx, const PackedInt8& w, const float* scales, int64_t p, int64_t r0,
                   float* y, int64_t ldy) {
    const int64_t groups = w.k_padded / kInt8GroupK;
    const int64_t ps = w.panel_bytes();
    const int8_t* b = w.panel(p);
    const float* xr = x + r0 * ldx;
    __m256 acc[MR][NP * 2];
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
        for (int h = 0; h < NP * 2; ++h) acc[r][h] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
#pragma GCC unroll 4
        for (int h = 0; h < NP * 2; ++h) {
            __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(b + (h / 2) * ps + g * 64 + (h % 2) * 32));
            if (h % 2 == 0)  // one prefetch per 64-byte k-group, 2 KiB ahead on each panel stream
                _mm_prefetch(reinterpret_cast<const char*>(b + (h / 2) * ps + g * 64 + 2048), _MM_HINT_T0);
            __m256 wf[4];
            wf[0] = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 24), 24));
            wf[1] = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 16), 24));
            wf[2] = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 8), 24));
            wf[3] = _mm256_cvtepi32_ps(_mm256_srai_epi32(v, 24));
#pragma GCC unroll 4
            for (int r = 0; r < MR; ++r) {
                const float* xg = xr + r * ldx + g * 4;
#pragma GCC unroll 4
                for (int t = 0; t < 4; ++t) acc[r][h] = _mm256_fmadd_ps(wf[t], _mm256_set1_ps(xg[t]), acc[r][h]);
            }
        }
    }
#pragma GCC unroll 2
    for (int j = 0; j < NP; ++j) {
        const int64_t j0 = (p + j) * kInt8PanelN;
        const int64_t cnt = w.n - j0 < kInt8PanelN ? w.n - j0 : kInt8PanelN;
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
            float* yr = y + (r0 + r) * ldy + j0;
            if (cnt == kInt8PanelN) {
                _mm256_storeu_ps(yr, _mm256_mul_ps(acc[r][2 * j], _mm256_loadu_ps(scales + j0)));
                _mm256_storeu_ps(yr + 8, _mm256_mul_ps(acc[r][2 * j + 1], _mm256_loadu_ps(scales + j0 + 8)));
            } else {
                alignas(32) float tmp[16];
                _mm256_store_ps(tmp, acc[r][2 * j]);
                _mm256_store_ps(tmp + 8, acc[r][2 * j + 1]);
                for (int64_t i = 0; i < cnt; ++i) yr[i] = tmp[i] * scales[j0 + i];
            }
        }
    }
}


template <int NP, int MRMAX>
inline void f_all_rows(const float* x, int64_t m, int64_t ldx, const PackedInt8& w, const float* scales, int64_t p,
                       float* y, int64_t ldy) {
    for_row_blocks<MRMAX>(m, [&]<int MR>(int64_t r0) { f_tile<MR, NP>(x, ldx, w, scales, p, r0, y, ldy); });
}

// acc += a * b; inline asm keeps each accumulator in one register (GCC 12 shuffles them otherwise).
inline void fma_acc(__m256& acc, __m256 a, __m256 b) { __asm__("vfmadd231ps %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b)); }

// Prefill W8A16: panel converted once to f32, k-major [k_padded][16], then an MR x 16 FMA tile over it.
inline void dequant_panel(const int8_t* b, int64_t groups, float* out) {
    for (int64_t g = 0; g < groups; ++g)
        for (int h = 0; h < 2; ++h) {
            __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(b + g * 64 + h * 32));
            float* o = out + g * 64 + h * 8;
            _mm256_store_ps(o, _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 24), 24)));
            _mm256_store_ps(o + 16, _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 16), 24)));
            _mm256_store_ps(o + 32, _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 8), 24)));
            _mm256_store_ps(o + 48, _mm256_cvtepi32_ps(_mm256_srai_epi32(v, 24)));
        }
}

template <int MR>
inline void fd_tile(const float* x, int64_t ldx, const float* bf, int64_t kp, const float* scales, int64_t p,
                    int64_t r0, int64_t n, float* y, int64_t ldy) {
    const float* xr = x + r0 * ldx;
    __m256 acc[MR][2];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t kk = 0; kk < kp; ++kk) {
        __m256 b0 = _mm256_load_ps(bf + kk * 16), b1 = _mm256_load_ps(bf + kk * 16 + 8);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
            __m256 xv = _mm256_set1_ps(xr[r * ldx + kk]);
            fma_acc(acc[r][0], b0, xv);
            fma_acc(acc[r][1], b1, xv);
        }
    }
    const int64_t j0 = p * kInt8PanelN;
    const int64_t cnt = n - j0 < kInt8PanelN ? n - j0 : kInt8PanelN;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
        float* yr = y + (r0 + r) * ldy + j0;
        if (cnt == kInt8PanelN) {
            _mm256_storeu_ps(yr, _mm256_mul_ps(acc[r][0], _mm256_loadu_ps(scales + j0)));
            _mm256_storeu_ps(yr + 8, _mm256_mul_ps(acc[r][1], _mm256_loadu_ps(scales + j0 + 8)));
        } else {
            alignas(32) float tmp[16];
            _mm256_store_ps(tmp, acc[r][0]);
            _mm256_store_ps(tmp + 8, acc[r][1]);
            for (int64_t i = 0; i < cnt; ++i) yr[i] = tmp[i] * scales[j0 + i];
        }
    }
}


}  // namespace

float quantize_row_int8_avx2(const float* x, int64_t k, int8_t* q) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 mx = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) mx = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), mx);  // NaN -> mx
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, mx);
    float amax = 0.0f;
    for (float v : lanes) amax = v > amax ? v : amax;
    for (int64_t t = i; t < k; ++t) {
        float a = fabsf(x[t]);
        amax = a > amax ? a : amax;
    }
    const float s = int8_scale_from_absmax(amax);
    const __m256 vs = _mm256_set1_ps(s), half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    const __m256 hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    for (i = 0; i + 8 <= k; i += 8) {
        __m256 v = _mm256_div_ps(_mm256_loadu_ps(x + i), vs);
        __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
        __m256 away = _mm256_and_ps(_mm256_cmp_ps(frac, half, _CMP_GE_OQ), _mm256_or_ps(_mm256_and_ps(v, sign), one));
        __m256 r = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(t, away), lo), hi);
        r = _mm256_and_ps(r, _mm256_cmp_ps(v, v, _CMP_ORD_Q));  // NaN -> 0
        __m256i qi = _mm256_cvttps_epi32(r);
        __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(qi), _mm256_extracti128_si256(qi, 1));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(q + i), _mm_packs_epi16(p16, p16));
    }
    for (; i < k; ++i) q[i] = quantize_int8_value(x[i], s);
    return s;
}

void s8_panels_avx2(const void* a_void, int64_t m, int64_t lda, const PackedInt8& w, int64_t p0, int64_t p1,
                    const Int8Epilogue& ep) {
    const int16_t* a = static_cast<const int16_t*>(a_void);
    for (int64_t p = p0; p < p1; ++p) {
        int64_t r0 = 0;
        for (; r0 + 2 <= m; r0 += 2) s8_tile<2>(a, lda, w, p, r0, ep);
        if (r0 < m) s8_tile<1>(a, lda, w, p, r0, ep);
    }
}

void w8a16_panels_avx2(const float* x, int64_t m, int64_t ldx, const PackedInt8& w, const float* scales,
                       int64_t p0, int64_t p1, float* y, int64_t ldy) {
    int64_t p = p0;
    if (m == 1) {
        for (; p + 2 <= p1; p += 2) f_all_rows<2, 1>(x, m, ldx, w, scales, p, y, ldy);
        for (; p < p1; ++p) f_all_rows<1, 1>(x, m, ldx, w, scales, p, y, ldy);
    } else if (m < 32) {
        for (; p < p1; ++p) f_all_rows<1, 4>(x, m, ldx, w, scales, p, y, ldy);
    } else {  // prefill: each panel converted to f32 once (thread-local), reused across all rows
        thread_local std::vector<float, AlignedAllocator64<float>> bf;
        if (bf.size() < size_t(w.k_padded * kInt8PanelN)) bf.resize(size_t(w.k_padded * kInt8PanelN));
        for (; p < p1; ++p) {
            dequant_panel(w.panel(p), w.k_padded / kInt8GroupK, bf.data());
            for_row_blocks<6>(
                m, [&]<int MR>(int64_t r0) { fd_tile<MR>(x, ldx, bf.data(), w.k_padded, scales, p, r0, w.n, y, ldy); });
        }
    }
}

}  // namespace lattice::int8_detail
