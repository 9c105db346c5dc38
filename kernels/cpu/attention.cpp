// CPU attention over the paged KV cache (see ops.h for the layouts), flash-style:
//  - a work unit is (run, kv head): a run is up to kRun consecutive batch tokens of one sequence
//    (increasing positions), so all `group` query heads of a kv head and all tokens of the run
//    share each K/V tile; decode (one token) still shares a tile among its query heads;
//  - keys are walked in tiles of kTile (16) positions aligned to position 0. The K cache is stored
//    transposed per block and kv head ([head_dim][block_size]), so a tile of a cache whose block size
//    is a multiple of 16 is read where it lies (f32, bf16 by a shift, int8 widened in registers, its row
//    scales applied to the scores and to the softmax weights): the scores of a query row against the
//    whole tile vectorize over positions with no horizontal sums and no copy; V rows are read in place
//    too. f16 tiles are converted into a per-thread f32 tile (each K row of a tile contiguous, F16C);
//    block sizes that are not a multiple of 16 are gathered position by position;
//  - the query heads of one token share a tile's bound, so they go through it together, in
//    register blocks of up to 8 rows (tile_rows): scores as a small GEMM against the transposed
//    tile, online softmax per row (running max, running sum, rescaled accumulator; the weights by
//    a vectorizable exp, exp_neg in kernels/common/fast_exp.h), then the weighted V rows as a small GEMM;
//  - when a step has fewer (run, kv head) units than twice the threads (decode of one sequence), an
//    in-place unit is split by query heads, at the register blocks' bounds, so more threads have
//    work: no row's arithmetic changes.
// A sliding window (AttentionArgs::window = W > 0) limits the keys of the query at position i to
// i - W < j <= i, as transformers' Mistral does: tiles wholly before a row's window are skipped for that
// row, and in the tile holding the window's start the positions before it get zero weight.
// The cache holds f32, f16, bf16 or int8 elements (kv_row_bytes per token and kv head). A block holds
// K as [n_kv][head_dim][block_size] (element d of position p of kv head g at (g * head_dim + d) *
// block_size + p % block_size) and V as [block_size][n_kv][head_dim] rows; an int8 block's values come
// first, then their [block_size, n_kv] f32 scales (symmetric, one scale per token and kv head,
// kernels/common/quantize.h), quantized as the token is stored. Every dtype is read as f32 (in place
// or into the tile), so attention never needs a dequantized copy of the cache and the tile math is
// the same for all of them.
// Every query row's arithmetic depends only on its own q and on positions 0..pos of its sequence,
// in a fixed order (tiles from position 0, d then j), never on which other tokens share its batch
// or run: chunked prefill, batched decode and single-token decode give bit-identical rows.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif
#include <vector>

#include "base/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/common/fast_exp.h"
#include "kernels/common/quantize.h"
#include "kernels/common/multiversion.h"


namespace lattice::cpu {

namespace {

constexpr int64_t kTile = 16;  // key positions per tile; a tile never straddles a block when block_size % 16 == 0
constexpr int64_t kRun = 16;   // query tokens per work unit

// The three steps of a query row against one K/V tile, for the `rows` query heads of one token
// (they share the tile and the causal bound `valid`), in blocks of up to kRows rows so that every K
// and V element loaded serves several rows and the accumulators stay in registers. Each row's
// arithmetic is the same sequence of operations whatever the block (vectorized over positions and
// head dimensions, never across rows), so the result does not depend on the block sizes.
constexpr int kRows = 8;

// 16 floats as one value: GCC / clang lower it to one zmm, two ymm or four xmm registers, the same
// lane-wise arithmetic on every ISA. Loaded and stored with memcpy (no alignment assumed).
using F16x = float __attribute__((vector_size(64)));
using I8x16 = int8_t __attribute__((vector_size(16)));
using U16x16 = uint16_t __attribute__((vector_size(32)));
using U32x16 = uint32_t __attribute__((vector_size(64)));
using I16x16 = int16_t __attribute__((vector_size(32)));
using I32x16 = int32_t __attribute__((vector_size(64)));
static_assert(kTile == 16, "a tile is one F16x of positions");

// How a tile's elements are read: f32 as they are; int8 (converted exactly, the row scales applied to the
// scores and the weights, below); bf16 (exactly, by a shift).
enum class Elem { kF32, kI8, kBF16 };
template <Elem E>
using ElemT = std::conditional_t<E == Elem::kF32, float, std::conditional_t<E == Elem::kI8, int8_t, uint16_t>>;

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

// A K/V tile as the rows read it: K row d of the tile at k + d * ldk (kTile elements), V row j at
// v + j * ldv; int8: the tile's K and V row scales (kTile each), else null.
template <Elem E>
struct Tile {
    const ElemT<E>* k;
    int64_t ldk;
    const ElemT<E>* v;
    int64_t ldv;
    const float* k_scale = nullptr;
    const float* v_scale = nullptr;
};

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

// One tile for `rows` query rows (consecutive in q, acc, m, l) that share `valid`; s holds
// kRows x kTile floats of scratch.
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
LATTICE_MULTIVERSION void tile_rows(float* acc, float* m, float* l, float* s, const float* q, const Tile<Elem::kF32>& t,
                                    int64_t lo, int64_t valid, int64_t hd, int64_t rows) {
    tile_rows_of(acc, m, l, s, q, t, lo, valid, hd, rows);
}
LATTICE_MULTIVERSION void tile_rows(float* acc, float* m, float* l, float* s, const float* q, const Tile<Elem::kI8>& t,
                                    int64_t lo, int64_t valid, int64_t hd, int64_t rows) {
    tile_rows_of(acc, m, l, s, q, t, lo, valid, hd, rows);
}
LATTICE_MULTIVERSION void tile_rows(float* acc, float* m, float* l, float* s, const float* q,
                                    const Tile<Elem::kBF16>& t, int64_t lo, int64_t valid, int64_t hd, int64_t rows) {
    tile_rows_of(acc, m, l, s, q, t, lo, valid, hd, rows);
}

// Per-thread scratch of the work units (kept between calls: no allocation per layer).
struct Scratch {
    std::vector<float> q, acc, m, l, kt, v, s, scales;
    std::vector<int8_t> q8;
};

// One token's k or v head (hd floats) into its cache row (an int8 row's scale into *scale).
void store_row(uint8_t* dst, uint8_t* scale_dst, const float* x, int64_t hd, DType dt) {
    switch (dt) {
        case DType::kF32:
            std::memcpy(dst, x, size_t(hd) * 4);
            return;
        case DType::kF16:
            for (int64_t d = 0; d < hd; ++d) {
                const uint16_t h = f32_to_f16(x[d]);
                std::memcpy(dst + 2 * d, &h, 2);
            }
            return;
        case DType::kBF16:
            for (int64_t d = 0; d < hd; ++d) {
                const uint16_t h = f32_to_bf16(x[d]);
                std::memcpy(dst + 2 * d, &h, 2);
            }
            return;
        case DType::kI8: {
            const float scale = quantize_row_int8(x, hd, reinterpret_cast<int8_t*>(dst));
            std::memcpy(scale_dst, &scale, 4);
            return;
        }
        default:
            LATTICE_FAIL("attention: a KV cache of {} is not supported", dtype_name(dt));
    }
}

// One token's k head (hd floats) into its cache column: element d at dst + d * stride (the K block of a
// kv head is [head_dim][block_size], transposed); an int8 column's scale into *scale_dst.
void store_column(uint8_t* dst, int64_t stride, uint8_t* scale_dst, const float* x, int64_t hd, DType dt,
                  std::vector<int8_t>& q8) {
    switch (dt) {
        case DType::kF32:
            for (int64_t d = 0; d < hd; ++d) std::memcpy(dst + d * stride, x + d, 4);
            return;
        case DType::kF16:
        case DType::kBF16:
            for (int64_t d = 0; d < hd; ++d) {
                const uint16_t h = dt == DType::kF16 ? f32_to_f16(x[d]) : f32_to_bf16(x[d]);
                std::memcpy(dst + d * stride, &h, 2);
            }
            return;
        case DType::kI8: {
            q8.resize(size_t(hd));
            const float scale = quantize_row_int8(x, hd, q8.data());
            for (int64_t d = 0; d < hd; ++d) dst[d * stride] = uint8_t(q8[size_t(d)]);
            std::memcpy(scale_dst, &scale, 4);
            return;
        }
        default:
            LATTICE_FAIL("attention: a KV cache of {} is not supported", dtype_name(dt));
    }
}

#if defined(__x86_64__)
// f16 -> f32 by the F16C instruction (exact, as f16_to_f32), 8 at a time: the compiler does not
// vectorize the bit manipulation of the portable conversion.
__attribute__((target("avx2,f16c"))) void f16_row_f16c(float* out, const uint8_t* src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i))));
    for (; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = f16_to_f32(h);
    }
}
// cpuid leaf 1, ecx bit 29 (clang's __builtin_cpu_supports does not know "f16c").
bool has_f16c() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
}
const bool kF16c = has_f16c();
#else
constexpr bool kF16c = false;
void f16_row_f16c(float*, const uint8_t*, int64_t) {}
#endif

// A cache row as hd floats (an int8 row times its scale at *scale_src).
LATTICE_MULTIVERSION void load_row(float* __restrict out, const uint8_t* __restrict src, const uint8_t* scale_src,
                                   int64_t hd, DType dt) {
    switch (dt) {
        case DType::kF32:
            std::memcpy(out, src, size_t(hd) * 4);
            return;
        case DType::kF16:
            if (kF16c) return f16_row_f16c(out, src, hd);
            for (int64_t d = 0; d < hd; ++d) {
                uint16_t h;
                std::memcpy(&h, src + 2 * d, 2);
                out[d] = f16_to_f32(h);
            }
            return;
        case DType::kBF16:
            for (int64_t d = 0; d < hd; ++d) {
                uint16_t h;
                std::memcpy(&h, src + 2 * d, 2);
                out[d] = bf16_to_f32(h);
            }
            return;
        default: {  // kI8 (checked when stored and on entry)
            float scale;
            std::memcpy(&scale, scale_src, 4);
            const int8_t* q = reinterpret_cast<const int8_t*>(src);
            for (int64_t d = 0; d < hd; ++d) out[d] = float(q[d]) * scale;
        }
    }
}


// One cache element as a float (int8 times `scale`).
float load_element(const uint8_t* src, float scale, DType dt) {
    uint16_t h;
    switch (dt) {
        case DType::kF32: {
            float x;
            std::memcpy(&x, src, 4);
            return x;
        }
        case DType::kF16:
            std::memcpy(&h, src, 2);
            return f16_to_f32(h);
        case DType::kBF16:
            std::memcpy(&h, src, 2);
            return bf16_to_f32(h);
        default:
            return float(*reinterpret_cast<const int8_t*>(src)) * scale;
    }
}

// A K tile of a block (the tile's first column at kc; K row d at kc + d * stride bytes) as f32
// kt[d][kTile], lanes jn .. kTile - 1 zero; int8 column j times scales[j].
LATTICE_MULTIVERSION void load_k_tile(float* __restrict kt, const uint8_t* __restrict kc, int64_t stride,
                                      const float* __restrict scales, int64_t jn, int64_t hd, DType dt) {
    for (int64_t d = 0; d < hd; ++d) {
        float* o = kt + d * kTile;
        const uint8_t* src = kc + d * stride;
        switch (dt) {
            case DType::kF32:
                std::memcpy(o, src, size_t(jn) * 4);
                break;
            case DType::kF16:
                if (kF16c) {
                    f16_row_f16c(o, src, jn);
                    break;
                }
                for (int64_t j = 0; j < jn; ++j) {
                    uint16_t h;
                    std::memcpy(&h, src + 2 * j, 2);
                    o[j] = f16_to_f32(h);
                }
                break;
            case DType::kBF16:
                for (int64_t j = 0; j < jn; ++j) {
                    uint16_t h;
                    std::memcpy(&h, src + 2 * j, 2);
                    o[j] = bf16_to_f32(h);
                }
                break;
            default: {
                const int8_t* q = reinterpret_cast<const int8_t*>(src);
                for (int64_t j = 0; j < jn; ++j) o[j] = float(q[j]) * scales[j];
            }
        }
        for (int64_t j = jn; j < kTile; ++j) o[j] = 0.0f;
    }
}

}  // namespace

int64_t kv_row_bytes(DType kv, int64_t head_dim) {
    return kv == DType::kI8 ? head_dim + 4 : head_dim * int64_t(dtype_size(kv));
}


void attention(float* out, const float* qkv, void* k_cache, void* v_cache, const int32_t* positions,
               const int32_t* seqs, int64_t m, const AttentionArgs& a, ThreadPool& pool) {
    const int64_t hd = a.head_dim, nh = a.n_heads, nkv = a.n_kv, B = a.block_size;
    const DType dt = a.kv_dtype;
    LATTICE_CHECK(dt == DType::kF32 || dt == DType::kF16 || dt == DType::kBF16 || dt == DType::kI8,
                  "attention: a KV cache of {} is not supported (f32, f16, bf16, i8)", dtype_name(dt));
    const int64_t rb = kv_row_bytes(dt, hd);
    const int64_t row = (nh + 2 * nkv) * hd;
    const int64_t group = nh / nkv;
    // Validate every token's blocks once (all positions it reads), so the loops below index freely.
    for (int64_t t = 0; t < m; ++t) {
        LATTICE_CHECK(
            seqs[t] >= 0 && seqs[t] < a.num_seqs && positions[t] >= 0 && positions[t] / B < a.table_width,
            "attention: token {} of sequence {} at position {} is outside the block tables ({} sequences x {} "
            "blocks of {})",
            t, seqs[t], positions[t], a.num_seqs, a.table_width, B);
        const int32_t* table = a.block_tables + seqs[t] * a.table_width;
        for (int64_t b = 0; b <= positions[t] / B; ++b)
            LATTICE_CHECK(table[b] >= 0 && table[b] < a.num_blocks,
                          "attention: token {} reads block {} (entry {} of sequence {}), the cache has {} blocks", t,
                          table[b], b, seqs[t], a.num_blocks);
    }
    // Block b's bytes start at b * B * nkv * rb; an int8 block's scales follow its values. V rows: position p,
    // kv head g at row (p % B) * nkv + g. K: kv head g's [hd][B] elements (transposed), element d of position p
    // at (g * hd + d) * B + p % B; int8 scales as V's.
    const int64_t es = dt == DType::kI8 ? 1 : int64_t(dtype_size(dt));  // bytes per element
    const int64_t values = hd * es;                                     // bytes of a row's values
    auto block_of = [&](void* c, int64_t seq, int64_t pos) {
        return static_cast<uint8_t*>(c) + int64_t(a.block_tables[seq * a.table_width + pos / B]) * B * nkv * rb;
    };
    auto v_row = [&](int64_t seq, int64_t pos, int64_t g) {
        return block_of(v_cache, seq, pos) + ((pos % B) * nkv + g) * values;
    };
    auto k_column = [&](int64_t seq, int64_t pos, int64_t g) {  // element d at + d * B * es
        return block_of(k_cache, seq, pos) + (g * hd * B + pos % B) * es;
    };
    auto row_scale = [&](void* c, int64_t seq, int64_t pos, int64_t g) {
        return reinterpret_cast<float*>(block_of(c, seq, pos) + B * nkv * hd) + (pos % B) * nkv + g;
    };
    {
        std::vector<int8_t> q8;
        for (int64_t t = 0; t < m; ++t)
            for (int64_t g = 0; g < nkv; ++g) {
                const int64_t s = seqs[t], p = positions[t];
                store_column(k_column(s, p, g), B * es, reinterpret_cast<uint8_t*>(row_scale(k_cache, s, p, g)),
                             qkv + t * row + (nh + g) * hd, hd, dt, q8);
                store_row(v_row(s, p, g), reinterpret_cast<uint8_t*>(row_scale(v_cache, s, p, g)),
                          qkv + t * row + (nh + nkv + g) * hd, hd, dt);
            }
    }
    // Runs of consecutive tokens of one sequence with increasing positions.
    std::vector<std::pair<int64_t, int64_t>> runs;  // (first token, count)
    for (int64_t t = 0; t < m; ++t) {
        if (!runs.empty()) {
            auto& [t0, n] = runs.back();
            if (n < kRun && seqs[t] == seqs[t0] && positions[t] > positions[t0 + n - 1]) {
                ++n;
                continue;
            }
        }
        runs.emplace_back(t, 1);
    }
    // Caches whose blocks hold whole tiles are read in place (f32, int8, bf16: K tiles as they lie, [hd][B]
    // with row stride B, V rows at their stride). f16 tiles and other block sizes are converted into a
    // per-thread f32 tile first.
    const bool in_place = B % kTile == 0 && dt != DType::kF16;
    // A unit is (run, kv head, part of the kv head's query heads). The parts are the register blocks
    // tile_rows cuts a group into (8, 8, ..., 4, 2, 1), so a row's arithmetic (which the block size R
    // does change: the compiler schedules each R's loops its own way) is the same split or not. In place
    // (nothing converted twice) units are split when there are fewer than twice the threads.
    std::vector<int64_t> cuts{0};  // part p: query heads cuts[p] .. cuts[p + 1] - 1
    for (int64_t h = 0; h < group;) {
        h += group - h >= kRows ? kRows : group - h >= 4 ? 4 : group - h >= 2 ? 2 : 1;
        cuts.push_back(h);
    }
    const int64_t base_units = int64_t(runs.size()) * nkv;
    if (!in_place || base_units >= 2 * pool.size()) cuts = {0, group};
    const int64_t parts = int64_t(cuts.size()) - 1, units = base_units * parts;
    pool.parallel_for(units, [&](int64_t u0, int64_t u1, int) {
        thread_local Scratch sc;
        sc.q.resize(size_t(kRun * group * hd));
        sc.acc.resize(sc.q.size());
        sc.m.resize(size_t(kRun * group));
        sc.l.resize(sc.m.size());
        sc.kt.resize(size_t(hd * kTile));
        sc.v.resize(size_t(kTile * hd));
        sc.s.resize(size_t(kRows * kTile));
        sc.scales.resize(size_t(2 * kTile));
        for (int64_t u = u0; u < u1; ++u) {
            // Plain variables, not a structured binding: the lambdas below capture them (clang 14 refuses a
            // captured binding).
            const int64_t t0 = runs[size_t(u / (nkv * parts))].first, n = runs[size_t(u / (nkv * parts))].second;
            const int64_t g = (u / parts) % nkv, part = u % parts, seq = seqs[t0];
            const int64_t h0 = cuts[size_t(part)], gh = cuts[size_t(part) + 1] - h0;  // query heads h0 .. h0 + gh - 1
            const int64_t rows = n * gh;
            for (int64_t i = 0; i < n; ++i)
                for (int64_t hh = 0; hh < gh; ++hh) {
                    const float* q = qkv + (t0 + i) * row + (g * group + h0 + hh) * hd;
                    float* dst = sc.q.data() + (i * gh + hh) * hd;
                    for (int64_t d = 0; d < hd; ++d) dst[d] = q[d] * a.scale;
                }
            std::fill(sc.acc.begin(), sc.acc.begin() + rows * hd, 0.0f);
            std::fill(sc.m.begin(), sc.m.begin() + rows, -3.402823466e38f);
            std::fill(sc.l.begin(), sc.l.begin() + rows, 0.0f);
            const int64_t last = positions[t0 + n - 1];
            // First key position of a row at `pos` (0 without a window); the run's first token has the lowest.
            const auto window_start = [&](int64_t pos) {
                return a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : int64_t(0);
            };
            for (int64_t j0 = window_start(positions[t0]) / kTile * kTile; j0 <= last; j0 += kTile) {
                const int64_t jn = std::min(kTile, last + 1 - j0);
                // The tile through the rows of every token of the run that reach it.
                const auto attend = [&](const auto& tile) {
                    for (int64_t i = 0; i < n; ++i) {
                        const int64_t pos = positions[t0 + i];
                        if (pos < j0) continue;
                        const int64_t start = window_start(pos);
                        if (start >= j0 + jn) continue;  // the whole tile lies before this row's window
                        const int64_t valid = std::min(jn, pos - j0 + 1), lo = std::max<int64_t>(0, start - j0);
                        const int64_t r = i * gh;  // the token's query heads of this unit: rows r .. r + gh - 1
                        tile_rows(sc.acc.data() + r * hd, sc.m.data() + r, sc.l.data() + r, sc.s.data(),
                                  sc.q.data() + r * hd, tile, lo, valid, hd, gh);
                    }
                };
                if (in_place) {
                    const uint8_t *kc = k_column(seq, j0, g), *vc = v_row(seq, j0, g);
                    // The next tile's K lines and V rows requested ahead: a decode step reads each once, from
                    // memory.
                    if (j0 + kTile <= last) {
                        const uint8_t* kn = k_column(seq, j0 + kTile, g);
                        for (int64_t d = 0; d < hd; d += std::max<int64_t>(1, 64 / (B * es)))
                            __builtin_prefetch(kn + d * B * es);
                        for (int64_t j = j0 + kTile; j < std::min(j0 + 2 * kTile, last + 1); ++j)
                            for (int64_t x = 0; x < values; x += 64) __builtin_prefetch(v_row(seq, j, g) + x);
                    }
                    if (dt == DType::kF32) {
                        attend(Tile<Elem::kF32>{reinterpret_cast<const float*>(kc), B,
                                                reinterpret_cast<const float*>(vc), nkv * hd});
                    } else if (dt == DType::kBF16) {
                        attend(Tile<Elem::kBF16>{reinterpret_cast<const uint16_t*>(kc), B,
                                                 reinterpret_cast<const uint16_t*>(vc), nkv * hd});
                    } else {  // int8: the tile's row scales (lanes past jn zero)
                        float* ks = sc.scales.data();
                        float* vs = ks + kTile;
                        for (int64_t j = 0; j < kTile; ++j) {
                            ks[j] = j < jn ? *row_scale(k_cache, seq, j0 + j, g) : 0.0f;
                            vs[j] = j < jn ? *row_scale(v_cache, seq, j0 + j, g) : 0.0f;
                        }
                        attend(Tile<Elem::kI8>{reinterpret_cast<const int8_t*>(kc), B,
                                               reinterpret_cast<const int8_t*>(vc), nkv * hd, ks, vs});
                    }
                    continue;
                }
                if (B % kTile == 0) {  // the tile lies in one block: each K row of it is contiguous
                    load_k_tile(sc.kt.data(), k_column(seq, j0, g), B * es, sc.scales.data(), jn, hd, dt);
                } else {  // a block size that is not a multiple of the tile: one position at a time
                    std::fill(sc.kt.begin(), sc.kt.end(), 0.0f);
                    for (int64_t j = 0; j < jn; ++j) {
                        const float scale = dt == DType::kI8 ? *row_scale(k_cache, seq, j0 + j, g) : 1.0f;
                        const uint8_t* kc = k_column(seq, j0 + j, g);
                        for (int64_t d = 0; d < hd; ++d)
                            sc.kt[size_t(d * kTile + j)] = load_element(kc + d * B * es, scale, dt);
                    }
                }
                for (int64_t j = 0; j < jn; ++j)
                    load_row(sc.v.data() + j * hd, v_row(seq, j0 + j, g),
                             reinterpret_cast<const uint8_t*>(row_scale(v_cache, seq, j0 + j, g)), hd, dt);
                attend(Tile<Elem::kF32>{sc.kt.data(), kTile, sc.v.data(), hd});
            }
            for (int64_t i = 0; i < n; ++i)
                for (int64_t hh = 0; hh < gh; ++hh) {
                    const int64_t r = i * gh + hh;
                    const float inv = 1.0f / sc.l[size_t(r)];
                    float* o = out + (t0 + i) * nh * hd + (g * group + h0 + hh) * hd;
                    for (int64_t d = 0; d < hd; ++d) o[d] = sc.acc[size_t(r * hd + d)] * inv;
                }
        }
    });
}

}  // namespace lattice::cpu
