// The tile math of the CPU attention (attention.cpp's header has the scheme): a tile's scores as a small GEMM
// against the transposed K tile, the online softmax per row, the weighted V rows as a small GEMM, for the
// query rows of one token in register blocks of up to kRows rows. Written once on GCC vector extensions
// (16 floats a value) and compiled per ISA variant (isa_variants.h).
// bf16 tiles on a CPU with AVX512_BF16 run a fourth form (tile_rows_bf16_dot, at the end: AVX-512 intrinsics and
// one vdpbf16ps in inline asm) that multiplies bf16 pairs; its softmax is softmax_rows' steps in intrinsics
// (softmax_rows_dot: the scores stay in registers) with the same bits, its rare steps softmax_rows' own code.
#include <algorithm>
#include <bit>
#include <cstring>

#include "kernels/common/fast_exp.h"
#include "kernels/common/llama_math.h"
#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/isa_variants.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace lattice::cpu::attn {

namespace {

// The three steps of a query row against one K/V tile, for the `rows` query heads of one token
// (they share the tile and the causal bound `valid`), in blocks of up to kRows rows so that every K
// and V element loaded serves several rows and the accumulators stay in registers. Each row's
// arithmetic is the same sequence of operations whatever the block (vectorized over positions and
// head dimensions, never across rows), so the result does not depend on the block sizes.

// 16 floats as one value: GCC / clang lower it to one zmm, two ymm or four xmm registers, the same
// lane-wise arithmetic on every ISA. Loaded and stored with memcpy (no alignment assumed).
using F16x = float __attribute__((vector_size(64)));
using I8x16 = int8_t __attribute__((vector_size(16)));
using U16x16 = uint16_t __attribute__((vector_size(32)));
using U32x16 = uint32_t __attribute__((vector_size(64)));
using I16x16 = int16_t __attribute__((vector_size(32)));
using I32x16 = int32_t __attribute__((vector_size(64)));
static_assert(kTile == 16, "a tile is one F16x of positions");


template <Elem E>
[[gnu::always_inline]] inline void load16(F16x& v, const ElemT<E>* p) {
    if constexpr (E == Elem::kF32) {
        std::memcpy(&v, p, sizeof(v));
    } else if constexpr (E == Elem::kI8) {
        I8x16 q;
        std::memcpy(&q, p, sizeof(q));
        // Widened one doubling at a time: GCC 12 lowers each to one sign extension (vpmovsxbw, vpmovsxwd) but
        // scalarizes int8 -> int32 or int8 -> float done at once.
        v = __builtin_convertvector(__builtin_convertvector(__builtin_convertvector(q, I16x16), I32x16), F16x);
    } else {
        U16x16 h;
        std::memcpy(&h, p, sizeof(h));
        const U32x16 bits = __builtin_convertvector(h, U32x16) << 16;
        std::memcpy(&v, &bits, sizeof(v));
    }
}

// a[0] + ... + a[N - 1] as the pairwise tree ((a0 + a1) + (a2 + a3)) + ..., unrolled so the values stay in
// registers.
template <int N>
[[gnu::always_inline]] inline F16x tree_sum(const F16x* a) {
    if constexpr (N == 1)
        return a[0];
    else
        return tree_sum<N / 2>(a) + tree_sum<N / 2>(a + N / 2);
}

// s[r][j] = sum_d q[r][d] * k[d][j] for j < kTile (int8: then times k's row scale j), as NA partial sums
// per row (d = a mod NA) added in a fixed tree: R * NA = 8 independent FMA chains, where one chain per row
// (R <= 2 in decode: a GQA group of 3 cuts into 2 + 1) waited on the FMA's latency at every d. A row's sum
// order depends only on R, which is fixed per row (head_cuts in attention.cpp cuts at the blocks' bounds).
// Lanes past the tile's valid positions hold whatever the block holds there (finite or not): their scores
// are never used.
template <int R, Elem E>
[[gnu::always_inline]] inline void scores_rows(float* __restrict s, const float* __restrict q, const Tile<E>& t,
                                               int64_t hd) {
    constexpr int NA = R >= 8 ? 1 : 8 / R;
    F16x acc[R][NA];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int a = 0; a < NA; ++a) acc[r][a] = F16x{};
    int64_t d = 0;
    for (; d + NA <= hd; d += NA)
#pragma GCC unroll 8
        for (int a = 0; a < NA; ++a) {
            if (t.next_k) __builtin_prefetch(t.next_k + (d + a) * t.ldk, 0, 2);
            F16x k;
            load16<E>(k, t.k + (d + a) * t.ldk);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) acc[r][a] += q[r * hd + d + a] * k;
        }
    for (; d < hd; ++d) {  // a head_dim that is not a multiple of NA
        F16x k;
        load16<E>(k, t.k + d * t.ldk);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[r][0] += q[r * hd + d] * k;
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
        F16x v = tree_sum<NA>(acc[r]);
        if constexpr (E == Elem::kI8) {
            F16x sc;
            std::memcpy(&sc, t.k_scale, sizeof(sc));
            v *= sc;
        }
        std::memcpy(s + r * kTile, &v, sizeof(F16x));
    }
}

// acc[r][d0 .. d0 + NB * 16) += sum_j w[r][j] * v[j][d] over j < valid, in order of j: NB column blocks per
// pass, so that R * NB chains run side by side (the sum of each element is the same either way).
template <int R, int NB, Elem E>
[[gnu::always_inline]] inline void pv_pass(float* __restrict acc, const float (&w)[R][kTile], int64_t valid,
                                           const Tile<E>& t, int64_t hd, int64_t d0) {
    constexpr int64_t kD = 16;
    F16x a[R][NB];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int b = 0; b < NB; ++b) std::memcpy(&a[r][b], acc + r * hd + d0 + b * kD, sizeof(F16x));
    for (int64_t j = 0; j < valid; ++j) {
        if (t.next_v && d0 == 0 && j < t.next_v_rows)  // the next tile's V requested once, in the first pass
            for (int64_t x = 0; x < hd * int64_t(sizeof(ElemT<E>)); x += 64)
                __builtin_prefetch(reinterpret_cast<const char*>(t.next_v + j * t.ldv) + x, 0, 2);
#pragma GCC unroll 8
        for (int b = 0; b < NB; ++b) {
            F16x vr;
            load16<E>(vr, t.v + j * t.ldv + d0 + b * kD);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) a[r][b] += w[r][j] * vr;
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int b = 0; b < NB; ++b) std::memcpy(acc + r * hd + d0 + b * kD, &a[r][b], sizeof(F16x));
}

// acc[r][d] += sum_j p[r][j] * v[j][d] over j < valid, in order of j (int8: p[r][j] times v's row scale j).
template <int R, Elem E>
[[gnu::always_inline]] inline void pv_rows(float* __restrict acc, const float* __restrict p, int64_t valid,
                                           const Tile<E>& t, int64_t hd) {
    constexpr int64_t kD = 16;
    constexpr int NB = R >= 8 ? 1 : R >= 4 ? 2 : 4;
    float w[R][kTile];
    for (int r = 0; r < R; ++r)
        for (int64_t j = 0; j < kTile; ++j)
            w[r][j] = E == Elem::kI8 ? p[r * kTile + j] * t.v_scale[j] : p[r * kTile + j];
    int64_t d0 = 0;
    for (; d0 + NB * kD <= hd; d0 += NB * kD) pv_pass<R, NB, E>(acc, w, valid, t, hd, d0);
    for (; d0 + kD <= hd; d0 += kD) pv_pass<R, 1, E>(acc, w, valid, t, hd, d0);
    if (d0 < hd)  // a head_dim that is not a multiple of 16: the rest one column at a time
        for (int r = 0; r < R; ++r)
            for (int64_t j = 0; j < valid; ++j) {
                const ElemT<E>* vr = t.v + j * t.ldv;
                for (int64_t d = d0; d < hd; ++d) {
                    float x;
                    if constexpr (E == Elem::kBF16)
                        x = bf16_to_f32(vr[d]);
                    else
                        x = float(vr[d]);
                    acc[r * hd + d] += w[r][j] * x;
                }
            }
}

// The R rows' (R <= 8) 16 lanes each reduced by op at once: lane r of the result holds row r's reduction in
// a fixed pairwise tree (lane j with j + 8, then + 4, then + 2, then the last two; op(lower, upper)), so a
// row's bits do not depend on R or on the other rows. Each level packs two rows' partials into one register (two
// permutes and one op for two rows, where reducing rows one at a time spends a register per row per level).
// A missing partner (R not a power of two, or R < 8) is the row itself; its lanes are never read.
template <bool kMax>
[[gnu::always_inline]] inline F16x rows_op(F16x a, F16x b) {
    if constexpr (kMax)
        return a > b ? a : b;
    else
        return a + b;
}
// (The op is a template flag, not a lambda: a lambda does not inherit the ISA variant's target and is then a
// call with vectors passed through memory.)
template <int R, bool kMax>
[[gnu::always_inline]] inline F16x rows_tree(const F16x* v) {
    static_assert(R >= 1 && R <= 8);
    const auto op = rows_op<kMax>;
    constexpr int R1 = (R + 1) / 2, R2 = (R1 + 1) / 2;
    F16x a[R1], b[R2];
#pragma GCC unroll 8
    for (int i = 0; i < R1; ++i) {  // [row 2i: j + (j + 8) for j < 8, row 2i + 1: the same]
        const F16x x = v[2 * i], y = 2 * i + 1 < R ? v[2 * i + 1] : x;
        a[i] = op(__builtin_shufflevector(x, y, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23),
                  __builtin_shufflevector(x, y, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31));
    }
#pragma GCC unroll 4
    for (int i = 0; i < R2; ++i) {  // four rows, j + (j + 4) for j < 4 each
        const F16x x = a[2 * i], y = 2 * i + 1 < R1 ? a[2 * i + 1] : x;
        b[i] = op(__builtin_shufflevector(x, y, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27),
                  __builtin_shufflevector(x, y, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31));
    }
    const F16x x = b[0], y = R2 > 1 ? b[1] : x;  // eight rows, j + (j + 2) for j < 2 each
    const F16x c = op(__builtin_shufflevector(x, y, 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29),
                      __builtin_shufflevector(x, y, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31));
    return op(__builtin_shufflevector(c, c, 0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14),
              __builtin_shufflevector(c, c, 1, 3, 5, 7, 9, 11, 13, 15, 1, 3, 5, 7, 9, 11, 13, 15));
}

// The lazy running max: a row's running max m moves only where one of its scores exceeds it by more than
// this (a natural log), so the weights e^(score - m) lie in (0, e^8 ~ 2981]. Any m gives the same softmax
// (acc and l share it and the division cancels it); one within kLazyMax of the scores keeps every weight a
// normal float at full relative precision, and the sums of a segment (kSegment keys) below 1e6. It spares
// the per-row max and the rescale of l and acc on all but the few tiles where a row's scores jump (the first
// of every segment, where m starts at -3.4e38).
constexpr float kLazyMax = 8.0f;

// softmax_rows' rare step: each row's max over its keys (rows_tree, exact); a row whose max exceeds its m by
// more than kLazyMax takes it as its m, its sum lanes and accumulator times e^(m_old - m_new) (exp_neg_lanes,
// one for the block), and its x recomputed from the new m.
template <int R>
[[gnu::always_inline]] inline void raise_max(float* acc, float* m, float* l, const F16x* sv, F16x* x, I32x16 keep,
                                             int64_t hd) {
    const F16x none = F16x{} - __builtin_inff();
    F16x kept[R];
    for (int r = 0; r < R; ++r) kept[r] = keep ? sv[r] : none;
    const F16x tile_max = rows_tree<R, true>(kept);
    F16x m_old{};
    std::memcpy(&m_old, m, R * sizeof(float));
    const F16x m_new = tile_max - m_old > kLazyMax ? tile_max : m_old;
    const F16x rescale = exp_neg_lanes<F16x, I32x16>(m_old - m_new);
    for (int r = 0; r < R; ++r) {
        if (m_new[r] == m_old[r]) continue;
        m[r] = m_new[r];
        x[r] = sv[r] - m[r];
        F16x lr;
        std::memcpy(&lr, l + r * kTile, sizeof(F16x));
        lr *= rescale[r];
        std::memcpy(l + r * kTile, &lr, sizeof(F16x));
        float* ar = acc + r * hd;
        for (int64_t d = 0; d < hd; ++d) ar[d] *= rescale[r];
    }
}

// Lanes [lo, valid) as all ones: lanes below valid and not below lo, each a load from a table of 16 ones then
// 16 zeros (comparing a lane index vector to lo, GCC 12 built the mask one lane at a time).
[[gnu::always_inline]] inline I32x16 keep_lanes(int64_t lo, int64_t valid) {
    static constexpr int32_t kPrefix[2 * kTile] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
    I32x16 below_valid, below_lo;
    std::memcpy(&below_valid, kPrefix + kTile - valid, sizeof(I32x16));
    std::memcpy(&below_lo, kPrefix + kTile - lo, sizeof(I32x16));
    return below_valid & ~below_lo;
}

// A soft-cap c > 0 on the R rows' scores s (R x kTile, in place): softmax_rows' first step, and the bf16-dot math's.
template <int R>
[[gnu::always_inline]] inline void softcap_rows(float* s, float softcap) {
    for (int j = 0; j < R * int(kTile); ++j) s[j] = math::softcap(s[j], softcap);
}

// Positions [lo, valid) of the tile are the rows' keys (lo > 0 only where a sliding window starts).
// The online softmax of the rows' scores s (in place: s becomes the weights), R rows at once: x = score - m
// per row, the largest x of the block (one horizontal max for the R rows) against kLazyMax; above it (rare)
// raise_max moves the rows whose scores exceed their m by more than kLazyMax to their tile's max and rescales
// their sums and accumulators; then the weights e^x (zero outside the keys) and the row's sum l, kept as 16
// lanes (row r's at l + r * kTile, summed once at the segment's end): no horizontal sum per tile. Each row's
// arithmetic depends only on its own scores (whether another row of the block raised the max or not).
// The bf16-dot math has its own form of it (softmax_rows_dot).
template <int R>
[[gnu::always_inline]] inline void softmax_rows(float* acc, float* m, float* l, float* s, float softcap, int64_t lo,
                                                int64_t valid, int64_t hd) {
    if (softcap > 0.0f) softcap_rows<R>(s, softcap);
    const I32x16 keep = keep_lanes(lo, valid);
    const F16x none = F16x{} - __builtin_inff();
    F16x sv[R], x[R];
    F16x top = none;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
        std::memcpy(&sv[r], s + r * kTile, sizeof(F16x));
        x[r] = sv[r] - m[r];
        const F16x kept = keep ? x[r] : none;
        top = top > kept ? top : kept;
    }
    if (rows_tree<1, true>(&top)[0] > kLazyMax) [[unlikely]]
        raise_max<R>(acc, m, l, sv, x, keep, hd);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
        F16x e = exp_neg_lanes<F16x, I32x16>(x[r]);
        e = keep ? e : F16x{};
        std::memcpy(s + r * kTile, &e, sizeof(F16x));
        F16x lr;
        std::memcpy(&lr, l + r * kTile, sizeof(F16x));
        lr += e;
        std::memcpy(l + r * kTile, &lr, sizeof(F16x));
    }
}

// Scores, online softmax, weighted V rows.
template <int R, Elem E>
[[gnu::always_inline]] inline void rows_block(float* acc, float* m, float* l, float* s, const float* q,
                                              const Tile<E>& t, int64_t lo, int64_t valid, int64_t hd) {
    scores_rows<R, E>(s, q, t, hd);
    softmax_rows<R>(acc, m, l, s, t.softcap, lo, valid, hd);
    pv_rows<R, E>(acc, s, valid, t, hd);
}

// One tile for `rows` query rows (TileRowsFn in attention_internal.h). The next tile (t.next_k / next_v, when
// given) is requested by the first block of rows, in its loops. One instantiation serves decode (requests) and
// prefill (none): the requests are a branch, never a second compiled copy of the math, whose floating-point
// contractions could differ and break the bit-identity of decode and prefill rows.
template <Elem E>
[[gnu::always_inline]] inline void tile_rows_of(float* acc, float* m, float* l, float* s, const float* q,
                                                const Tile<E>& t, int64_t lo, int64_t valid, int64_t hd,
                                                int64_t rows) {
    Tile<E> rest = t;
    rest.next_k = rest.next_v = nullptr;
    int64_t r = 0;
    for (; r + kRows <= rows; r += kRows)
        rows_block<kRows, E>(acc + r * hd, m + r, l + r * kTile, s, q + r * hd, r == 0 ? t : rest, lo, valid, hd);
    if (r + 4 <= rows)
        rows_block<4, E>(acc + r * hd, m + r, l + r * kTile, s, q + r * hd, r == 0 ? t : rest, lo, valid, hd), r += 4;
    if (r + 2 <= rows)
        rows_block<2, E>(acc + r * hd, m + r, l + r * kTile, s, q + r * hd, r == 0 ? t : rest, lo, valid, hd), r += 2;
    if (r < rows) rows_block<1, E>(acc + r * hd, m + r, l + r * kTile, s, q + r * hd, r == 0 ? t : rest, lo, valid, hd);
}
// The three element kinds' entry points, then their ISA variants.
#define LATTICE_TILE_ROWS(name, E)                                                                                \
    [[gnu::always_inline]] inline void name(float* acc, float* m, float* l, float* s, const float* q,              \
                                            const Tile<E>& t, int64_t lo, int64_t valid, int64_t hd,              \
                                            int64_t rows) {                                                       \
        tile_rows_of(acc, m, l, s, q, t, lo, valid, hd, rows);                                                    \
    }                                                                                                             \
    LATTICE_ISA_VARIANTS(void, name,                                                                              \
                         (float* acc, float* m, float* l, float* s, const float* q, const Tile<E>& t, int64_t lo, \
                          int64_t valid, int64_t hd, int64_t rows),                                               \
                         (acc, m, l, s, q, t, lo, valid, hd, rows))
LATTICE_TILE_ROWS(tile_rows_f32, Elem::kF32)
LATTICE_TILE_ROWS(tile_rows_i8, Elem::kI8)
LATTICE_TILE_ROWS(tile_rows_bf16, Elem::kBF16)
#undef LATTICE_TILE_ROWS

#if defined(__x86_64__)
// The bf16-dot math (TileKernels::bf16_dot): vdpbf16ps multiplies 16 pairs of bf16 and adds each pair's two
// products into an f32 lane. Scores pair two K rows (d, d + 1: 16 positions each, interleaved into one
// register by vpermt2w) with a query's (q[d], q[d + 1]) broadcast; weighted V pairs two V rows (j, j + 1) with
// the weights (p[j], p[j + 1]) broadcast. Per 16 lanes and two elements of the sum: two 32-byte loads, one
// permute and one dpbf16 per row, where the f32 math widens each element (two shifts) and runs two FMAs per
// row. The chains, their sum tree and the prefetches of the next tile are those of the f32 math.

// The two 16-element bf16 rows a and b interleaved: lane 2i = a[i], lane 2i + 1 = b[i].
[[gnu::always_inline]] LATTICE_TARGET_AVX512BF16 inline __m512i interleave16(const uint16_t* a, const uint16_t* b) {
    const __m512i idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37,
                                         5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    // Plain 32-byte loads (the permute reads only their words); GCC 12 warns that the cast's upper half is
    // undefined, which is what it is for.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
    const __m512i va = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
    const __m512i vb = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
#pragma GCC diagnostic pop
    return _mm512_permutex2var_epi16(va, idx, vb);
}

// tree_sum's pairwise tree on __m512 values (tree_sum itself returns a vector type from a function without
// the AVX-512 target, which clang refuses where it is not inlined).
template <int N>
[[gnu::always_inline]] LATTICE_TARGET_AVX512BF16 inline __m512 tree_sum_ps(const __m512* a) {
    if constexpr (N == 1)
        return a[0];
    else
        return _mm512_add_ps(tree_sum_ps<N / 2>(a), tree_sum_ps<N / 2>(a + N / 2));
}

// s[r] lane j = sum_d qb[r][d] * k[d][j] for j < kTile, d in pairs (hd even), NA partial sums per row (pair
// index mod NA) added in scores_rows' tree. HD: the head dim when the caller knows it at compile time (0: hd,
// read at run time); the same operations in the same order either way.
template <int R, int HD>
[[gnu::always_inline]] LATTICE_TARGET_AVX512BF16 inline void scores_rows_dot(__m512 (&s)[R],
                                                                             const uint16_t* __restrict qb,
                                                                             const Tile<Elem::kBF16>& t,
                                                                             int64_t hd_run) {
    const int64_t hd = HD ? HD : hd_run;
    constexpr int NA = R >= 8 ? 1 : 8 / R;
    __m512 acc[R][NA];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int a = 0; a < NA; ++a) acc[r][a] = _mm512_setzero_ps();
    int64_t d = 0;
    for (; d + 2 * NA <= hd; d += 2 * NA)
#pragma GCC unroll 8
        for (int a = 0; a < NA; ++a) {
            const int64_t dd = d + 2 * a;
            if (t.next_k) {
                __builtin_prefetch(t.next_k + dd * t.ldk, 0, 2);
                __builtin_prefetch(t.next_k + (dd + 1) * t.ldk, 0, 2);
            }
            const __m512i k = interleave16(t.k + dd * t.ldk, t.k + (dd + 1) * t.ldk);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) acc[r][a] = dot_pairs(acc[r][a], k, qb + r * hd + dd);
        }
    for (; d < hd; d += 2) {  // pairs past the last whole NA of them
        if (t.next_k) {
            __builtin_prefetch(t.next_k + d * t.ldk, 0, 2);
            __builtin_prefetch(t.next_k + (d + 1) * t.ldk, 0, 2);
        }
        const __m512i k = interleave16(t.k + d * t.ldk, t.k + (d + 1) * t.ldk);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[r][0] = dot_pairs(acc[r][0], k, qb + r * hd + d);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) s[r] = tree_sum_ps<NA>(acc[r]);
}

// acc[r][d0 .. d0 + NB * 16) += sum_j p[r][j] * v[j][d] over j < valid in pairs (j, j + 1), the weights as
// bf16 pairs w[r][j / 2]; the row past the last valid one is read as zeros (a block's later rows may hold
// anything).
template <int R, int NB, int HD, bool kFull>
[[gnu::always_inline]] LATTICE_TARGET_AVX512BF16 inline void pv_pass_dot(float* __restrict acc,
                                                                         const uint32_t (&w)[R][kTile / 2],
                                                                         int64_t valid_run, const Tile<Elem::kBF16>& t,
                                                                         int64_t hd_run, int64_t d0) {
    const int64_t hd = HD ? HD : hd_run;
    const int64_t valid = kFull ? kTile : valid_run;
    constexpr int64_t kD = 16;
    alignas(64) static const uint16_t zeros[kD] = {};
    __m512 a[R][NB];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int b = 0; b < NB; ++b) a[r][b] = _mm512_loadu_ps(acc + r * hd + d0 + b * kD);
#pragma GCC unroll 8
    for (int64_t j = 0; j < valid; j += 2) {
        if (t.next_v && d0 == 0)  // the next tile's V requested once, in the first pass
            for (int64_t jj = j; jj < j + 2 && jj < t.next_v_rows; ++jj)
                for (int64_t x = 0; x < hd * 2; x += 64)
                    __builtin_prefetch(reinterpret_cast<const char*>(t.next_v + jj * t.ldv) + x, 0, 2);
        const uint16_t* v0 = t.v + j * t.ldv + d0;
        const bool second = kFull || j + 1 < valid;
#pragma GCC unroll 8
        for (int b = 0; b < NB; ++b) {
            const __m512i vv = interleave16(v0 + b * kD, second ? v0 + t.ldv + b * kD : zeros);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) a[r][b] = dot_pairs(a[r][b], vv, &w[r][j / 2]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int b = 0; b < NB; ++b) _mm512_storeu_ps(acc + r * hd + d0 + b * kD, a[r][b]);
}

// The column passes of pv_rows_dot: NB blocks of 16 a pass, then single blocks; kFull as pv_pass_dot's.
template <int R, int NB, int HD, bool kFull>
[[gnu::always_inline]] LATTICE_TARGET_AVX512BF16 inline void pv_passes_dot(float* __restrict acc,
                                                                           const uint32_t (&w)[R][kTile / 2],
                                                                           int64_t valid, const Tile<Elem::kBF16>& t,
                                                                           int64_t hd) {
    constexpr int64_t kD = 16;
    int64_t d0 = 0;
    for (; d0 + NB * kD <= hd; d0 += NB * kD) pv_pass_dot<R, NB, HD, kFull>(acc, w, valid, t, hd, d0);
    for (; d0 < hd; d0 += kD) pv_pass_dot<R, 1, HD, kFull>(acc, w, valid, t, hd, d0);
}

// acc[r][d] += sum_j p[r][j] * v[j][d] over j < valid (hd a multiple of 16), the weights as bf16 pairs
// w[r][j / 2], NB column blocks a pass as pv_rows.
template <int R, int HD>
[[gnu::always_inline]] LATTICE_TARGET_AVX512BF16 inline void pv_rows_dot(float* __restrict acc,
                                                                         const uint32_t (&w)[R][kTile / 2],
                                                                         int64_t valid, const Tile<Elem::kBF16>& t,
                                                                         int64_t hd_run) {
    const int64_t hd = HD ? HD : hd_run;
    constexpr int NB = R >= 8 ? 1 : R >= 4 ? 2 : 4;
    if (valid == kTile)  // all but a run's last tile: the pairs' loop of a known length
        pv_passes_dot<R, NB, HD, true>(acc, w, valid, t, hd);
    else
        pv_passes_dot<R, NB, HD, false>(acc, w, valid, t, hd);
}

// GCC 12's AVX-512 headers build some intrinsics on a self-initialized "undefined" register, which it reports as
// maybe-uninitialized once inlined under a target attribute (to the end of softmax_rows_dot).
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wuninitialized"

// exp_neg_lanes (fast_exp.h) in AVX-512 intrinsics: the same operations in the same order, each a * b + c
// contracted to one FMA as GCC and clang compile that form, so the same bits. GCC 12 left exp_neg_lanes'
// vector-extension form scalar when it was inlined beside the asm of the math above; intrinsics let the softmax stay
// inline, its scores in registers.
[[gnu::always_inline]] LATTICE_TARGET_AVX512BF16 inline __m512 exp_neg_ps(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));  // x > -87 ? x : -87 (vmaxps returns its second operand for a NaN)
    const __m512 n =
        _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(12582912.0f)),
                      _mm512_set1_ps(12582912.0f));
    const __m512 r =
        _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x));
    __m512 p = _mm512_fmadd_ps(r, _mm512_set1_ps(1.0f / 720), _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(r, p, _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

// softmax_rows' rare steps for the bf16-dot math, on its scores in memory (s, R x kTile): a softcap, and
// raise_max. Out of line: they run on few tiles (a softcap model's, or where a row's max moves).
template <int R>
[[gnu::noinline]] LATTICE_TARGET_AVX512BF16 void softcap_dot(float* s, float softcap) {
    softcap_rows<R>(s, softcap);
}
// (raise_max on scores in memory, without the target attribute: clang refuses a call that passes 64-byte
// vectors from a function with AVX-512 to one without; this one takes pointers, and its own calls stay
// between functions without it.)
template <int R>
[[gnu::always_inline]] inline void raise_max_of(float* acc, float* m, float* l, const float* s, int64_t lo,
                                                int64_t valid, int64_t hd) {
    F16x sv[R], x[R];  // x: raise_max's output for softmax_rows, unused here (softmax_rows_dot recomputes it)
    for (int r = 0; r < R; ++r) std::memcpy(&sv[r], s + r * kTile, sizeof(F16x));
    raise_max<R>(acc, m, l, sv, x, keep_lanes(lo, valid), hd);
}
template <int R>
[[gnu::noinline]] LATTICE_TARGET_AVX512BF16 void raise_max_dot(float* acc, float* m, float* l, const float* s,
                                                               int64_t lo, int64_t valid, int64_t hd) {
    raise_max_of<R>(acc, m, l, s, lo, valid, hd);
}

// softmax_rows for the bf16-dot math, on scores in registers (sv, R rows of kTile lanes), the weights out as
// bf16 pairs w[r][j / 2] for pv_rows_dot; the rare steps out of line. The same steps as softmax_rows, and one
// more: each weight rounded to bf16 (to nearest, ties away from zero: two integer ops) before it is summed,
// so that l is the sum of the very weights the V rows are multiplied by and the output a convex combination
// of V rows whatever the rounding: a dominant key's rounded weight cancels out. Without it the lazy max's
// weights above 1 doubled the worst error against a double softmax in test_attention_bf16 (0.0028 -> 0.0056).
template <int R>
[[gnu::always_inline]] LATTICE_TARGET_AVX512BF16 inline void softmax_rows_dot(__m512 (&sv)[R],
                                                                              uint32_t (&w)[R][kTile / 2], float* acc,
                                                                              float* m, float* l, float* s,
                                                                              float softcap, int64_t lo, int64_t valid,
                                                                              int64_t hd) {
    if (softcap > 0.0f) [[unlikely]] {
        for (int r = 0; r < R; ++r) _mm512_storeu_ps(s + r * kTile, sv[r]);
        softcap_dot<R>(s, softcap);
        for (int r = 0; r < R; ++r) sv[r] = _mm512_loadu_ps(s + r * kTile);
    }
    const __mmask16 keep = __mmask16(((1u << valid) - 1) & ~((1u << lo) - 1));
    __m512 top = _mm512_set1_ps(-__builtin_inff());
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) top = _mm512_mask_max_ps(top, keep, top, _mm512_sub_ps(sv[r], _mm512_set1_ps(m[r])));
    if (_mm512_cmp_ps_mask(top, _mm512_set1_ps(kLazyMax), _CMP_GT_OQ)) [[unlikely]] {
        for (int r = 0; r < R; ++r) _mm512_storeu_ps(s + r * kTile, sv[r]);
        raise_max_dot<R>(acc, m, l, s, lo, valid, hd);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
        __m512i e = _mm512_castps_si512(exp_neg_ps(_mm512_sub_ps(sv[r], _mm512_set1_ps(m[r]))));
        // to bf16, to nearest (ties away), as softmax_rows: finite and positive here
        e = _mm512_maskz_and_epi32(keep, _mm512_add_epi32(e, _mm512_set1_epi32(0x8000)),
                                   _mm512_set1_epi32(int32_t(0xFFFF0000u)));
        _mm512_storeu_ps(l + r * kTile, _mm512_add_ps(_mm512_loadu_ps(l + r * kTile), _mm512_castsi512_ps(e)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(w[r]), _mm512_cvtepi32_epi16(_mm512_srli_epi32(e, 16)));
    }
}

#pragma GCC diagnostic pop

template <int R, int HD>
[[gnu::always_inline]] LATTICE_TARGET_AVX512BF16 inline void rows_block_dot(float* acc, float* m, float* l, float* s,
                                                                            const uint16_t* qb,
                                                                            const Tile<Elem::kBF16>& t, int64_t lo,
                                                                            int64_t valid, int64_t hd) {
    __m512 sv[R];
    scores_rows_dot<R, HD>(sv, qb, t, hd);
    uint32_t w[R][kTile / 2];
    softmax_rows_dot<R>(sv, w, acc, m, l, s, t.softcap, lo, valid, hd);
    pv_rows_dot<R, HD>(acc, w, valid, t, hd);
}

// The rows' blocks of one tile (tile_rows_of's blocks), HD as rows_block_dot's.
template <int HD>
LATTICE_TARGET_AVX512BF16 void tile_blocks_dot(float* acc, float* m, float* l, float* s, const Tile<Elem::kBF16>& t,
                                               int64_t lo, int64_t valid, int64_t hd, int64_t rows) {
    Tile<Elem::kBF16> rest = t;
    rest.next_k = rest.next_v = nullptr;
    int64_t r = 0;
    for (; r + kRows <= rows; r += kRows)
        rows_block_dot<kRows, HD>(acc + r * hd, m + r, l + r * kTile, s, t.qb + r * hd, r == 0 ? t : rest, lo, valid,
                                  hd);
    if (r + 4 <= rows)
        rows_block_dot<4, HD>(acc + r * hd, m + r, l + r * kTile, s, t.qb + r * hd, r == 0 ? t : rest, lo, valid, hd),
            r += 4;
    if (r + 2 <= rows)
        rows_block_dot<2, HD>(acc + r * hd, m + r, l + r * kTile, s, t.qb + r * hd, r == 0 ? t : rest, lo, valid, hd),
            r += 2;
    if (r < rows)
        rows_block_dot<1, HD>(acc + r * hd, m + r, l + r * kTile, s, t.qb + r * hd, r == 0 ? t : rest, lo, valid, hd);
}

// TileRowsFn of the bf16-dot math. The common head dims (64: TinyLlama, Phi; 128: Llama, Qwen, Mistral) are
// compiled for their size: the rows' q and accumulator addresses become constant offsets from one pointer
// (at a run-time hd GCC kept a chain of adds per row and spilled the row pointers); the same arithmetic.
LATTICE_TARGET_AVX512BF16 void tile_rows_bf16_dot(float* acc, float* m, float* l, float* s, const float* q,
                                                  const Tile<Elem::kBF16>& t, int64_t lo, int64_t valid, int64_t hd,
                                                  int64_t rows) {
    if (!t.qb || hd % 16 != 0)
        tile_rows_bf16_avx512(acc, m, l, s, q, t, lo, valid, hd, rows);
    else if (hd == 64)
        tile_blocks_dot<64>(acc, m, l, s, t, lo, valid, hd, rows);
    else if (hd == 128)
        tile_blocks_dot<128>(acc, m, l, s, t, lo, valid, hd, rows);
    else
        tile_blocks_dot<0>(acc, m, l, s, t, lo, valid, hd, rows);
}
#endif

}  // namespace

TileKernels tile_kernels(IsaLevel isa) {
    TileKernels k{tile_rows_f32_variants.at(isa), tile_rows_i8_variants.at(isa), tile_rows_bf16_variants.at(isa)};
#if defined(__x86_64__)
    if (vector_level(isa) == IsaLevel::kAvx512Vnni && cpu_features().avx512bf16) {
        k.bf16 = &tile_rows_bf16_dot;
        k.bf16_dot = true;
    }
#endif
    return k;
}

}  // namespace lattice::cpu::attn
