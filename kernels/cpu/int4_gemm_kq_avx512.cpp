// AVX-512 VNNI path of the W4A8 GEMM on the K-quant layout (GGUF Q4_K / Q6_K super-blocks kept at the file's
// bits; layout and numerics: int4_gemm.h). A tile is MR rows x one panel (16 channels): decode (m = 1) reads
// one panel at a time, one sequential stream per thread (as the group-form GEMV, int4_gemm_avx512.cpp); prefill
// runs 4-row tiles over each panel, whose super-blocks stay in L1/L2 across the row blocks (Q4_K: 4 rows x 2
// panels sharing each broadcast, the scale tables unpacked once per panel pair, not per row block; Q6_K: the same
// tile over the pair's q joined once into a buffer: at m >= 16 they ran at 0.74-0.81x (Q4_K) and 0.64-0.69x
// (Q6_K) of the group form's 4 x 2 tile with 1-panel tiles that unpacked per row block, bench_gemm_int4).
//   Q4_K: per super-block the 16 channels' 12 scale bytes (one 16-byte row per byte index) give the eight
//     sub-blocks' 6-bit scales and minimums with byte shifts and masks; d sc and dmin mn (exact in f32) go to a
//     stack table; per group the low and high nibbles of each 64-byte chunk are the unsigned vpdpbusd operands
//     (as the group form), and the group epilogue is int4_gemm.h's.
//   Q6_K: a chunk's 4-bit parts as above, their top two bits shifted into bits 4..5 from the group's two 64-byte
//     top-bit vectors (shift, and, vpternlogd); the low nibbles are sub-block a, the high ones sub-block b, each
//     summed in int32, then sc_a (I_a - 32 X_a) + sc_b (I_b - 32 X_b) (vpmulld) and one FMA per group.
// Every float operation is the scalar reference's (int4_gemm_kq_ref.cpp), so results are the same bits.
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "kernels/common/byte_loads.h"
#include "kernels/cpu/gemm_avx512.h"
#include "kernels/cpu/int4_avx512.h"
#include "kernels/cpu/int4_gemm_kernels.h"
#include "kernels/cpu/row_blocks.h"

// GCC 12's AVX-512 intrinsics use _mm512_undefined_*() internally and trip a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace lattice::int4_detail {
namespace {

using avx512::dpbusd;
using avx512::fma_acc;
using avx512::load_f16x16;
using avx512::tail_mask;

// An MR x NP tile of accumulators (f32 or int32 lanes) set to zero.
template <class V, int MR, int NP>
[[gnu::always_inline]] inline void zero_tile(V (&acc)[MR][NP]) {
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
        for (int j = 0; j < NP; ++j) acc[r][j] = V{};
}

// The tile's MR x NP panels of outputs into y (rows r0.., panels p..; the last panel masked to n).
template <int MR, int NP>
inline void store_tile(const __m512 (&acc)[MR][NP], int64_t r0, const PackedInt4& w, int64_t p, float* y,
                       int64_t ldy) {
#pragma GCC unroll 2
    for (int j = 0; j < NP; ++j) {
        const __mmask16 mk = tail_mask(p + j, w.n);
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) _mm512_mask_storeu_ps(y + (r0 + r) * ldy + (p + j) * kInt8PanelN, mk, acc[r][j]);
    }
}

// Chunk c of group gi in a prefill tile: for rows [r0, r0 + MR) the chunk's 4 activation bytes of the group's
// first 16 broadcast against the NP panels' low elements lo[j] into slo[r][j], those of its last 16 against the
// high elements hi[j] into shi[r][j]. Q4_K passes one accumulator for both (a group's nibbles share a scale);
// Q6_K's sub-blocks a and b keep their own. Always inlined: the accumulators must stay in registers.
template <int MR, int NP>
[[gnu::always_inline]] inline void dot_chunk(const Int4Acts& a, int64_t r0, int64_t gi, int c,
                                             const __m512i (&lo)[NP], const __m512i (&hi)[NP],
                                             __m512i (&slo)[MR][NP], __m512i (&shi)[MR][NP]) {
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
        const int8_t* xs = a.q + (r0 + r) * a.ldq + gi * 32 + c * 4;
        const __m512i alo = _mm512_set1_epi32(load_i32(xs)), ahi = _mm512_set1_epi32(load_i32(xs + 16));
#pragma GCC unroll 2
        for (int j = 0; j < NP; ++j) {
            dpbusd(slo[r][j], lo[j], alo);
            dpbusd(shi[r][j], hi[j], ahi);
        }
    }
}

// Rows [r0, r0 + MR) x Q4_K panels [p, p + NP), the scale tables precomputed (q4k_panel_tables). A chunk's low
// and high nibbles sum into one int32 accumulator per row and panel (exact), and NP panels share each
// broadcast activation, as the group form's 4 x 2 tile.
template <int MR, int NP>
inline void q4k_tile(const Int4Acts& a, int64_t r0, const PackedInt4& w, int64_t p, const float (*tab)[16], float* y,
                     int64_t ldy) {
    const __m512i mask = _mm512_set1_epi8(0x0F);
    const int64_t supers = w.k / 256;
    __m512 acc[MR][NP];
    zero_tile(acc);
    for (int64_t sbi = 0; sbi < supers; ++sbi) {
        const uint8_t* sb[NP];
#pragma GCC unroll 2
        for (int j = 0; j < NP; ++j) sb[j] = w.kq_block(p + j, sbi);
        for (int g = 0; g < 8; ++g) {
            const int64_t gi = sbi * 8 + g;
            __m512i isum[MR][NP];
            zero_tile(isum);
#pragma GCC unroll 4
            for (int c = 0; c < 4; ++c) {
                __m512i lo[NP], hi[NP];
#pragma GCC unroll 2
                for (int j = 0; j < NP; ++j) {
                    const __m512i v = _mm512_loadu_si512(sb[j] + kKqQ4Nib + g * 256 + c * 64);
                    lo[j] = _mm512_and_si512(v, mask);
                    hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
                }
                dot_chunk<MR, NP>(a, r0, gi, c, lo, hi, isum, isum);
            }
#pragma GCC unroll 2
            for (int j = 0; j < NP; ++j) {
                const float(*t)[16] = tab + (j * supers + sbi) * 16;
                const __m512 dg = _mm512_load_ps(t[g]), mg = _mm512_load_ps(t[8 + g]);
#pragma GCC unroll 4
                for (int r = 0; r < MR; ++r) {
                    const int64_t at = (r0 + r) * a.ldsum + gi;
                    q4k_epilogue(acc[r][j], isum[r][j], dg, mg, a.scales[at], a.xsum[at]);
                }
            }
        }
    }
    store_tile<MR, NP>(acc, r0, w, p, y, ldy);
}

// All m rows of Q4_K panels [p, p + NP).
template <int NP>
inline void q4k_all_rows(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p, float* y, int64_t ldy) {
    thread_local std::vector<float, AlignedAllocator64<float>> tab;
    tab.resize(size_t(NP * (w.k / 256) * 16 * 16));
    auto* t = reinterpret_cast<float(*)[16]>(tab.data());
    q4k_panel_tables(w, p, NP, t);
    for_row_blocks<4>(m, [&]<int MR>(int64_t r0) { q4k_tile<MR, NP>(a, r0, w, p, t, y, ldy); });
}

// Decode (m = 1), modeled on the group form's GEMV (int4_gemm_avx512.cpp): four int32 accumulators per group
// (chunks even / odd, low / high nibbles; their sum is exact) keep vpdpbusd's latency hidden, and each group's
// scale and minimum are converted where the epilogue needs them. The float operations are q4k_tile's.
inline void q4k_gemv(const Int4Acts& a, const PackedInt4& w, int64_t p, float* y) {
    const __m512i mask = _mm512_set1_epi8(0x0F), hmask = _mm512_set1_epi8(char(0xF0));
    const __m128i m63 = _mm_set1_epi8(63), m15 = _mm_set1_epi8(15), m48 = _mm_set1_epi8(48);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t sbi = 0; sbi < w.k / 256; ++sbi) {
        const uint8_t* sb = w.kq_block(p, sbi);
        const __m512 d = load_f16x16(sb + kKqQ4D), dmin = load_f16x16(sb + kKqQ4Dmin);
        const uint8_t* sc0 = sb + kKqQ4Scales;
        for (int g = 0; g < 8; ++g) {
            const int64_t gi = sbi * 8 + g;
            const uint8_t* bg = sb + kKqQ4Nib + g * 256;
            const int8_t* xs = a.q + gi * 32;
            const __m512i v0 = _mm512_loadu_si512(bg), v1 = _mm512_loadu_si512(bg + 64);
            const __m512i v2 = _mm512_loadu_si512(bg + 128), v3 = _mm512_loadu_si512(bg + 192);
            // High nibbles in place (v & 0xF0 = 16 q): s1, s3 sum 16x, divided once per group (exact), which
            // saves a shift per chunk.
            __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
            dpbusd(s0, _mm512_and_si512(v0, mask), _mm512_set1_epi32(load_i32(xs)));
            dpbusd(s1, _mm512_and_si512(v0, hmask), _mm512_set1_epi32(load_i32(xs + 16)));
            dpbusd(s2, _mm512_and_si512(v1, mask), _mm512_set1_epi32(load_i32(xs + 4)));
            dpbusd(s3, _mm512_and_si512(v1, hmask), _mm512_set1_epi32(load_i32(xs + 20)));
            dpbusd(s0, _mm512_and_si512(v2, mask), _mm512_set1_epi32(load_i32(xs + 8)));
            dpbusd(s1, _mm512_and_si512(v2, hmask), _mm512_set1_epi32(load_i32(xs + 24)));
            dpbusd(s2, _mm512_and_si512(v3, mask), _mm512_set1_epi32(load_i32(xs + 12)));
            dpbusd(s3, _mm512_and_si512(v3, hmask), _mm512_set1_epi32(load_i32(xs + 28)));
            __m128i sc, mn;
            if (g < 4) {
                sc = _mm_and_si128(load128(sc0 + 16 * g), m63);
                mn = _mm_and_si128(load128(sc0 + 16 * (g + 4)), m63);
            } else {
                const __m128i lo = load128(sc0 + 16 * (g + 4));
                const __m128i top = _mm_srli_epi16(load128(sc0 + 16 * (g - 4)), 2);
                sc = _mm_or_si128(_mm_and_si128(lo, m15), _mm_and_si128(top, m48));
                mn = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(lo, 4), m15),
                                  _mm_and_si128(_mm_srli_epi16(load128(sc0 + 16 * g), 2), m48));
            }
            const __m512i isum =
                _mm512_add_epi32(_mm512_add_epi32(s0, s2), _mm512_srai_epi32(_mm512_add_epi32(s1, s3), 4));
            const __m512 mneg = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(dmin, u8_to_ps(mn)));
            q4k_epilogue(acc, isum, _mm512_mul_ps(d, u8_to_ps(sc)), mneg, a.scales[gi], a.xsum[gi]);
        }
    }
    _mm512_mask_storeu_ps(y + p * kInt8PanelN, tail_mask(p, w.n), acc);
}

// Decode (m = 1): the chunks joined in registers as they stream (no buffer to write and read back).
inline void q6k_gemv(const Int4Acts& a, const PackedInt4& w, int64_t p, float* y) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t sbi = 0; sbi < w.k / 256; ++sbi) {
        const uint8_t* sb = w.kq_block(p, sbi);
        const __m512 dv = load_f16x16(sb + kKqQ6D);
        for (int g = 0; g < 8; ++g) {
            const int64_t gi = sbi * 8 + g;
            const uint8_t* bg = sb + kKqQ6Nib + g * kKqQ6Group;
            __m512i ia = _mm512_setzero_si512(), ib = ia;
            const __m512i h0 = _mm512_loadu_si512(bg + 256), h1 = _mm512_loadu_si512(bg + 320);
#pragma GCC unroll 4
            for (int c = 0; c < 4; ++c) {
                const __m512i h = c < 2 ? h0 : h1;
                const Q6Pair q = q6_chunk(_mm512_loadu_si512(bg + c * 64), c % 2 ? _mm512_srli_epi16(h, 4) : h);
                dpbusd(ia, q.lo, _mm512_set1_epi32(load_i32(a.q + gi * 32 + c * 4)));
                dpbusd(ib, q.hi, _mm512_set1_epi32(load_i32(a.q + gi * 32 + c * 4 + 16)));
            }
            q6k_epilogue(acc, ia, ib, Q6Scales(sb, g, dv), a, gi);
        }
    }
    _mm512_mask_storeu_ps(y + p * kInt8PanelN, tail_mask(p, w.n), acc);
}

// Prefill: NP Q6_K panels' q (0..63) joined once per panel group (not per row block) into buf: group g of
// super-block sb of panel j at ((j * supers + sb) * 8 + g) * 512, chunk c's sub-block a (low) at c * 64 and
// sub-block b (high) at 256 + c * 64, the vpdpbusd operand order of the layout's chunks.
inline void q6k_panel_unpack(const PackedInt4& w, int64_t p, int np, uint8_t* buf) {
    const int64_t supers = w.k / 256;
    for (int j = 0; j < np; ++j)
        for (int64_t sbi = 0; sbi < supers; ++sbi)
            for (int g = 0; g < 8; ++g) {
                const uint8_t* bg = w.kq_block(p + j, sbi) + kKqQ6Nib + g * kKqQ6Group;
                uint8_t* out = buf + ((j * supers + sbi) * 8 + g) * 512;
                const __m512i h0 = _mm512_loadu_si512(bg + 256), h1 = _mm512_loadu_si512(bg + 320);
                for (int c = 0; c < 4; ++c) {
                    const __m512i h = c < 2 ? h0 : h1;
                    const Q6Pair q = q6_chunk(_mm512_loadu_si512(bg + c * 64), c % 2 ? _mm512_srli_epi16(h, 4) : h);
                    _mm512_store_si512(out + c * 64, q.lo);
                    _mm512_store_si512(out + 256 + c * 64, q.hi);
                }
            }
}

// Rows [r0, r0 + MR) x Q6_K panels [p, p + NP) over their unpacked q (q6k_panel_unpack); NP panels share each
// broadcast activation. Sub-blocks a and b keep their own int32 sums; the group epilogue is int4_gemm.h's.
template <int MR, int NP>
inline void q6k_tile(const Int4Acts& a, int64_t r0, const PackedInt4& w, int64_t p, const uint8_t* buf, float* y,
                     int64_t ldy) {
    const int64_t supers = w.k / 256;
    __m512 acc[MR][NP];
    zero_tile(acc);
    for (int64_t sbi = 0; sbi < supers; ++sbi) {
        for (int g = 0; g < 8; ++g) {
            const int64_t gi = sbi * 8 + g;
            __m512i ia[MR][NP], ib[MR][NP];
            zero_tile(ia);
            zero_tile(ib);
#pragma GCC unroll 4
            for (int c = 0; c < 4; ++c) {
                __m512i lo[NP], hi[NP];
#pragma GCC unroll 2
                for (int j = 0; j < NP; ++j) {
                    const uint8_t* u = buf + ((j * supers + sbi) * 8 + g) * 512 + c * 64;
                    lo[j] = _mm512_load_si512(u);
                    hi[j] = _mm512_load_si512(u + 256);
                }
                dot_chunk<MR, NP>(a, r0, gi, c, lo, hi, ia, ib);
            }
#pragma GCC unroll 2
            for (int j = 0; j < NP; ++j) {
                const uint8_t* sb = w.kq_block(p + j, sbi);
                const Q6Scales q(sb, g, load_f16x16(sb + kKqQ6D));
#pragma GCC unroll 4
                for (int r = 0; r < MR; ++r) q6k_epilogue(acc[r][j], ia[r][j], ib[r][j], q, a, (r0 + r) * a.ldsum + gi);
            }
        }
    }
    store_tile<MR, NP>(acc, r0, w, p, y, ldy);
}

// All m rows of Q6_K panels [p, p + NP).
template <int NP>
inline void q6k_all_rows(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p, float* y, int64_t ldy) {
    thread_local std::vector<uint8_t, AlignedAllocator64<uint8_t>> buf;
    buf.resize(size_t(NP * (w.k / 256) * 8 * 512));
    q6k_panel_unpack(w, p, NP, buf.data());
    for_row_blocks<4>(m, [&]<int MR>(int64_t r0) { q6k_tile<MR, NP>(a, r0, w, p, buf.data(), y, ldy); });
}

}  // namespace

void w4a8_kq_panels_avx512(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y,
                           int64_t ldy) {
    for (int64_t p = p0; p < p1;) {
        const bool pair = p + 1 < p1 && w.panel_q6[size_t(p + 1)] == w.panel_q6[size_t(p)];
        if (w.panel_q6[size_t(p)] && m == 1) {
            q6k_gemv(a, w, p++, y);
        } else if (w.panel_q6[size_t(p)]) {
            if (pair)
                q6k_all_rows<2>(a, m, w, p, y, ldy);
            else
                q6k_all_rows<1>(a, m, w, p, y, ldy);
            p += pair ? 2 : 1;
        } else if (m == 1) {
            q4k_gemv(a, w, p++, y);
        } else if (pair) {  // two Q4_K panels
            q4k_all_rows<2>(a, m, w, p, y, ldy);
            p += 2;
        } else {
            q4k_all_rows<1>(a, m, w, p++, y, ldy);
        }
    }
}

}  // namespace lattice::int4_detail
