// CPU attention over the paged KV cache (see ops.h for the layouts), flash-style:
//  - a work unit is (run, kv head): a run is up to kRun consecutive batch tokens of one sequence
//    (increasing positions), so all `group` query heads of a kv head and all tokens of the run
//    share each K/V tile; decode (one token) still shares a tile among its query heads;
//  - keys are walked in tiles of kTile positions aligned to position 0; each tile is gathered
//    through the block table once per unit, K transposed ([head_dim][kTile]) so the scores of a
//    query row against the whole tile vectorize over positions with no horizontal sums;
//  - online softmax per query row (running max, running sum, rescaled accumulator), the weights by
//    a vectorizable exp (exp_neg below).
// Every query row's arithmetic depends only on its own q and on positions 0..pos of its sequence,
// in a fixed order (tiles from position 0, d then j), never on which other tokens share its batch
// or run: chunked prefill, batched decode and single-token decode give bit-identical rows.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/multiversion.h"


namespace lattice::cpu {

namespace {

constexpr int64_t kTile = 32;  // key positions per tile
constexpr int64_t kRun = 16;   // query tokens per work unit

// e^x for x <= 0 (softmax weights), written to vectorize: x = n ln2 + r with |r| <= ln2 / 2 (Cody-Waite
// split of ln2), e^r by its degree-6 Taylor polynomial (relative error < 2e-7 on that range), 2^n through
// the exponent bits. x below -87 gives e^-87 ~ 1.6e-38 instead of a denormal (it only ever scales zeros).
inline float exp_neg(float x) {
    x = std::max(x, -87.0f);
    const float n = std::floor(x * 1.44269504088896341f + 0.5f);
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    const float p =
        1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
    return p * std::bit_cast<float>((int32_t(n) + 127) << 23);
}

// s[j] = sum_d q[d] * kt[d][j] for j < kTile (kt padded with zeros past the valid positions).
LATTICE_MULTIVERSION void tile_scores(float* s, const float* q, const float* kt, int64_t hd) {
    for (int64_t j = 0; j < kTile; ++j) s[j] = 0.0f;
    for (int64_t d = 0; d < hd; ++d) {
        const float qd = q[d];
        const float* k = kt + d * kTile;
        for (int64_t j = 0; j < kTile; ++j) s[j] += qd * k[j];
    }
}

// One online-softmax step of a query row over the first `valid` scores of a tile.
LATTICE_MULTIVERSION void tile_update(float* acc, float& m, float& l, float* s, int64_t valid, const float* v,
                                      int64_t hd) {
    float mt = m;
    for (int64_t j = 0; j < valid; ++j) mt = std::max(mt, s[j]);
    const float rescale = exp_neg(m - mt);
    float sum = 0.0f;
    for (int64_t j = 0; j < valid; ++j) {
        s[j] = exp_neg(s[j] - mt);
        sum += s[j];
    }
    l = l * rescale + sum;
    m = mt;
    for (int64_t d = 0; d < hd; ++d) acc[d] *= rescale;
    for (int64_t j = 0; j < valid; ++j) {
        const float p = s[j];
        const float* vr = v + j * hd;
        for (int64_t d = 0; d < hd; ++d) acc[d] += p * vr[d];
    }
}

struct Scratch {
    std::vector<float> q, acc, m, l, kt, v, s;
};

}  // namespace

void attention(float* out, const float* qkv, float* k_cache, float* v_cache, const int32_t* positions,
               const int32_t* seqs, int64_t m, const AttentionArgs& a, ThreadPool& pool) {
    const int64_t hd = a.head_dim, nh = a.n_heads, nkv = a.n_kv, B = a.block_size;
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
    auto cache_row = [&](float* c, int64_t seq, int64_t pos, int64_t g) {
        const int64_t block = a.block_tables[seq * a.table_width + pos / B];
        return c + ((block * B + pos % B) * nkv + g) * hd;
    };
    for (int64_t t = 0; t < m; ++t)
        for (int64_t g = 0; g < nkv; ++g) {
            std::memcpy(cache_row(k_cache, seqs[t], positions[t], g), qkv + t * row + (nh + g) * hd, size_t(hd) * 4);
            std::memcpy(cache_row(v_cache, seqs[t], positions[t], g), qkv + t * row + (nh + nkv + g) * hd,
                        size_t(hd) * 4);
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
        sc.s.resize(size_t(kTile));
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
            for (int64_t j0 = 0; j0 <= last; j0 += kTile) {
                const int64_t jn = std::min(kTile, last + 1 - j0);
                for (int64_t j = 0; j < kTile; ++j) {
                    if (j < jn) {
                        const float* k = cache_row(k_cache, seq, j0 + j, g);
                        for (int64_t d = 0; d < hd; ++d) sc.kt[size_t(d * kTile + j)] = k[d];
                        std::memcpy(sc.v.data() + j * hd, cache_row(v_cache, seq, j0 + j, g), size_t(hd) * 4);
                    } else {
                        for (int64_t d = 0; d < hd; ++d) sc.kt[size_t(d * kTile + j)] = 0.0f;
                    }
                }
                for (int64_t i = 0; i < n; ++i) {
                    const int64_t pos = positions[t0 + i];
                    if (pos < j0) continue;
                    const int64_t valid = std::min(jn, pos - j0 + 1);
                    for (int64_t hh = 0; hh < group; ++hh) {
                        const int64_t r = i * group + hh;
                        tile_scores(sc.s.data(), sc.q.data() + r * hd, sc.kt.data(), hd);
                        tile_update(sc.acc.data() + r * hd, sc.m[size_t(r)], sc.l[size_t(r)], sc.s.data(), valid,
                                    sc.v.data(), hd);
                    }
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
