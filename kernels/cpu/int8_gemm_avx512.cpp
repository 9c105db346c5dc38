// AVX-512 VNNI paths of the int8 GEMMs (compiled with -mavx512f/bw/vl/dq/vnni; called only when cpuid
// reports them). Layout and operand forms: int8_gemm.h / int8_gemm_kernels.h.
//   s8 (W8A8 / s8s8): vpdpbusd zmm on (a + 128) u8 x q s8, one zmm per k-group and panel (16 channels
//     x 4 k); result - 128 * col_sums is the exact signed sum. Register tile MR rows x NP panels:
//     decode (m = 1) reads one panel at a time (s8_gemv_panel: one sequential stream, four accumulators);
//     m <= 4 runs all rows over 4 panels at a time so the 4+ independent accumulator chains hide
//     vpdpbusd latency while the weights stream once; prefill keeps an 8 x 32 C tile in 16 zmm
//     and reuses each pair of packed panels (L2-resident) across all rows of A.
//   W8A16: each 64-byte k-group is read as 16 int32 (one per channel); byte t is sign-extended with
//     shift left / arithmetic shift right, converted to f32 and FMA'd against broadcast x[4g + t]
//     (m < 32); prefill (m >= 32) converts each panel pair to f32 once into a thread-local buffer
//     ([k_padded][16] per panel, 2 x 256 KiB at k = 4096) and runs an 8 x 32 FMA tile over it.
//   Both stream each panel with a software prefetch kPrefetchBytes ahead.
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "kernels/cpu/gemm_avx512.h"
#include "kernels/cpu/int8_gemm_kernels.h"

// GCC 12's AVX-512 intrinsics use _mm512_undefined_*() internally and trip a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace lattice::int8_detail {
namespace {

using avx512::dpbusd;
using avx512::fd_all_rows;
using avx512::fma_acc;
using avx512::store16;
using avx512::tail_mask;

// Software prefetch distance along each panel stream (hardware prefetch alone leaves the decode
// GEMV and the small-m tile below the DRAM stream rate when several panel streams run at once).
constexpr int64_t kPrefetchBytes = 2048;

// Rows [r0, r0 + MR) x panels [p, p + NP).
template <int MR, int NP>
inline void s8_tile(const uint8_t* a, int64_t lda, const PackedInt8& w, int64_t p, int64_t r0,
                    const Int8Epilogue& ep) {
    const int64_t groups = w.k_padded / kInt8GroupK;
    const int64_t ps = w.panel_bytes();
    const int8_t* b = w.panel(p);
    const uint8_t* ar = a + r0 * lda;
    __m512i acc[MR][NP];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
        for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_setzero_si512();
    for (int64_t g = 0; g < groups; ++g) {
        __m512i bv[NP];
#pragma GCC unroll 4
        for (int j = 0; j < NP; ++j) {
            bv[j] = _mm512_load_si512(b + j * ps + g * 64);
            _mm_prefetch(reinterpret_cast<const char*>(b + j * ps + g * 64 + kPrefetchBytes), _MM_HINT_T0);
        }
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
            int32_t v;
            std::memcpy(&v, ar + r * lda + g * 4, 4);
            __m512i av = _mm512_set1_epi32(v);
#pragma GCC unroll 4
            for (int j = 0; j < NP; ++j) dpbusd(acc[r][j], av, bv[j]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) {
        __m512i corr = _mm512_slli_epi32(_mm512_loadu_si512(w.col_sums.data() + (p + j) * kInt8PanelN), 7);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) store16(_mm512_sub_epi32(acc[r][j], corr), r0 + r, p + j, w.n, ep);
    }
}

// All rows of panels [p, p + NP) in tiles of up to MRMAX rows.
template <int NP, int MRMAX>
inline void s8_all_rows(const uint8_t* a, int64_t m, int64_t lda, const PackedInt8& w, int64_t p,
                        const Int8Epilogue& ep) {
    for_row_blocks<MRMAX>(m, [&]<int MR>(int64_t r0) { s8_tile<MR, NP>(a, lda, w, p, r0, ep); });
}

// Decode (m = 1), one panel at a time: a chunk's panels are read in memory order, one sequential stream, and
// no software prefetch (the hardware's keeps one stream at the rate; a prefetch 2 KiB ahead cost 10-25%).
// bench_gemm_int8 w8a8 m = 1 from DRAM, one core, two runs: 960x576 / 3072x576 / 576x1536 / 2048x2048 /
// 49152x576 at 28-34 / 29-30 / 29-30 / 32-33 / 32-33 GB/s, where the 4-panel tile below (4 prefetched
// streams) read 18-19 / 18-19 / 24-25 / 27 / 19. Four accumulators (k-groups g % 4) hide vpdpbusd's
// latency; their sum is exact, so the result is s8_tile's.
inline void s8_gemv_panel(const uint8_t* a, const PackedInt8& w, int64_t p, const Int8Epilogue& ep) {
    const int64_t groups = w.k_padded / kInt8GroupK;
    const int8_t* b = w.panel(p);
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    int64_t g = 0;
    for (; g + 4 <= groups; g += 4) {
        int32_t v[4];
        std::memcpy(v, a + g * 4, 16);
        dpbusd(s0, _mm512_set1_epi32(v[0]), _mm512_load_si512(b + g * 64));
        dpbusd(s1, _mm512_set1_epi32(v[1]), _mm512_load_si512(b + g * 64 + 64));
        dpbusd(s2, _mm512_set1_epi32(v[2]), _mm512_load_si512(b + g * 64 + 128));
        dpbusd(s3, _mm512_set1_epi32(v[3]), _mm512_load_si512(b + g * 64 + 192));
    }
    for (; g < groups; ++g) {
        int32_t v;
        std::memcpy(&v, a + g * 4, 4);
        dpbusd(s0, _mm512_set1_epi32(v), _mm512_load_si512(b + g * 64));
    }
    const __m512i acc = _mm512_add_epi32(_mm512_add_epi32(s0, s1), _mm512_add_epi32(s2, s3));
    const __m512i corr = _mm512_slli_epi32(_mm512_loadu_si512(w.col_sums.data() + p * kInt8PanelN), 7);
    store16(_mm512_sub_epi32(acc, corr), 0, p, w.n, ep);
}


template <int MR, int NP>
inline void f_tile(const float* x, int64_t ldx, const PackedInt8& w, const float* scales, int64_t p, int64_t r0,
                   float* y, int64_t ldy) {
    const int64_t groups = w.k_padded / kInt8GroupK;
    const int64_t ps = w.panel_bytes();
    const int8_t* b = w.panel(p);
    const float* xr = x + r0 * ldx;
    __m512 acc[MR][NP];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
        for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
        __m512 wf[NP][4];
#pragma GCC unroll 4
        for (int j = 0; j < NP; ++j) {
            __m512i v = _mm512_load_si512(b + j * ps + g * 64);
            _mm_prefetch(reinterpret_cast<const char*>(b + j * ps + g * 64 + kPrefetchBytes), _MM_HINT_T0);
            wf[j][0] = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v, 24), 24));
            wf[j][1] = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v, 16), 24));
            wf[j][2] = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v, 8), 24));
            wf[j][3] = _mm512_cvtepi32_ps(_mm512_srai_epi32(v, 24));
        }
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
            const float* xg = xr + r * ldx + g * 4;
#pragma GCC unroll 4
            for (int t = 0; t < 4; ++t) {
                __m512 xv = _mm512_set1_ps(xg[t]);
#pragma GCC unroll 4
                for (int j = 0; j < NP; ++j) fma_acc(acc[r][j], wf[j][t], xv);
            }
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) {
        const int64_t j0 = (p + j) * kInt8PanelN;
        const __mmask16 mk = tail_mask(p + j, w.n);
        __m512 sc = _mm512_maskz_loadu_ps(mk, scales + j0);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) _mm512_mask_storeu_ps(y + (r0 + r) * ldy + j0, mk, _mm512_mul_ps(acc[r][j], sc));
    }
}


template <int NP, int MRMAX>
inline void f_all_rows(const float* x, int64_t m, int64_t ldx, const PackedInt8& w, const float* scales, int64_t p,
                       float* y, int64_t ldy) {
    for_row_blocks<MRMAX>(m, [&]<int MR>(int64_t r0) { f_tile<MR, NP>(x, ldx, w, scales, p, r0, y, ldy); });
}

// Prefill W8A16: panel p converted once to f32, k-major ([k_padded][16] floats), into `out`.
inline void dequant_panel(const int8_t* b, int64_t groups, float* out) {
    for (int64_t g = 0; g < groups; ++g) {
        __m512i v = _mm512_load_si512(b + g * 64);
        float* o = out + g * 64;
        _mm512_store_ps(o, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v, 24), 24)));
        _mm512_store_ps(o + 16, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v, 16), 24)));
        _mm512_store_ps(o + 32, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v, 8), 24)));
        _mm512_store_ps(o + 48, _mm512_cvtepi32_ps(_mm512_srai_epi32(v, 24)));
    }
}

template <int NP>
void fd_panels(const float* x, int64_t m, int64_t ldx, const PackedInt8& w, const float* scales, int64_t p, float* y,
               int64_t ldy, float* bf) {
    const int64_t groups = w.k_padded / kInt8GroupK;
    for (int j = 0; j < NP; ++j) dequant_panel(w.panel(p + j), groups, bf + j * w.k_padded * 16);
    fd_all_rows<NP>(x, m, ldx, bf, w.k_padded, scales, p, w.n, y, ldy);
}

}  // namespace

void s8_panels_avx512(const void* a_void, int64_t m, int64_t lda, const PackedInt8& w, int64_t p0, int64_t p1,
                      const Int8Epilogue& ep) {
    const uint8_t* a = static_cast<const uint8_t*>(a_void);
    int64_t p = p0;
    if (m == 1) {
        for (; p < p1; ++p) s8_gemv_panel(a, w, p, ep);
    } else if (m <= 4) {  // a few rows: weights stream once, 4 panels x m rows of accumulators
        for (; p + 4 <= p1; p += 4) s8_all_rows<4, 4>(a, m, lda, w, p, ep);
        for (; p < p1; ++p) s8_all_rows<1, 4>(a, m, lda, w, p, ep);
    } else {  // prefill: 8 x 32 register tile, each panel pair reused across all rows
        for (; p + 2 <= p1; p += 2) s8_all_rows<2, 8>(a, m, lda, w, p, ep);
        for (; p < p1; ++p) s8_all_rows<1, 8>(a, m, lda, w, p, ep);
    }
}

void w8a16_panels_avx512(const float* x, int64_t m, int64_t ldx, const PackedInt8& w, const float* scales,
                         int64_t p0, int64_t p1, float* y, int64_t ldy) {
    int64_t p = p0;
    if (m <= 2) {
        for (; p + 4 <= p1; p += 4) f_all_rows<4, 2>(x, m, ldx, w, scales, p, y, ldy);
        for (; p < p1; ++p) f_all_rows<1, 2>(x, m, ldx, w, scales, p, y, ldy);
    } else if (m < 32) {
        for (; p + 2 <= p1; p += 2) f_all_rows<2, 6>(x, m, ldx, w, scales, p, y, ldy);
        for (; p < p1; ++p) f_all_rows<1, 6>(x, m, ldx, w, scales, p, y, ldy);
    } else {  // prefill: convert each panel pair to f32 once (thread-local, L2-sized), reuse for all rows
        thread_local std::vector<float, AlignedAllocator64<float>> bf;
        if (bf.size() < size_t(2 * w.k_padded * kInt8PanelN)) bf.resize(size_t(2 * w.k_padded * kInt8PanelN));
        for (; p + 2 <= p1; p += 2) fd_panels<2>(x, m, ldx, w, scales, p, y, ldy, bf.data());
        for (; p < p1; ++p) fd_panels<1>(x, m, ldx, w, scales, p, y, ldy, bf.data());
    }
}

}  // namespace lattice::int8_detail
