// The tile math of the CPU attention (attention.cpp's header has the scheme): a tile's scores as a small GEMM
// against the transposed K tile, the online softmax per row, the weighted V rows as a small GEMM, for the
// query rows of one token in register blocks of up to kRows rows. Written once on GCC vector extensions
// (16 floats a value) and compiled per ISA variant (isa_variants.h).
#include <algorithm>
#include <cstring>

#include "kernels/common/fast_exp.h"
#include "kernels/common/llama_math.h"
#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/isa_variants.h"

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

// Lane j combined by `op` with lane j + 8, then + 4, then + 2, in registers: lanes 0 and 1 then hold the two
// halves of the reduction, for the caller's last step. (A loop over the lanes went through memory, a
// store-to-load round trip per lane on every tile of every row.)
template <class Op>
[[gnu::always_inline]] inline F16x lanes_tree(F16x v, Op op) {
    v = op(v, __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
    v = op(v, __builtin_shufflevector(v, v, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7));
    return op(v, __builtin_shufflevector(v, v, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3));
}

// The sum of the lanes in that fixed pairwise tree.
[[gnu::always_inline]] inline float lanes_sum(F16x v) {
    v = lanes_tree(v, [](F16x a, F16x b) { return a + b; });
    return v[0] + v[1];
}

// The largest lane (max is exact: any order gives it), in the same tree.
[[gnu::always_inline]] inline float lanes_max(F16x v) {
    v = lanes_tree(v, [](F16x a, F16x b) { return a > b ? a : b; });
    return std::max(v[0], v[1]);
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

// Positions [lo, valid) of the tile are the rows' keys (lo > 0 only where a sliding window starts).
// The online softmax of a row: the tile's max over its keys (lanes_max for a whole tile; a scalar loop for a
// partial one, where a masked vector max measured slower), the weights zero outside the keys, their sum by
// lanes_sum, and the rescale of the row's sum and accumulator only when its running max moved.
template <int R, Elem E>
[[gnu::always_inline]] inline void rows_block(float* acc, float* m, float* l, float* s, const float* q,
                                              const Tile<E>& t, int64_t lo, int64_t valid, int64_t hd) {
    scores_rows<R, E>(s, q, t, hd);
    if (t.softcap > 0.0f)
        for (int j = 0; j < R * int(kTile); ++j) s[j] = math::softcap(s[j], t.softcap);
    // online softmax, one row at a time: running max, rescale, weights into s
    for (int r = 0; r < R; ++r) {
        float* sr = s + r * kTile;
        float mt = m[r];
        if (lo == 0 && valid == kTile) {  // a whole tile of keys: its max in registers
            F16x v;
            std::memcpy(&v, sr, sizeof(v));
            mt = std::max(mt, lanes_max(v));
        } else {
            for (int64_t j = lo; j < valid; ++j) mt = std::max(mt, sr[j]);
        }
        for (int64_t j = 0; j < kTile; ++j) {  // the whole tile, so that it vectorizes; zero outside [lo, valid)
            const float e = exp_neg(sr[j] - mt);
            sr[j] = j < valid && j >= lo ? e : 0.0f;
        }
        F16x e;
        std::memcpy(&e, sr, sizeof(e));
        if (mt == m[r]) {  // the running max stands: the rescale would be exp_neg(0) = 1 exactly, a no-op
            l[r] += lanes_sum(e);
            continue;
        }
        const float rescale = exp_neg(m[r] - mt);
        l[r] = l[r] * rescale + lanes_sum(e);
        m[r] = mt;
        float* ar = acc + r * hd;
        for (int64_t d = 0; d < hd; ++d) ar[d] *= rescale;
    }
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
        rows_block<kRows, E>(acc + r * hd, m + r, l + r, s, q + r * hd, r == 0 ? t : rest, lo, valid, hd);
    if (r + 4 <= rows)
        rows_block<4, E>(acc + r * hd, m + r, l + r, s, q + r * hd, r == 0 ? t : rest, lo, valid, hd), r += 4;
    if (r + 2 <= rows)
        rows_block<2, E>(acc + r * hd, m + r, l + r, s, q + r * hd, r == 0 ? t : rest, lo, valid, hd), r += 2;
    if (r < rows) rows_block<1, E>(acc + r * hd, m + r, l + r, s, q + r * hd, r == 0 ? t : rest, lo, valid, hd);
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

}  // namespace

TileKernels tile_kernels(IsaLevel isa) {
    return {tile_rows_f32_variants.at(isa), tile_rows_i8_variants.at(isa), tile_rows_bf16_variants.at(isa)};
}

}  // namespace lattice::cpu::attn
