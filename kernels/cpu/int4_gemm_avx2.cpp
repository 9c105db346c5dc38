// AVX2 paths of the 4-bit GEMMs (-mavx2 -mfma -mf16c), also used on the AVX-VNNI level. Layout and
// numerics: int4_gemm.h. A 64-byte chunk of a block is read as two 32-byte halves (channels 0..7, 8..15).
//   W4A8: the halves' low and high nibbles are the unsigned operand of vpmaddubsw against the broadcast
//     int8 activations. With 4-bit weights it cannot saturate: a pair sum is at most 2 * 15 * 128 = 3840,
//     and the 8 products of a 32-element sub-block add up in int16 to at most 8 * 3840 = 30720 < 32767
//     before vpmaddwd (x 1) widens them to one int32 per channel. The group epilogue is int4_gemm.h's, so
//     the results are bit-identical to the scalar path. Tile: MR rows x NH halves (m = 1: both halves;
//     otherwise 2 rows x 1 half, which fits the 16 ymm registers).
//   W4A16: nibbles become floats by the 2^23 trick (int4_gemm_avx512.cpp), FMA'd against the broadcast
//     activations per group, then scaled by d (plus m * sum(x) for the affine kind).
//   No software prefetch (int4_gemm_avx512.cpp says why).
#include <immintrin.h>

#include <cstring>

#include "kernels/common/byte_loads.h"
#include "kernels/cpu/int4_gemm_kernels.h"

namespace lattice::int4_detail {
namespace {

inline void fma_acc(__m256& acc, __m256 a, __m256 b) {
    __asm__("vfmadd231ps %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
}

inline __m256 load_f16x8(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// 8 results of channels [c0, c0 + 8) of row r into y, only those < n.
inline void store8(float* y, int64_t c0, int64_t n, __m256 v) {
    if (n - c0 >= 8) {
        _mm256_storeu_ps(y + c0, v);
        return;
    }
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, v);
    for (int64_t i = 0; i < n - c0; ++i) y[c0 + i] = tmp[i];
}

// Half hh's (channels 8 hh .. 8 hh + 7) per-group parameters at block bg: the f16 scales d, and the minima
// (affine) or zero points (zero-point); the others unset.
struct GroupParams {
    __m256 d, mn;
    __m256i z;
};
template <Int4Kind K>
inline GroupParams group_params(const uint8_t* bg, int64_t G, int hh) {
    const uint8_t* bs = bg + hh * 8 * 2;  // f16 scales of channels 8 hh ..
    GroupParams q{load_f16x8(bs + scale_offset(G)), _mm256_setzero_ps(), _mm256_setzero_si256()};
    if constexpr (K == Int4Kind::kAffine) q.mn = load_f16x8(bs + extra_offset(G));
    if constexpr (K == Int4Kind::kZeroPoint)
        q.z = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bg + extra_offset(G) + hh * 8)));
    return q;
}

// The group epilogue of int4_gemm.h for one row and half: the group's exact int32 sums isum (X: the row's sum
// of the group's activations, s their scale) into acc, in the float operations every path performs.
template <Int4Kind K>
inline void group_epilogue(__m256& acc, __m256i isum, const GroupParams& q, int32_t X, float s) {
    const __m256 sg = _mm256_set1_ps(s);
    const __m256 ds = _mm256_mul_ps(q.d, sg);
    if constexpr (K == Int4Kind::kOffset8) {
        fma_acc(acc, _mm256_cvtepi32_ps(_mm256_sub_epi32(isum, _mm256_set1_epi32(8 * X))), ds);
    } else if constexpr (K == Int4Kind::kZeroPoint) {
        const __m256i corr = _mm256_mullo_epi32(q.z, _mm256_set1_epi32(X));
        fma_acc(acc, _mm256_cvtepi32_ps(_mm256_sub_epi32(isum, corr)), ds);
    } else {
        fma_acc(acc, _mm256_cvtepi32_ps(isum), ds);
        fma_acc(acc, _mm256_mul_ps(q.mn, sg), _mm256_set1_ps(float(X)));
    }
}

// Rows [r0, r0 + MR) x halves [h0, h0 + NH) of panel p.
template <Int4Kind K, int MR, int NH>
inline void w4a8_tile(const Int4Acts& a, int64_t r0, const PackedInt4& w, int64_t p, int h0, float* y, int64_t ldy) {
    const int64_t G = w.group, subs = G / kInt4Block, bb = w.block_bytes;
    const uint8_t* b0 = w.block(p, 0);
    const __m256i mask = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc[MR][NH];
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
        for (int h = 0; h < NH; ++h) acc[r][h] = _mm256_setzero_ps();
    for (int64_t g = 0; g < w.groups; ++g) {
        const uint8_t* bg = b0 + g * bb;
        __m256i isum[MR][NH];
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
            for (int h = 0; h < NH; ++h) isum[r][h] = _mm256_setzero_si256();
        for (int64_t s = 0; s < subs; ++s) {
            __m256i s16[MR][NH];
#pragma GCC unroll 4
            for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
                for (int h = 0; h < NH; ++h) s16[r][h] = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int c = 0; c < 4; ++c) {
                __m256i lo[NH], hi[NH];
#pragma GCC unroll 2
                for (int h = 0; h < NH; ++h) {
                    const uint8_t* src = bg + s * 256 + c * 64 + (h0 + h) * 32;
                    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
                    lo[h] = _mm256_and_si256(v, mask);
                    hi[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
                }
#pragma GCC unroll 4
                for (int r = 0; r < MR; ++r) {
                    const int8_t* xs = a.q + (r0 + r) * a.ldq + g * G + s * kInt4Block + c * 4;
                    const __m256i alo = _mm256_set1_epi32(load_i32(xs)), ahi = _mm256_set1_epi32(load_i32(xs + 16));
#pragma GCC unroll 2
                    for (int h = 0; h < NH; ++h) {
                        s16[r][h] = _mm256_add_epi16(s16[r][h], _mm256_maddubs_epi16(lo[h], alo));
                        s16[r][h] = _mm256_add_epi16(s16[r][h], _mm256_maddubs_epi16(hi[h], ahi));
                    }
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
                for (int h = 0; h < NH; ++h)
                    isum[r][h] = _mm256_add_epi32(isum[r][h], _mm256_madd_epi16(s16[r][h], ones));
        }
#pragma GCC unroll 2
        for (int h = 0; h < NH; ++h) {
            const GroupParams q = group_params<K>(bg, G, h0 + h);
#pragma GCC unroll 4
            for (int r = 0; r < MR; ++r)
                group_epilogue<K>(acc[r][h], isum[r][h], q, a.xsum[(r0 + r) * a.ldsum + g],
                                  a.scales[(r0 + r) * a.ldsum + g]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
        for (int h = 0; h < NH; ++h) store8(y + (r0 + r) * ldy, p * kInt8PanelN + (h0 + h) * 8, w.n, acc[r][h]);
}

template <Int4Kind K>
void w4a8_panels(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y, int64_t ldy) {
    for (int64_t p = p0; p < p1; ++p) {
        if (m == 1) {
            w4a8_tile<K, 1, 2>(a, 0, w, p, 0, y, ldy);
            continue;
        }
        for (int h = 0; h < 2; ++h) {
            int64_t r0 = 0;
            for (; r0 + 2 <= m; r0 += 2) w4a8_tile<K, 2, 1>(a, r0, w, p, h, y, ldy);
            if (r0 < m) w4a8_tile<K, 1, 1>(a, r0, w, p, h, y, ldy);
        }
    }
}

// ---- W4A16 ----

constexpr int32_t kMagic = 0x4B000000;  // float bits of 2^23

template <Int4Kind K>
inline __m256 w4_bias(const uint8_t* bg, int64_t G, int h) {
    if constexpr (K == Int4Kind::kOffset8) return _mm256_set1_ps(8388616.0f);
    if constexpr (K == Int4Kind::kAffine) return _mm256_set1_ps(8388608.0f);
    const __m256i z =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bg + extra_offset(G) + h * 8)));
    return _mm256_castsi256_ps(_mm256_or_si256(z, _mm256_set1_epi32(kMagic)));
}

template <int kShift>
inline __m256 w4_nibble(__m256i v, __m256 bias) {
    const __m256i sh = kShift ? _mm256_srli_epi32(v, kShift) : v;
    const __m256i bits = _mm256_or_si256(_mm256_and_si256(sh, _mm256_set1_epi32(0xF)), _mm256_set1_epi32(kMagic));
    return _mm256_sub_ps(_mm256_castsi256_ps(bits), bias);
}

// Rows [r0, r0 + MR) x half h of panel p.
template <Int4Kind K, int MR>
inline void w4a16_tile(const F32Acts& a, int64_t r0, const PackedInt4& w, int64_t p, int h, float* y, int64_t ldy) {
    const int64_t G = w.group, subs = G / kInt4Block, bb = w.block_bytes;
    const uint8_t* b0 = w.block(p, 0);
    __m256 acc[MR];
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < w.groups; ++g) {
        const uint8_t* bg = b0 + g * bb;
        const __m256 bias = w4_bias<K>(bg, G, h);
        __m256 sum[MR];
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) sum[r] = _mm256_setzero_ps();
        for (int64_t s = 0; s < subs; ++s)
#pragma GCC unroll 4
            for (int c = 0; c < 4; ++c) {
                const uint8_t* src = bg + s * 256 + c * 64 + h * 32;
                const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
                const __m256 wv[8] = {w4_nibble<0>(v, bias),  w4_nibble<8>(v, bias), w4_nibble<16>(v, bias),
                                      w4_nibble<24>(v, bias), w4_nibble<4>(v, bias), w4_nibble<12>(v, bias),
                                      w4_nibble<20>(v, bias), w4_nibble<28>(v, bias)};
#pragma GCC unroll 4
                for (int r = 0; r < MR; ++r) {
                    const float* xs = a.x + (r0 + r) * a.ldx + g * G + s * kInt4Block + c * 4;
#pragma GCC unroll 4
                    for (int t = 0; t < 4; ++t) {
                        fma_acc(sum[r], wv[t], _mm256_set1_ps(xs[t]));
                        fma_acc(sum[r], wv[4 + t], _mm256_set1_ps(xs[16 + t]));
                    }
                }
            }
        const __m256 d = load_f16x8(bg + scale_offset(G) + h * 16);
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
            fma_acc(acc[r], sum[r], d);
            if constexpr (K == Int4Kind::kAffine)
                fma_acc(acc[r], load_f16x8(bg + extra_offset(G) + h * 16),
                        _mm256_set1_ps(a.xsum[(r0 + r) * a.ldsum + g]));
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) store8(y + (r0 + r) * ldy, p * kInt8PanelN + h * 8, w.n, acc[r]);
}

template <Int4Kind K>
void w4a16_panels(const F32Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y, int64_t ldy) {
    for (int64_t p = p0; p < p1; ++p)
        for (int h = 0; h < 2; ++h) {
            int64_t r0 = 0;
            for (; r0 + 4 <= m; r0 += 4) w4a16_tile<K, 4>(a, r0, w, p, h, y, ldy);
            for (; r0 < m; ++r0) w4a16_tile<K, 1>(a, r0, w, p, h, y, ldy);
        }
}

}  // namespace

void w4a8_panels_avx2(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y,
                      int64_t ldy) {
    with_int4_kind(w.kind, [&](auto kind) { w4a8_panels<kind.value>(a, m, w, p0, p1, y, ldy); });
}

void w4a16_panels_avx2(const F32Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y,
                       int64_t ldy) {
    with_int4_kind(w.kind, [&](auto kind) { w4a16_panels<kind.value>(a, m, w, p0, p1, y, ldy); });
}

}  // namespace lattice::int4_detail
