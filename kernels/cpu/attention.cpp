// CPU attention over the paged KV cache (see ops.h for the layouts), flash-style:
//  - a work unit is (run, kv head): a run is up to kRun consecutive batch tokens of one sequence
//    (increasing positions), so all `group` query heads of a kv head and all tokens of the run
//    share each K/V tile; decode (one token) still shares a tile among its query heads;
//  - keys are walked in tiles of kTile (16) positions aligned to position 0. The K cache is stored
//    transposed per block and kv head ([head_dim][block_size]), so a tile of a cache whose block size
//    is a multiple of 16 is read where it lies (f32, bf16 by a shift, int8 widened in registers, its row
//    scales applied to the scores and to the softmax weights): the scores of a query row against the
//    whole tile vectorize over positions with no horizontal sums and no copy. V rows are read in place
//    too, and lie per kv head ([block_size][head_dim] of one kv head contiguous, like its K): a decode
//    step's reads of one kv head are then two contiguous runs per block, not rows at the stride of all kv
//    heads (docs/benchmark-results.md, 2026-12-06 night). f16 tiles are converted into a per-thread f32
//    tile (each K row of a tile contiguous, F16C);
//    block sizes that are not a multiple of 16 are gathered position by position;
//  - the query heads of one token share a tile's bound, so they go through it together, in
//    register blocks of up to 8 rows (attention_kernels.cpp): scores as a small GEMM against the transposed
//    tile, online softmax per row (running max, running sum, rescaled accumulator; the weights by
//    a vectorizable exp, exp_neg in kernels/common/fast_exp.h; the max moved only where a score passes it by
//    more than 8 and the sum kept per position lane, so that most tiles need no horizontal max or sum and no
//    rescale: prefill attention 1.2x, docs/benchmark-results.md 2026-12-07), then the weighted V rows as a
//    small GEMM;
//  - keys come in segments of kSegment (256) positions aligned to position 0: a row's online softmax
//    restarts at each segment and the segments' states are folded in order (fold_row), so a row whose
//    keys lie in one segment gets exactly its online softmax;
//  - when a step has fewer (run, kv head) units than twice the threads (decode of a few sequences), each
//    segment of a unit's rows is a unit of its own and their states are merged after (merge_rows): split-KV
//    decode, for the shapes where one thread read a whole sequence alone (the 70B model at TP 8 has one kv
//    head a rank); when even those are fewer than twice the threads, an in-place unit is split by query heads
//    too, at the register blocks' bounds. No row's arithmetic depends on the split.
// A soft-cap (AttentionArgs::softcap = c > 0, Gemma 2) turns each score s (q . k * scale) into
// c * tanh(s / c) before the softmax.
// A sliding window (AttentionArgs::window = W > 0) limits the keys of the query at position i to
// i - W < j <= i, as transformers' Mistral does: tiles wholly before a row's window are skipped for that
// row, and in the tile holding the window's start the positions before it get zero weight.
// The cache holds f32, f16, bf16 or int8 elements (kv_row_bytes per token and kv head). A block holds
// K as [n_kv][head_dim][block_size] (element d of position p of kv head g at (g * head_dim + d) *
// block_size + p % block_size) and V as [n_kv][block_size][head_dim] rows; an int8 block's values come
// first, then their [block_size, n_kv] f32 scales (symmetric, one scale per token and kv head,
// kernels/common/quantize.h), quantized as the token is stored. Every dtype is read as f32 (in place
// or into the tile), so attention never needs a dequantized copy of the cache and the tile math is
// the same for all of them; except that on a CPU with AVX512_BF16 a bf16 cache read in place runs the
// bf16-dot math (attention_internal.h, TileKernels::bf16_dot: q and the weights rounded to bf16, products in
// pairs; prefill attention at 4096 positions ~1.4x the widened math on Zen 4, docs/benchmark-results.md).
// Every query row's arithmetic depends only on its own q and on positions 0..pos of its sequence,
// in a fixed order (segments and tiles from position 0, d then j), never on which other tokens share its
// batch or run, nor on the threads: chunked prefill, batched decode and single-token decode give
// bit-identical rows.
// Files: attention_internal.h names the parts; this file is the op (checks, work units, the tile walk of a
// unit), attention_kernels.cpp the tile math, attention_cache.cpp the cache's rows. The tile math and the
// cache readers run the ISA variant of detect_isa() (isa.h), chosen once per call (the bit-identity above
// holds within one level; across levels isa_variants.h says what differs).
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/error.h"
#include "kernels/common/fast_exp.h"
#include "kernels/cpu/attention_internal.h"
#include "kernels/cpu/ops.h"

namespace lattice::cpu {

namespace {

using attn::Elem;
using attn::kRows;
using attn::kRun;
using attn::kTile;
using attn::Tile;

// Per-thread scratch of the work units (kept between calls: no allocation per layer).
struct Scratch {
    std::vector<float> q, acc, m, l, lt, kt, v, s, scales, o, mo, lo;  // l: kTile lanes a row, lt: their sums
    std::vector<uint16_t> qb;  // the bf16-dot math: q rounded to bf16
};

// Validates every token's blocks once (all positions it reads), so the loops after it index freely.
void check_tokens(const int32_t* positions, const int32_t* seqs, int64_t m, const AttentionArgs& a) {
    const DType dt = a.kv_dtype;
    LATTICE_CHECK(dt == DType::kF32 || dt == DType::kF16 || dt == DType::kBF16 || dt == DType::kI8,
                  "attention: a KV cache of {} is not supported (f32, f16, bf16, i8)", dtype_name(dt));
    const int64_t B = a.block_size;
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
}

// Runs of consecutive tokens of one sequence with increasing positions: (first token, count).
std::vector<std::pair<int64_t, int64_t>> token_runs(const int32_t* positions, const int32_t* seqs, int64_t m) {
    std::vector<std::pair<int64_t, int64_t>> runs;
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
    return runs;
}

// Everything a work unit reads: the call's arguments, its cache layout, units and kernels.
struct Job {
    float* out;
    const float* qkv;
    const int32_t* positions;
    const int32_t* seqs;
    const AttentionArgs& a;
    attn::KvLayout c;
    std::vector<std::pair<int64_t, int64_t>> runs;
    int64_t group = 1, row = 0;
    bool in_place = false;
    bool bf16_dot = false;  // bf16 tiles read in place by the bf16-dot math (attention_internal.h, TileKernels)
    attn::TileKernels tiles{};
    attn::CacheReaders readers{};

    // First key position of a row at `pos` (0 without a window).
    int64_t window_start(int64_t pos) const { return a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0; }
    // The first tile a run starting at token t0 reads (its first token has the lowest window start).
    int64_t first_tile(int64_t t0) const { return window_start(positions[t0]) / kTile * kTile; }
};

// One unit's rows: tokens t0 .. t0 + n - 1 of sequence seq, kv head g, query heads h0 .. h0 + gh - 1 of its
// group; row r = i * gh + hh (token i, head hh); its keys in segments s0 .. s1 - 1. partial: null when the
// unit has all of its rows' segments (it folds them and writes the rows out), else where its one segment's
// unnormalized rows go (acc, then m, then l; merged by merge_rows).
struct Unit {
    int64_t t0, n, g, seq, h0, gh, s0, s1;
    float* partial;
};

// Floats of a unit's partial state: acc [rows][hd], then m [rows], then l [rows].
size_t partial_size(const Unit& u, int64_t hd) { return size_t(u.n * u.gh * (hd + 2)); }

// A row's softmax sum from its kTile lanes (the tile math keeps one per position lane), in a fixed pairwise
// tree: lane j with j + 8, then + 4, then + 2, then the last two.
float lanes_total(const float* v) {
    float a[8];
    for (int j = 0; j < 8; ++j) a[j] = v[j] + v[j + 8];
    for (int j = 0; j < 4; ++j) a[j] += a[j + 4];
    for (int j = 0; j < 2; ++j) a[j] += a[j + 2];
    return a[0] + a[1];
}

// Folds one segment's state of a row (acc, m, l: kSegment keys' online softmax) into the row's running state
// (o, mo, lo), segments in increasing order; a segment without keys for the row (l == 0) adds nothing and the
// first with keys is taken as it is (so a row with one segment gets exactly its online softmax). Not inlined:
// the units and the merge after distributed units run this one code, so a row's bits do not depend on which
// of them folded it.
[[gnu::noinline]] void fold_row(float* o, float& mo, float& lo, const float* acc, float m, float l, int64_t hd) {
    if (l == 0.0f) return;
    if (lo == 0.0f) {
        std::memcpy(o, acc, size_t(hd) * sizeof(float));
        mo = m;
        lo = l;
        return;
    }
    const float mx = std::max(mo, m), a = exp_neg(mo - mx), b = exp_neg(m - mx);
    lo = lo * a + l * b;
    for (int64_t d = 0; d < hd; ++d) o[d] = o[d] * a + acc[d] * b;
    mo = mx;
}

// The tile through the rows of every token of the unit that reach it (keys j0 .. j0 + jn - 1).
template <Elem E>
void attend(const Job& j, const Unit& u, Scratch& sc, int64_t j0, int64_t jn, attn::TileRowsFn<E> fn,
            const Tile<E>& tile) {
    const int64_t hd = j.c.hd;
    for (int64_t i = 0; i < u.n; ++i) {
        const int64_t pos = j.positions[u.t0 + i];
        if (pos < j0) continue;
        const int64_t start = j.window_start(pos);
        if (start >= j0 + jn) continue;  // the whole tile lies before this row's window
        const int64_t valid = std::min(jn, pos - j0 + 1), lo = std::max<int64_t>(0, start - j0);
        const int64_t r = i * u.gh;  // the token's query heads of this unit: rows r .. r + gh - 1
        Tile<E> t = tile;
        t.softcap = j.a.softcap;
        if constexpr (E == Elem::kBF16)
            if (j.bf16_dot) t.qb = sc.qb.data() + r * hd;
        fn(sc.acc.data() + r * hd, sc.m.data() + r, sc.l.data() + r * kTile, sc.s.data(), sc.q.data() + r * hd, t, lo,
           valid, hd, u.gh);
    }
}

// A tile read where it lies in its block (f32, bf16, int8 with its row scales).
void attend_in_place(const Job& j, const Unit& u, Scratch& sc, int64_t j0, int64_t jn, int64_t last) {
    const attn::KvLayout& c = j.c;
    const int64_t g = u.g, seq = u.seq, hd = c.hd, B = c.B;
    const uint8_t *kc = c.k_column(seq, j0, g), *vc = c.v_row(seq, j0, g);
    // The next tile's K lines and V rows requested ahead: a decode step reads each once, from memory. A unit of
    // one token (decode) has the tile math request them into L2 (prefetcht1), a line per step of its loops
    // (Tile::next_k / next_v): the burst of 128 L1 requests (prefetcht0) that each tile started with held the
    // core until most of them were in flight (the L1's miss buffers full), and the math waited behind them;
    // cold 4096-position decode ran 1.5-1.9x faster with f32 caches, 1.3-1.6x with bf16, on Zen 4
    // (docs/benchmark-results.md, 2026-12-07). A unit of several tokens (prefill) reads each tile for all of
    // them: the burst there, and the tile math without the requests.
    // The tile lies in one block (B is a multiple of kTile here), so its rows are at fixed strides from its
    // first: no block-table lookup (a division by B) per position.
    const uint8_t *kn = nullptr, *vn = nullptr;
    int64_t next_rows = 0;
    if (j0 + kTile <= last) {
        kn = c.k_column(seq, j0 + kTile, g);
        vn = c.v_row(seq, j0 + kTile, g);
        next_rows = std::min(kTile, last + 1 - (j0 + kTile));
        if (u.n > 1) {
            for (int64_t d = 0; d < hd; d += std::max<int64_t>(1, 64 / (B * c.es)))
                __builtin_prefetch(kn + d * B * c.es);
            for (int64_t p = 0; p < next_rows; ++p)
                for (int64_t x = 0; x < c.values; x += 64) __builtin_prefetch(vn + p * c.values + x);
            kn = vn = nullptr;
        }
    }
    auto with_next = [&](auto t) {
        using T = std::remove_const_t<std::remove_pointer_t<decltype(t.k)>>;
        t.next_k = reinterpret_cast<const T*>(kn);
        t.next_v = reinterpret_cast<const T*>(vn);
        t.next_v_rows = next_rows;
        return t;
    };
    const DType dt = j.a.kv_dtype;
    if (dt == DType::kF32) {
        attend(
            j, u, sc, j0, jn, j.tiles.f32,
            with_next(Tile<Elem::kF32>{reinterpret_cast<const float*>(kc), B, reinterpret_cast<const float*>(vc), hd}));
    } else if (dt == DType::kBF16) {
        attend(j, u, sc, j0, jn, j.tiles.bf16,
               with_next(Tile<Elem::kBF16>{reinterpret_cast<const uint16_t*>(kc), B,
                                           reinterpret_cast<const uint16_t*>(vc), hd}));
    } else {  // int8: the tile's row scales (lanes past jn zero)
        float* ks = sc.scales.data();
        float* vs = ks + kTile;
        for (int64_t t = 0; t < kTile; ++t) {
            ks[t] = t < jn ? *c.row_scale(c.k_cache, seq, j0 + t, g) : 0.0f;
            vs[t] = t < jn ? *c.row_scale(c.v_cache, seq, j0 + t, g) : 0.0f;
        }
        attend(j, u, sc, j0, jn, j.tiles.i8,
               with_next(Tile<Elem::kI8>{reinterpret_cast<const int8_t*>(kc), B, reinterpret_cast<const int8_t*>(vc),
                                         hd, ks, vs}));
    }
}

// A tile converted into the thread's f32 tile first (f16 caches, block sizes that are not a multiple of it).
void attend_converted(const Job& j, const Unit& u, Scratch& sc, int64_t j0, int64_t jn) {
    const attn::KvLayout& c = j.c;
    const int64_t g = u.g, seq = u.seq, hd = c.hd, B = c.B;
    const DType dt = j.a.kv_dtype;
    if (B % kTile == 0) {  // the tile lies in one block: each K row of it is contiguous
        j.readers.load_k_tile(sc.kt.data(), c.k_column(seq, j0, g), B * c.es, sc.scales.data(), jn, hd, dt);
    } else {  // a block size that is not a multiple of the tile: one position at a time
        std::fill(sc.kt.begin(), sc.kt.end(), 0.0f);
        for (int64_t t = 0; t < jn; ++t) {
            const float scale = dt == DType::kI8 ? *c.row_scale(c.k_cache, seq, j0 + t, g) : 1.0f;
            const uint8_t* kc = c.k_column(seq, j0 + t, g);
            for (int64_t d = 0; d < hd; ++d)
                sc.kt[size_t(d * kTile + t)] = attn::load_element(kc + d * B * c.es, scale, dt);
        }
    }
    for (int64_t t = 0; t < jn; ++t)
        j.readers.load_row(sc.v.data() + t * hd, c.v_row(seq, j0 + t, g),
                           reinterpret_cast<const uint8_t*>(c.row_scale(c.v_cache, seq, j0 + t, g)), hd, dt);
    attend(j, u, sc, j0, jn, j.tiles.f32, Tile<Elem::kF32>{sc.kt.data(), kTile, sc.v.data(), hd});
}

// The unit's rows out: o / lo (every row has keys: its own position at least).
void write_rows(const Job& j, const Unit& u, const float* o, const float* lo) {
    const int64_t hd = j.c.hd, nh = j.a.n_heads;
    for (int64_t i = 0; i < u.n; ++i)
        for (int64_t hh = 0; hh < u.gh; ++hh) {
            const int64_t r = i * u.gh + hh;
            const float inv = 1.0f / lo[r];
            float* out = j.out + (u.t0 + i) * nh * hd + (u.g * j.group + u.h0 + hh) * hd;
            for (int64_t d = 0; d < hd; ++d) out[d] = o[r * hd + d] * inv;
        }
}

// Work unit u: its queries (scaled) into the scratch, every tile of keys of its segments (each segment's
// online softmax from its first key), the segments folded (fold_row) and the rows written, or its one
// segment's state into u.partial.
void run_unit(const Job& j, const Unit& u, Scratch& sc) {
    const int64_t hd = j.c.hd, rows = u.n * u.gh;
    for (int64_t i = 0; i < u.n; ++i)
        for (int64_t hh = 0; hh < u.gh; ++hh) {
            const float* q = j.qkv + (u.t0 + i) * j.row + (u.g * j.group + u.h0 + hh) * hd;
            float* dst = sc.q.data() + (i * u.gh + hh) * hd;
            for (int64_t d = 0; d < hd; ++d) dst[d] = q[d] * j.a.scale;
            if (j.bf16_dot)
                for (int64_t d = 0; d < hd; ++d) sc.qb[size_t((i * u.gh + hh) * hd + d)] = f32_to_bf16(dst[d]);
        }
    std::fill(sc.lo.begin(), sc.lo.begin() + rows, 0.0f);
    const int64_t last = j.positions[u.t0 + u.n - 1], first = j.first_tile(u.t0);
    for (int64_t seg = u.s0; seg < u.s1; ++seg) {
        std::fill(sc.acc.begin(), sc.acc.begin() + rows * hd, 0.0f);
        std::fill(sc.m.begin(), sc.m.begin() + rows, -3.402823466e38f);
        std::fill(sc.l.begin(), sc.l.begin() + rows * kTile, 0.0f);
        const int64_t end = std::min(last + 1, (seg + 1) * attn::kSegment);
        for (int64_t j0 = std::max(first, seg * attn::kSegment); j0 < end; j0 += kTile) {
            const int64_t jn = std::min(kTile, end - j0);
            if (j.in_place)
                attend_in_place(j, u, sc, j0, jn, end - 1);
            else
                attend_converted(j, u, sc, j0, jn);
        }
        for (int64_t r = 0; r < rows; ++r) sc.lt[size_t(r)] = lanes_total(sc.l.data() + r * kTile);
        if (u.partial) {
            std::memcpy(u.partial, sc.acc.data(), size_t(rows * hd) * sizeof(float));
            std::memcpy(u.partial + rows * hd, sc.m.data(), size_t(rows) * sizeof(float));
            std::memcpy(u.partial + rows * (hd + 1), sc.lt.data(), size_t(rows) * sizeof(float));
            return;
        }
        for (int64_t r = 0; r < rows; ++r)
            fold_row(sc.o.data() + r * hd, sc.mo[size_t(r)], sc.lo[size_t(r)], sc.acc.data() + r * hd, sc.m[size_t(r)],
                     sc.lt[size_t(r)], hd);
    }
    write_rows(j, u, sc.o.data(), sc.lo.data());
}

// The distributed units units[u0 .. u1) (one row set, its segments in order): their partials folded, the rows
// written.
void merge_rows(const Job& j, const std::vector<Unit>& units, size_t u0, size_t u1, Scratch& sc) {
    const Unit& u = units[u0];
    const int64_t hd = j.c.hd, rows = u.n * u.gh;
    std::fill(sc.lo.begin(), sc.lo.begin() + rows, 0.0f);
    for (size_t k = u0; k < u1; ++k) {
        const float* p = units[k].partial;
        for (int64_t r = 0; r < rows; ++r)
            fold_row(sc.o.data() + r * hd, sc.mo[size_t(r)], sc.lo[size_t(r)], p + r * hd, p[rows * hd + r],
                     p[rows * (hd + 1) + r], hd);
    }
    write_rows(j, u, sc.o.data(), sc.lo.data());
}

// The parts a kv head's query heads are split into: the register blocks the tile math cuts a group into
// (8, 8, ..., 4, 2, 1), so a row's arithmetic (which the block size R does change: the compiler schedules
// each R's loops its own way) is the same split or not. Only in place (nothing converted twice) and when
// there are fewer units than twice the threads.
std::vector<int64_t> head_cuts(int64_t group, bool split) {
    if (!split) return {0, group};
    std::vector<int64_t> cuts{0};
    for (int64_t h = 0; h < group;) {
        h += group - h >= kRows ? kRows : group - h >= 4 ? 4 : group - h >= 2 ? 2 : 1;
        cuts.push_back(h);
    }
    return cuts;
}

// A call's work units, and the row sets split by segment: their units[first .. end), merged after.
struct Plan {
    std::vector<Unit> units;
    std::vector<std::pair<size_t, size_t>> merges;
};

// Enough (run, kv head) pairs for the threads: one unit each, with all its segments. Fewer (decode of a few
// sequences): a unit per segment of each row set (the row sets of one segment stay whole), their partial
// states in a per-calling-thread buffer; when even those are fewer than twice the threads, in-place kv
// heads' query heads are split too.
Plan plan_units(const Job& j, int64_t threads) {
    const int64_t nkv = j.c.nkv, hd = j.c.hd;
    std::vector<std::pair<int64_t, int64_t>> segs;  // per run: first segment, end
    int64_t seg_units = 0;
    for (const auto& [t0, n] : j.runs) {
        segs.emplace_back(j.first_tile(t0) / attn::kSegment, j.positions[t0 + n - 1] / attn::kSegment + 1);
        seg_units += (segs.back().second - segs.back().first) * nkv;
    }
    const bool distribute = int64_t(j.runs.size()) * nkv < 2 * threads;
    const std::vector<int64_t> cuts = head_cuts(j.group, distribute && j.in_place && seg_units < 2 * threads);
    Plan plan;
    size_t partial_floats = 0;
    for (size_t r = 0; r < j.runs.size(); ++r)
        for (int64_t g = 0; g < nkv; ++g)
            for (size_t p = 0; p + 1 < cuts.size(); ++p) {
                const auto [t0, n] = j.runs[r];
                const Unit u{t0, n, g, j.seqs[t0], cuts[p], cuts[p + 1] - cuts[p], segs[r].first, segs[r].second,
                             nullptr};
                if (!distribute || u.s1 - u.s0 == 1) {  // one unit has all of the row set's keys
                    plan.units.push_back(u);
                    continue;
                }
                const size_t begin = plan.units.size();
                for (int64_t sg = u.s0; sg < u.s1; ++sg) {
                    plan.units.push_back(u);
                    plan.units.back().s0 = sg;
                    plan.units.back().s1 = sg + 1;
                    partial_floats += partial_size(u, hd);
                }
                plan.merges.emplace_back(begin, plan.units.size());
            }
    thread_local std::vector<float> partials;
    if (partials.size() < partial_floats) partials.resize(partial_floats);
    size_t at = 0;
    for (const auto& [begin, end] : plan.merges)
        for (size_t k = begin; k < end; ++k) {
            plan.units[k].partial = partials.data() + at;
            at += partial_size(plan.units[k], hd);
        }
    return plan;
}

// The calling thread's scratch, sized for the call (kept between calls: no allocation per layer).
Scratch& thread_scratch(const Job& j) {
    thread_local Scratch sc;
    const int64_t hd = j.c.hd, rows = kRun * j.group;
    sc.q.resize(size_t(rows * hd));
    sc.qb.resize(j.bf16_dot ? sc.q.size() : 0);
    sc.acc.resize(sc.q.size());
    sc.o.resize(sc.q.size());
    for (auto* v : {&sc.m, &sc.lt, &sc.mo, &sc.lo}) v->resize(size_t(rows));
    sc.l.resize(size_t(rows * kTile));
    sc.kt.resize(size_t(hd * kTile));
    sc.v.resize(size_t(kTile * hd));
    sc.s.resize(size_t(kRows * kTile));
    sc.scales.resize(size_t(2 * kTile));
    return sc;
}

}  // namespace

int64_t kv_row_bytes(DType kv, int64_t head_dim) {
    return kv == DType::kI8 ? head_dim + 4 : head_dim * int64_t(dtype_size(kv));
}

void attention(float* out, const float* qkv, void* k_cache, void* v_cache, const int32_t* positions,
               const int32_t* seqs, int64_t m, const AttentionArgs& a, ThreadPool& pool) {
    check_tokens(positions, seqs, m, a);
    const int64_t hd = a.head_dim, nkv = a.n_kv;
    const IsaLevel level = vector_level(detect_isa());
    note_path(KernelFamily::kAttention, level);
    Job j{out, qkv, positions, seqs, a, attn::kv_layout(k_cache, v_cache, a), token_runs(positions, seqs, m), {}};
    attn::store_tokens(j.c, qkv, positions, seqs, m, a);
    j.group = a.n_heads / nkv;
    j.row = (a.n_heads + 2 * nkv) * hd;
    // Caches whose blocks hold whole tiles are read in place (f32, int8, bf16: K tiles as they lie, [hd][B]
    // with row stride B, V rows at their stride). f16 tiles and other block sizes are converted into a
    // per-thread f32 tile first.
    j.in_place = a.block_size % kTile == 0 && a.kv_dtype != DType::kF16;
    j.tiles = attn::tile_kernels(level);
    // (a head dim that is not a multiple of 16 runs the widened math: its queries are not converted for nothing)
    j.bf16_dot = j.in_place && a.kv_dtype == DType::kBF16 && j.tiles.bf16_dot && hd % 16 == 0;
    j.readers = attn::cache_readers(level);
    const Plan plan = plan_units(j, pool.size());
    pool.parallel_for(int64_t(plan.units.size()), [&](int64_t u0, int64_t u1, int) {
        Scratch& sc = thread_scratch(j);
        for (int64_t u = u0; u < u1; ++u) run_unit(j, plan.units[size_t(u)], sc);
    });
    if (!plan.merges.empty())
        pool.parallel_for(int64_t(plan.merges.size()), [&](int64_t g0, int64_t g1, int) {
            Scratch& sc = thread_scratch(j);
            for (int64_t g = g0; g < g1; ++g)
                merge_rows(j, plan.units, plan.merges[size_t(g)].first, plan.merges[size_t(g)].second, sc);
        });
}

}  // namespace lattice::cpu
