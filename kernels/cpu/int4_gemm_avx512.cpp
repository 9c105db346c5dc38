// AVX-512 VNNI paths of the 4-bit GEMMs (compiled with -mavx512f/bw/vl/dq/vnni; called only when cpuid
// reports them). Layout and numerics: int4_gemm.h.
//   W4A8: a 64-byte chunk of a block (16 channels x 8 nibbles) is split in registers into its low and
//     high nibbles (and, shift + and): two u8 operands of vpdpbusd against the broadcast int8 activations
//     (the signed operand, so no +128 correction). Each group's int32 sums then take the group epilogue
//     of int4_gemm.h (vcvtph2ps for the f16 scales, the product with the row's group scale, one or two
//     FMAs), in the order the scalar path uses,
//     so the results are bit-identical to it. Decode (m = 1) reads one panel at a time (one sequential stream
//     per thread, four accumulators per group); register tile MR rows x NP panels for m = 2 (two panels) and
//     larger m (4 rows x 2 panels: prefill, each panel pair reused across all rows of A from L1/L2).
//   W4A16: nibble t of each 32-bit lane becomes a float by the 2^23 trick (bits 0x4B000000 | q is
//     2^23 + q; subtracting 2^23 + z leaves q - z exactly): shift, vpternlogd (and + or), subtract, then
//     an FMA against the broadcast activation, per group summed and scaled by d (plus m * sum(x) for the
//     affine kind). For m >= 16 each panel pair is dequantized to f32 once ([k_padded][16] per panel) and an
//     8 x 32 FMA tile runs over it.
//   No software prefetch: on Zen 4 the hardware prefetchers alone keep the m = 1 GEMV at the DRAM stream
//   rate, and a prefetch 0.5-8 KiB ahead cost 5-25% (bench_gemm_int8 --modes w4a8, docs/quantization.md).
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "kernels/common/byte_loads.h"
#include "kernels/cpu/gemm_avx512.h"
#include "kernels/cpu/int4_avx512.h"
#include "kernels/cpu/int4_gemm_kernels.h"

// GCC 12's AVX-512 intrinsics use _mm512_undefined_*() internally and trip a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace lattice::int4_detail {
namespace {

using avx512::dpbusd;
using avx512::fd_all_rows;
using avx512::fma_acc;
using avx512::load_f16x16;
using avx512::tail_mask;

// Rows [r0, r0 + MR) x panels [p, p + NP).
template <Int4Kind K, int MR, int NP>
inline void w4a8_tile(const Int4Acts& a, int64_t r0, const PackedInt4& w, int64_t p, float* y, int64_t ldy) {
    const int64_t G = w.group, subs = G / kInt4Block, bb = w.block_bytes, ps = w.groups * bb;
    const uint8_t* b0 = w.block(p, 0);
    const __m512i mask = _mm512_set1_epi8(0x0F);
    __m512 acc[MR][NP];
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
        for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_setzero_ps();
    for (int64_t g = 0; g < w.groups; ++g) {
        const uint8_t* bg = b0 + g * bb;
        __m512i isum[MR][NP];
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
            for (int j = 0; j < NP; ++j) isum[r][j] = _mm512_setzero_si512();
        for (int64_t s = 0; s < subs; ++s) {
#pragma GCC unroll 4
            for (int c = 0; c < 4; ++c) {
                __m512i lo[NP], hi[NP];
#pragma GCC unroll 4
                for (int j = 0; j < NP; ++j) {
                    const uint8_t* src = bg + j * ps + s * 256 + c * 64;
                    const __m512i v = _mm512_loadu_si512(src);
                    lo[j] = _mm512_and_si512(v, mask);
                    hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
                }
#pragma GCC unroll 4
                for (int r = 0; r < MR; ++r) {
                    const int8_t* xs = a.q + (r0 + r) * a.ldq + g * G + s * kInt4Block + c * 4;
                    const __m512i alo = _mm512_set1_epi32(load_i32(xs)), ahi = _mm512_set1_epi32(load_i32(xs + 16));
#pragma GCC unroll 4
                    for (int j = 0; j < NP; ++j) {
                        dpbusd(isum[r][j], lo[j], alo);
                        dpbusd(isum[r][j], hi[j], ahi);
                    }
                }
            }
        }
#pragma GCC unroll 4
        for (int j = 0; j < NP; ++j) {
            const GroupParams q = group_params<K>(bg + j * ps, G);
#pragma GCC unroll 4
            for (int r = 0; r < MR; ++r)
                group_epilogue<K>(acc[r][j], isum[r][j], q, a.xsum[(r0 + r) * a.ldsum + g],
                                  a.scales[(r0 + r) * a.ldsum + g]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) {
        const __mmask16 mk = tail_mask(p + j, w.n);
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) _mm512_mask_storeu_ps(y + (r0 + r) * ldy + (p + j) * kInt8PanelN, mk, acc[r][j]);
    }
}

// Decode (m = 1), one panel at a time: a chunk's panels are read in memory order, one sequential stream (the
// 4-panel tile's 4 streams reached 55-80% of the per-core DRAM rate, this 90-100%: docs/quantization.md). Four
// int32 accumulators per group (chunks c even / odd, low / high nibbles) keep vpdpbusd's latency hidden; their
// sum is exact, and group_epilogue ends each group, so the result is w4a8_tile's.
template <Int4Kind K>
inline void w4a8_gemv_panel(const Int4Acts& a, const PackedInt4& w, int64_t p, float* y) {
    const int64_t G = w.group, subs = G / kInt4Block;
    const uint8_t* b0 = w.block(p, 0);
    const __m512i mask = _mm512_set1_epi8(0x0F);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t g = 0; g < w.groups; ++g) {
        const uint8_t* bg = b0 + g * w.block_bytes;
        __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
        for (int64_t s = 0; s < subs; ++s) {
            const int8_t* xs = a.q + g * G + s * kInt4Block;
            const __m512i v0 = _mm512_loadu_si512(bg + s * 256), v1 = _mm512_loadu_si512(bg + s * 256 + 64);
            const __m512i v2 = _mm512_loadu_si512(bg + s * 256 + 128), v3 = _mm512_loadu_si512(bg + s * 256 + 192);
            dpbusd(s0, _mm512_and_si512(v0, mask), _mm512_set1_epi32(load_i32(xs)));
            dpbusd(s1, _mm512_and_si512(_mm512_srli_epi16(v0, 4), mask), _mm512_set1_epi32(load_i32(xs + 16)));
            dpbusd(s2, _mm512_and_si512(v1, mask), _mm512_set1_epi32(load_i32(xs + 4)));
            dpbusd(s3, _mm512_and_si512(_mm512_srli_epi16(v1, 4), mask), _mm512_set1_epi32(load_i32(xs + 20)));
            dpbusd(s0, _mm512_and_si512(v2, mask), _mm512_set1_epi32(load_i32(xs + 8)));
            dpbusd(s1, _mm512_and_si512(_mm512_srli_epi16(v2, 4), mask), _mm512_set1_epi32(load_i32(xs + 24)));
            dpbusd(s2, _mm512_and_si512(v3, mask), _mm512_set1_epi32(load_i32(xs + 12)));
            dpbusd(s3, _mm512_and_si512(_mm512_srli_epi16(v3, 4), mask), _mm512_set1_epi32(load_i32(xs + 28)));
        }
        const __m512i isum = _mm512_add_epi32(_mm512_add_epi32(s0, s1), _mm512_add_epi32(s2, s3));
        group_epilogue<K>(acc, isum, group_params<K>(bg, G), a.xsum[g], a.scales[g]);
    }
    _mm512_mask_storeu_ps(y + p * kInt8PanelN, tail_mask(p, w.n), acc);
}


template <Int4Kind K, int NP, int MRMAX>
inline void w4a8_all_rows(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p, float* y, int64_t ldy) {
    for_row_blocks<MRMAX>(m, [&]<int MR>(int64_t r0) { w4a8_tile<K, MR, NP>(a, r0, w, p, y, ldy); });
}

template <Int4Kind K>
void w4a8_panels(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y, int64_t ldy) {
    int64_t p = p0;
    if (m == 1) {
        for (; p < p1; ++p) w4a8_gemv_panel<K>(a, w, p, y);
    } else if (m == 2) {
        for (; p + 2 <= p1; p += 2) w4a8_tile<K, 2, 2>(a, 0, w, p, y, ldy);
        for (; p < p1; ++p) w4a8_tile<K, 2, 1>(a, 0, w, p, y, ldy);
    } else {
        for (; p + 2 <= p1; p += 2) w4a8_all_rows<K, 2, 4>(a, m, w, p, y, ldy);
        for (; p < p1; ++p) w4a8_all_rows<K, 1, 4>(a, m, w, p, y, ldy);
    }
}

// ---- W4A16 ----

constexpr uint32_t kMagic = 0x4B000000u;  // float bits of 2^23

// Per-channel value subtracted from 2^23 + q: 2^23 + 8, 2^23 + z, or 2^23 (affine).
template <Int4Kind K>
inline __m512 w4_bias(const uint8_t* bs, int64_t G) {
    if constexpr (K == Int4Kind::kOffset8) return _mm512_set1_ps(8388616.0f);
    if constexpr (K == Int4Kind::kAffine) return _mm512_set1_ps(8388608.0f);
    const __m512i z = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bs + extra_offset(G))));
    return _mm512_castsi512_ps(_mm512_or_si512(z, _mm512_set1_epi32(int32_t(kMagic))));
}

// q - z of nibble `shift / 4` of every 32-bit lane, as f32.
template <int kShift>
inline __m512 w4_nibble(__m512i v, __m512 bias) {
    const __m512i sh = kShift ? _mm512_srli_epi32(v, kShift) : v;
    // (sh & 0xF) | kMagic: vpternlogd with A = sh, B = 0xF, C = magic -> (A & B) | C = 0xEA.
    const __m512i bits =
        _mm512_ternarylogic_epi32(sh, _mm512_set1_epi32(0xF), _mm512_set1_epi32(int32_t(kMagic)), 0xEA);
    return _mm512_sub_ps(_mm512_castsi512_ps(bits), bias);
}

template <Int4Kind K, int MR, int NP>
inline void w4a16_tile(const F32Acts& a, int64_t r0, const PackedInt4& w, int64_t p, float* y, int64_t ldy) {
    const int64_t G = w.group, subs = G / kInt4Block, bb = w.block_bytes, ps = w.groups * bb;
    const uint8_t* b0 = w.block(p, 0);
    __m512 acc[MR][NP];
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
        for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_setzero_ps();
    for (int64_t g = 0; g < w.groups; ++g) {
        const uint8_t* bg = b0 + g * bb;
        __m512 sum[MR][NP], bias[NP];
#pragma GCC unroll 4
        for (int j = 0; j < NP; ++j) {
            bias[j] = w4_bias<K>(bg + j * ps, G);
#pragma GCC unroll 4
            for (int r = 0; r < MR; ++r) sum[r][j] = _mm512_setzero_ps();
        }
        for (int64_t s = 0; s < subs; ++s) {
#pragma GCC unroll 4
            for (int c = 0; c < 4; ++c) {
#pragma GCC unroll 4
                for (int j = 0; j < NP; ++j) {
                    const uint8_t* src = bg + j * ps + s * 256 + c * 64;
                    const __m512i v = _mm512_loadu_si512(src);
                    __m512 wv[8];
                    wv[0] = w4_nibble<0>(v, bias[j]);
                    wv[1] = w4_nibble<8>(v, bias[j]);
                    wv[2] = w4_nibble<16>(v, bias[j]);
                    wv[3] = w4_nibble<24>(v, bias[j]);
                    wv[4] = w4_nibble<4>(v, bias[j]);
                    wv[5] = w4_nibble<12>(v, bias[j]);
                    wv[6] = w4_nibble<20>(v, bias[j]);
                    wv[7] = w4_nibble<28>(v, bias[j]);
#pragma GCC unroll 4
                    for (int r = 0; r < MR; ++r) {
                        const float* xs = a.x + (r0 + r) * a.ldx + g * G + s * kInt4Block + c * 4;
#pragma GCC unroll 4
                        for (int t = 0; t < 4; ++t) {
                            fma_acc(sum[r][j], wv[t], _mm512_set1_ps(xs[t]));
                            fma_acc(sum[r][j], wv[4 + t], _mm512_set1_ps(xs[16 + t]));
                        }
                    }
                }
            }
        }
#pragma GCC unroll 4
        for (int j = 0; j < NP; ++j) {
            const uint8_t* bs = bg + j * ps;
            const __m512 d = load_f16x16(bs + scale_offset(G));
#pragma GCC unroll 4
            for (int r = 0; r < MR; ++r) {
                fma_acc(acc[r][j], sum[r][j], d);
                if constexpr (K == Int4Kind::kAffine)
                    fma_acc(acc[r][j], load_f16x16(bs + extra_offset(G)),
                            _mm512_set1_ps(a.xsum[(r0 + r) * a.ldsum + g]));
            }
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) {
        const __mmask16 mk = tail_mask(p + j, w.n);
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) _mm512_mask_storeu_ps(y + (r0 + r) * ldy + (p + j) * kInt8PanelN, mk, acc[r][j]);
    }
}

// Prefill: panel p dequantized to f32, k-major [k_padded][16], into out.
template <Int4Kind K>
inline void dequant_panel(const PackedInt4& w, int64_t p, float* out) {
    const int64_t G = w.group, subs = G / kInt4Block;
    for (int64_t g = 0; g < w.groups; ++g) {
        const uint8_t* bg = w.block(p, g);
        const __m512 bias = w4_bias<K>(bg, G), d = load_f16x16(bg + scale_offset(G));
        [[maybe_unused]] __m512 mn;
        if constexpr (K == Int4Kind::kAffine) mn = load_f16x16(bg + extra_offset(G));
        for (int64_t s = 0; s < subs; ++s)
            for (int c = 0; c < 4; ++c) {
                const __m512i v = _mm512_loadu_si512(bg + s * 256 + c * 64);
                __m512 wv[8] = {w4_nibble<0>(v, bias),  w4_nibble<8>(v, bias), w4_nibble<16>(v, bias),
                                w4_nibble<24>(v, bias), w4_nibble<4>(v, bias), w4_nibble<12>(v, bias),
                                w4_nibble<20>(v, bias), w4_nibble<28>(v, bias)};
                float* o = out + (g * G + s * kInt4Block + c * 4) * 16;
                for (int t = 0; t < 4; ++t) {
                    // (q - z) d is exact; q d + m rounds once (the dequantized value of int4_gemm.h).
                    if constexpr (K == Int4Kind::kAffine) {
                        _mm512_store_ps(o + t * 16, _mm512_fmadd_ps(wv[t], d, mn));
                        _mm512_store_ps(o + (16 + t) * 16, _mm512_fmadd_ps(wv[4 + t], d, mn));
                    } else {
                        _mm512_store_ps(o + t * 16, _mm512_mul_ps(wv[t], d));
                        _mm512_store_ps(o + (16 + t) * 16, _mm512_mul_ps(wv[4 + t], d));
                    }
                }
            }
    }
}

template <Int4Kind K, int NP>
void fd_panels(const F32Acts& a, int64_t m, const PackedInt4& w, int64_t p, float* y, int64_t ldy, float* bf) {
    for (int j = 0; j < NP; ++j) dequant_panel<K>(w, p + j, bf + j * w.k_padded * 16);
    fd_all_rows<NP>(a.x, m, a.ldx, bf, w.k_padded, nullptr, p, w.n, y, ldy);
}

template <Int4Kind K>
void w4a16_panels(const F32Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y, int64_t ldy) {
    int64_t p = p0;
    if (m == 1) {
        for (; p + 4 <= p1; p += 4) w4a16_tile<K, 1, 4>(a, 0, w, p, y, ldy);
        for (; p < p1; ++p) w4a16_tile<K, 1, 1>(a, 0, w, p, y, ldy);
    } else if (m < 16) {
        for (; p + 2 <= p1; p += 2)
            for_row_blocks<4>(m, [&]<int MR>(int64_t r0) { w4a16_tile<K, MR, 2>(a, r0, w, p, y, ldy); });
        for (; p < p1; ++p)
            for_row_blocks<4>(m, [&]<int MR>(int64_t r0) { w4a16_tile<K, MR, 1>(a, r0, w, p, y, ldy); });
    } else {  // prefill: each panel pair dequantized to f32 once (thread-local, L2-sized), reused for all rows
        thread_local std::vector<float, AlignedAllocator64<float>> bf;
        if (bf.size() < size_t(2 * w.k_padded * kInt8PanelN)) bf.resize(size_t(2 * w.k_padded * kInt8PanelN));
        for (; p + 2 <= p1; p += 2) fd_panels<K, 2>(a, m, w, p, y, ldy, bf.data());
        for (; p < p1; ++p) fd_panels<K, 1>(a, m, w, p, y, ldy, bf.data());
    }
}

}  // namespace

void w4a8_panels_avx512(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y,
                        int64_t ldy) {
    with_int4_kind(w.kind, [&](auto kind) { w4a8_panels<kind.value>(a, m, w, p0, p1, y, ldy); });
}

void w4a16_panels_avx512(const F32Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y,
                         int64_t ldy) {
    with_int4_kind(w.kind, [&](auto kind) { w4a16_panels<kind.value>(a, m, w, p0, p1, y, ldy); });
}

}  // namespace lattice::int4_detail
