// CPU attention over the paged KV cache (see ops.h for the layouts), flash-style:
//  - a work unit is (run, kv head): a run is up to kRun consecutive batch tokens of one sequence
//    (increasing positions), so all `group` query heads of a kv head and all tokens of the run
//    share each K/V tile; decode (one token) still shares a tile among its query heads;
//  - keys are walked in tiles of kTile positions aligned to position 0; each tile is gathered
//    through the block table once per unit, K transposed ([head_dim][kTile]) so the scores of a
//    query row against the whole tile vectorize over positions with no horizontal sums;
//  - the query heads of one token share a tile's bound, so they go through it together, in
//    register blocks of up to 8 rows (tile_rows): scores as a small GEMM against the transposed
//    tile, online softmax per row (running max, running sum, rescaled accumulator; the weights by
//    a vectorizable exp, exp_neg in kernels/common/fast_exp.h), then the weighted V rows as a small GEMM.
// A sliding window (AttentionArgs::window = W > 0) limits the keys of the query at position i to
// i - W < j <= i, as transformers' Mistral does: tiles wholly before a row's window are skipped for that
// row, and in the tile holding the window's start the positions before it get zero weight.
// The cache holds f32, f16, bf16 or int8 rows (kv_row_bytes): an int8 block holds its
// [block_size, n_kv, head_dim] int8 values, then their [block_size, n_kv] f32 scales (symmetric, one
// scale per token and kv head, kernels/common/quantize.h; values first so that each row starts
// 16-byte aligned for vector loads on GPUs), quantized as the token is stored; every dtype is read
// into the f32 tile as it is gathered, so attention never needs a dequantized copy of the cache and
// the tile math is the same for all of them.
// Every query row's arithmetic depends only on its own q and on positions 0..pos of its sequence,
// in a fixed order (tiles from position 0, d then j), never on which other tokens share its batch
// or run: chunked prefill, batched decode and single-token decode give bit-identical rows.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
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

constexpr int64_t kTile = 32;  // key positions per tile
constexpr int64_t kRun = 16;   // query tokens per work unit

// The three steps of a query row against one K/V tile, for the `rows` query heads of one token
// (they share the tile and the causal bound `valid`), in blocks of up to kRows rows so that every K
// and V element loaded serves several rows and the accumulators stay in registers. Each row's
// arithmetic is the same sequence of operations whatever the block (vectorized over positions and
// head dimensions, never across rows), so the result does not depend on the block sizes.
constexpr int kRows = 8;

// s[r][j] = sum_d q[r][d] * kt[d][j] for j < kTile (kt padded with zeros past the valid positions),
// summed in order of d.
template <int R>
[[gnu::always_inline]] inline void scores_rows(float* __restrict s, const float* __restrict q,
                                               const float* __restrict kt, int64_t hd) {
    float acc[R][kTile] = {};
    for (int64_t d = 0; d < hd; ++d) {
        const float* k = kt + d * kTile;
        for (int r = 0; r < R; ++r) {
            const float qd = q[r * hd + d];
            for (int64_t j = 0; j < kTile; ++j) acc[r][j] += qd * k[j];
        }
    }
    for (int r = 0; r < R; ++r)
        for (int64_t j = 0; j < kTile; ++j) s[r * kTile + j] = acc[r][j];
}

// acc[r][d] += sum_j p[r][j] * v[j][d] over j < valid, in order of j.
template <int R>
[[gnu::always_inline]] inline void pv_rows(float* __restrict acc, const float* __restrict p, int64_t valid,
                                           const float* __restrict v, int64_t hd) {
    constexpr int64_t kD = 16;
    int64_t d0 = 0;
    for (; d0 + kD <= hd; d0 += kD) {
        float a[R][kD];
        for (int r = 0; r < R; ++r)
            for (int64_t x = 0; x < kD; ++x) a[r][x] = acc[r * hd + d0 + x];
        for (int64_t j = 0; j < valid; ++j) {
            const float* vr = v + j * hd + d0;
            for (int r = 0; r < R; ++r) {
                const float pj = p[r * kTile + j];
                for (int64_t x = 0; x < kD; ++x) a[r][x] += pj * vr[x];
            }
        }
        for (int r = 0; r < R; ++r)
            for (int64_t x = 0; x < kD; ++x) acc[r * hd + d0 + x] = a[r][x];
    }
    if (d0 < hd)  // a head_dim that is not a multiple of 16: the rest one column at a time
        for (int r = 0; r < R; ++r)
            for (int64_t j = 0; j < valid; ++j) {
                const float pj = p[r * kTile + j];
                const float* vr = v + j * hd;
                for (int64_t d = d0; d < hd; ++d) acc[r * hd + d] += pj * vr[d];
            }
}

// Positions [lo, valid) of the tile are the rows' keys (lo > 0 only where a sliding window starts).
template <int R>
[[gnu::always_inline]] inline void rows_block(float* acc, float* m, float* l, float* s, const float* q,
                                              const float* kt, const float* v, int64_t lo, int64_t valid,
                                              int64_t hd) {
    scores_rows<R>(s, q, kt, hd);
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
    pv_rows<R>(acc, s, valid, v, hd);
}

// One tile for `rows` query rows (consecutive in q, acc, m, l) that share `valid`; s holds
// kRows x kTile floats of scratch.
LATTICE_MULTIVERSION void tile_rows(float* acc, float* m, float* l, float* s, const float* q, const float* kt,
                                    const float* v, int64_t lo, int64_t valid, int64_t hd, int64_t rows) {
    int64_t r = 0;
    for (; r + kRows <= rows; r += kRows)
        rows_block<kRows>(acc + r * hd, m + r, l + r, s, q + r * hd, kt, v, lo, valid, hd);
    if (r + 4 <= rows) rows_block<4>(acc + r * hd, m + r, l + r, s, q + r * hd, kt, v, lo, valid, hd), r += 4;
    if (r + 2 <= rows) rows_block<2>(acc + r * hd, m + r, l + r, s, q + r * hd, kt, v, lo, valid, hd), r += 2;
    if (r < rows) rows_block<1>(acc + r * hd, m + r, l + r, s, q + r * hd, kt, v, lo, valid, hd);
}

struct Scratch {
    std::vector<float> q, acc, m, l, kt, v, s, row;
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
    // Block b's bytes start at b * B * nkv * rb; an int8 block's scales follow its values.
    const int64_t values = dt == DType::kI8 ? hd : rb;  // bytes of a row's values
    auto cache_row = [&](void* c, int64_t seq, int64_t pos, int64_t g) {
        const int64_t block = a.block_tables[seq * a.table_width + pos / B];
        return static_cast<uint8_t*>(c) + block * B * nkv * rb + ((pos % B) * nkv + g) * values;
    };
    auto row_scale = [&](void* c, int64_t seq, int64_t pos, int64_t g) {
        const int64_t block = a.block_tables[seq * a.table_width + pos / B];
        return static_cast<uint8_t*>(c) + block * B * nkv * rb + B * nkv * hd + ((pos % B) * nkv + g) * 4;
    };
    for (int64_t t = 0; t < m; ++t)
        for (int64_t g = 0; g < nkv; ++g) {
            const int64_t s = seqs[t], p = positions[t];
            store_row(cache_row(k_cache, s, p, g), row_scale(k_cache, s, p, g), qkv + t * row + (nh + g) * hd, hd, dt);
            store_row(cache_row(v_cache, s, p, g), row_scale(v_cache, s, p, g), qkv + t * row + (nh + nkv + g) * hd,
                      hd, dt);
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
    const int64_t units = int64_t(runs.size()) * nkv;
    pool.parallel_for(units, [&](int64_t u0, int64_t u1, int) {
        Scratch sc;
        sc.q.resize(size_t(kRun * group * hd));
        sc.acc.resize(sc.q.size());
        sc.m.resize(size_t(kRun * group));
        sc.l.resize(sc.m.size());
        sc.kt.resize(size_t(hd * kTile));
        sc.v.resize(size_t(kTile * hd));
        sc.s.resize(size_t(kRows * kTile));
        sc.row.resize(size_t(hd));
        for (int64_t u = u0; u < u1; ++u) {
            const auto [t0, n] = runs[size_t(u / nkv)];
            const int64_t g = u % nkv, seq = seqs[t0];
            const int64_t rows = n * group;
            for (int64_t i = 0; i < n; ++i)
                for (int64_t hh = 0; hh < group; ++hh) {
                    const float* q = qkv + (t0 + i) * row + (g * group + hh) * hd;
                    float* dst = sc.q.data() + (i * group + hh) * hd;
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
                // The next tile's rows (and int8 scales) requested ahead: one head's rows are nkv rows
                // apart in their blocks, and a decode step reads each once, from memory.
                for (int64_t j = j0 + kTile; j < std::min(j0 + 2 * kTile, last + 1); ++j) {
                    __builtin_prefetch(cache_row(k_cache, seq, j, g));
                    __builtin_prefetch(cache_row(v_cache, seq, j, g));
                    if (dt == DType::kI8 && j % 16 == 0) {
                        __builtin_prefetch(row_scale(k_cache, seq, j, g));
                        __builtin_prefetch(row_scale(v_cache, seq, j, g));
                    }
                }
                for (int64_t j = 0; j < kTile; ++j) {
                    if (j < jn) {
                        load_row(sc.row.data(), cache_row(k_cache, seq, j0 + j, g),
                                 row_scale(k_cache, seq, j0 + j, g), hd, dt);
                        for (int64_t d = 0; d < hd; ++d) sc.kt[size_t(d * kTile + j)] = sc.row[size_t(d)];
                        load_row(sc.v.data() + j * hd, cache_row(v_cache, seq, j0 + j, g),
                                 row_scale(v_cache, seq, j0 + j, g), hd, dt);
                    } else {
                        for (int64_t d = 0; d < hd; ++d) sc.kt[size_t(d * kTile + j)] = 0.0f;
                    }
                }
                for (int64_t i = 0; i < n; ++i) {
                    const int64_t pos = positions[t0 + i];
                    if (pos < j0) continue;
                    const int64_t start = window_start(pos);
                    if (start >= j0 + jn) continue;  // the whole tile lies before this row's window
                    const int64_t valid = std::min(jn, pos - j0 + 1), lo = std::max<int64_t>(0, start - j0);
                    const int64_t r = i * group;  // the token's query heads: rows r .. r + group - 1
                    tile_rows(sc.acc.data() + r * hd, sc.m.data() + r, sc.l.data() + r, sc.s.data(),
                              sc.q.data() + r * hd, sc.kt.data(), sc.v.data(), lo, valid, hd, group);
                }
            }
            for (int64_t i = 0; i < n; ++i)
                for (int64_t hh = 0; hh < group; ++hh) {
                    const int64_t r = i * group + hh;
                    const float inv = 1.0f / sc.l[size_t(r)];
                    float* o = out + (t0 + i) * nh * hd + (g * group + hh) * hd;
                    for (int64_t d = 0; d < hd; ++d) o[d] = sc.acc[size_t(r * hd + d)] * inv;
                }
        }
    });
}

}  // namespace lattice::cpu
