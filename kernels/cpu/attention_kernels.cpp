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


// s[r][j] = sum_d q[r][d] * k[d][j] for j < kTile, summed in order of d (int8: then times k's row scale
// j). Lanes past the tile's valid positions hold whatever the block holds there (finite or not): their
// scores are never used.
template <int R, Elem E>
[[gnu::always_inline]] inline void scores_rows(float* __restrict s, const float* __restrict q, const Tile<E>& t,
                                               int64_t hd) {
    F16x acc[R] = {};
    for (int64_t d = 0; d < hd; ++d) {
        F16x k;
        load16<E>(k, t.k + d * t.ldk);
        for (int r = 0; r < R; ++r) acc[r] += q[r * hd + d] * k;
    }
    if constexpr (E == Elem::kI8) {
        F16x sc;
        std::memcpy(&sc, t.k_scale, sizeof(sc));
        for (int r = 0; r < R; ++r) acc[r] *= sc;
    }
    for (int r = 0; r < R; ++r) std::memcpy(s + r * kTile, &acc[r], sizeof(F16x));
}

// acc[r][d] += sum_j p[r][j] * v[j][d] over j < valid, in order of j (int8: p[r][j] times v's row scale j).
template <int R, Elem E>
[[gnu::always_inline]] inline void pv_rows(float* __restrict acc, const float* __restrict p, int64_t valid,
                                           const Tile<E>& t, int64_t hd) {
    constexpr int64_t kD = 16;
    float w[R][kTile];
    for (int r = 0; r < R; ++r)
        for (int64_t j = 0; j < kTile; ++j)
            w[r][j] = E == Elem::kI8 ? p[r * kTile + j] * t.v_scale[j] : p[r * kTile + j];
    int64_t d0 = 0;
    for (; d0 + kD <= hd; d0 += kD) {
        F16x a[R];
        for (int r = 0; r < R; ++r) std::memcpy(&a[r], acc + r * hd + d0, sizeof(F16x));
        for (int64_t j = 0; j < valid; ++j) {
            F16x vr;
            load16<E>(vr, t.v + j * t.ldv + d0);
            for (int r = 0; r < R; ++r) a[r] += w[r][j] * vr;
        }
        for (int r = 0; r < R; ++r) std::memcpy(acc + r * hd + d0, &a[r], sizeof(F16x));
    }
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
        for (int64_t j = lo; j < valid; ++j) mt = std::max(mt, sr[j]);
        const float rescale = exp_neg(m[r] - mt);
        for (int64_t j = 0; j < kTile; ++j) {  // the whole tile, so that it vectorizes; zero outside [lo, valid)
            const float e = exp_neg(sr[j] - mt);
            sr[j] = j < valid && j >= lo ? e : 0.0f;
        }
        float sum = 0.0f;
        for (int64_t j = lo; j < valid; ++j) sum += sr[j];
        l[r] = l[r] * rescale + sum;
        m[r] = mt;
        float* ar = acc + r * hd;
        for (int64_t d = 0; d < hd; ++d) ar[d] *= rescale;
    }
    pv_rows<R, E>(acc, s, valid, t, hd);
}

// One tile for `rows` query rows (TileRowsFn in attention_internal.h).
template <Elem E>
[[gnu::always_inline]] inline void tile_rows_of(float* acc, float* m, float* l, float* s, const float* q,
                                                const Tile<E>& t, int64_t lo, int64_t valid, int64_t hd,
                                                int64_t rows) {
    int64_t r = 0;
    for (; r + kRows <= rows; r += kRows) rows_block<kRows, E>(acc + r * hd, m + r, l + r, s, q + r * hd, t, lo, valid, hd);
    if (r + 4 <= rows) rows_block<4, E>(acc + r * hd, m + r, l + r, s, q + r * hd, t, lo, valid, hd), r += 4;
    if (r + 2 <= rows) rows_block<2, E>(acc + r * hd, m + r, l + r, s, q + r * hd, t, lo, valid, hd), r += 2;
    if (r < rows) rows_block<1, E>(acc + r * hd, m + r, l + r, s, q + r * hd, t, lo, valid, hd);
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
