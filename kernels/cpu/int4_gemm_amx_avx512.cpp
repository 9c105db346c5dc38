// The W4A8 GEMM (int4_gemm.h) on AMX-INT8 tiles, m >= kInt4AmxMinM at the amx level: the group form and the K-quant
// layout. A 64-byte chunk of 32 columns holds, in its low nibbles, k-group 8 gi + c of the 16 channels (byte 4 j + t:
// channel j, k 4 (8 gi + c) + t) and in its high nibbles k-group 8 gi + 4 + c: exactly AMX B tile rows of unsigned
// bytes. A panel pair is unpacked once per chunk of rows into B rows (Q6_K's 4-bit parts joined with their top bits
// first, q in 0..63); the activations are the prepared int8 rows (Int4Acts::q, signed), so tdpbsud (A signed, B
// unsigned) gives each group's exact int32 sums with no correction. Every group ends a tile step (or two): the C
// tiles go to memory and each row's 16 sums take that form's group epilogue of the VNNI kernels (int4_avx512.h) into
// f32 accumulators kept in memory, so the outputs equal the VNNI kernels' (and the scalar references') bit for bit.
// - Tile steps per group (the forms below): the group form's groups of 32 or 64 k one step (A rows of 32 or 64
//   bytes), of 128 two steps into the same C tiles; Q4_K a group of 32 one step; Q6_K two steps of 16 (A rows of 16
//   bytes, B of 4 rows), its sub-blocks a and b stored apart (each has its own scale). A panel is all Q4_K or all
//   Q6_K: each run of one type runs under its own tile configuration.
// - A block is 2 x 2 tiles (32 rows x 32 channels; C tiles 0-3, A 4-5, B 6-7: amx_tiles.h); rows past the last 16
//   run under a second configuration whose A and C tiles have that many rows.
// - Rows in chunks of about 1 MiB of activations, so a chunk stays in L2 while the thread's panel pairs pass over
//   it; the pair's unpacked B (2 x 64 KiB at k = 4096) stays in L2 across the chunk's row blocks.
// Where the time goes (by instruction count, not measured: no AMX at hand): the epilogue's 4-5 vector operations per
// row, panel and group are the VNNI kernels', which spend 8 vpdpbusd beside them; the tiles replace those and the
// nibble unpacking per row block. Groups of 32 use half a tile's k depth (Q6_K a quarter). Never run on AMX hardware
// by its author; its indexing, shapes and tails are tested on the tile model (amx_tiles.h) on every machine with
// AVX-512 VNNI, and against the instructions where AMX is present.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/int4_avx512.h"

// GCC 12's AVX-512 intrinsics use _mm512_undefined_*() internally and trip a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace lattice::int4_detail {
namespace {

using amx::kTileBytes;
using amx::kTileRows;

// Chunk c of a 32-column group: its low nibbles (or Q6_K's sub-block a) are k-group 8 gi + c of the 16 channels,
// its high ones k-group 8 gi + 4 + c (gi: the group's index in 32 columns); as B rows at out + 64 q for k-group q.
inline void store_b_rows(uint8_t* out, int64_t gi, int c, __m512i lo, __m512i hi) {
    _mm512_store_si512(out + (gi * 8 + c) * kTileBytes, lo);
    _mm512_store_si512(out + (gi * 8 + 4 + c) * kTileBytes, hi);
}

inline void store_nibble_rows(uint8_t* out, int64_t gi, int c, const uint8_t* chunk) {
    const __m512i mask = _mm512_set1_epi8(0x0F), v = _mm512_loadu_si512(chunk);
    store_b_rows(out, gi, c, _mm512_and_si512(v, mask), _mm512_and_si512(_mm512_srli_epi16(v, 4), mask));
}

// What differs between the weight forms on the tiles: how a panel becomes B rows, the A bytes of a tile step, how
// many separate int32 sums a group keeps (steps per group = group / step bytes, split evenly among them), and the
// group epilogue (int4_avx512.h) of each row and panel. `setup` runs once per panel group (up to 2 panels).

// The group form of kind K: a group of G = 32, 64 or 128 in steps of min(G, 64) bytes into one sum.
template <Int4Kind K>
struct GroupForm {
    const PackedInt4& w;
    static constexpr int kSplits = 1;
    int64_t group() const { return w.group; }
    int step_bytes() const { return int(std::min<int64_t>(w.group, kTileBytes)); }
    void setup(int64_t p, int nc, uint8_t* const* ub) {
        for (int j = 0; j < nc; ++j)
            for (int64_t g = 0; g < w.groups; ++g)
                for (int64_t s = 0; s < w.group / kInt4Block; ++s)
                    for (int c = 0; c < 4; ++c)
                        store_nibble_rows(ub[j], g * (w.group / kInt4Block) + s, c,
                                          w.block(p + j, g) + s * 256 + c * 64);
    }
    struct Params {
        GroupParams q;
    };
    Params params(int64_t p, int64_t g) const { return {group_params<K>(w.block(p, g), w.group)}; }
    void epilogue(__m512& acc, const Params& q, const int32_t* const* sums, const Int4Acts& a, int64_t at) const {
        group_epilogue<K>(acc, _mm512_load_si512(sums[0]), q.q, a.xsum[at], a.scales[at]);
    }
};

// Q4_K panels: a group of 32 in one step; the D / Mn tables of the panel group precomputed (q4k_panel_tables).
struct Q4kForm {
    const PackedInt4& w;
    std::vector<float, AlignedAllocator64<float>>& tab;
    static constexpr int kSplits = 1;
    int64_t group() const { return kInt4Block; }
    int step_bytes() const { return kInt4Block; }
    int64_t p0 = 0;
    void setup(int64_t p, int nc, uint8_t* const* ub) {
        const int64_t supers = w.k / 256;
        for (int j = 0; j < nc; ++j)
            for (int64_t gi = 0; gi < supers * 8; ++gi)
                for (int c = 0; c < 4; ++c)
                    store_nibble_rows(ub[j], gi, c, w.kq_block(p + j, gi / 8) + kKqQ4Nib + (gi % 8) * 256 + c * 64);
        tab.resize(size_t(2 * supers * 16 * 16));
        q4k_panel_tables(w, p, nc, reinterpret_cast<float(*)[16]>(tab.data()));
        p0 = p;
    }
    struct Params {
        __m512 D, Mn;
    };
    Params params(int64_t p, int64_t gi) const {
        const float* t = tab.data() + (((p - p0) * (w.k / 256) + gi / 8) * 16 + gi % 8) * 16;
        return {_mm512_load_ps(t), _mm512_load_ps(t + 8 * 16)};
    }
    void epilogue(__m512& acc, const Params& q, const int32_t* const* sums, const Int4Acts& a, int64_t at) const {
        q4k_epilogue(acc, _mm512_load_si512(sums[0]), q.D, q.Mn, a.scales[at], a.xsum[at]);
    }
};

// Q6_K panels: q (0..63) joined once per panel group; a group of 32 in two steps of 16, sub-blocks a and b kept
// apart (each has its own scale).
struct Q6kForm {
    const PackedInt4& w;
    static constexpr int kSplits = 2;
    int64_t group() const { return kInt4Block; }
    int step_bytes() const { return kInt4Block / 2; }
    void setup(int64_t p, int nc, uint8_t* const* ub) {
        for (int j = 0; j < nc; ++j)
            for (int64_t gi = 0; gi < w.k / 256 * 8; ++gi) {
                const uint8_t* bg = w.kq_block(p + j, gi / 8) + kKqQ6Nib + (gi % 8) * kKqQ6Group;
                const __m512i h0 = _mm512_loadu_si512(bg + 256), h1 = _mm512_loadu_si512(bg + 320);
                for (int c = 0; c < 4; ++c) {
                    const __m512i h = c < 2 ? h0 : h1;
                    const Q6Pair q = q6_chunk(_mm512_loadu_si512(bg + c * 64), c % 2 ? _mm512_srli_epi16(h, 4) : h);
                    store_b_rows(ub[j], gi, c, q.lo, q.hi);
                }
            }
    }
    struct Params {
        Q6Scales q;
    };
    Params params(int64_t p, int64_t gi) const {
        const uint8_t* sb = w.kq_block(p, gi / 8);
        return {Q6Scales(sb, int(gi % 8), avx512::load_f16x16(sb + kKqQ6D))};
    }
    void epilogue(__m512& acc, const Params& q, const int32_t* const* sums, const Int4Acts& a, int64_t at) const {
        q6k_epilogue(acc, _mm512_load_si512(sums[0]), _mm512_load_si512(sums[1]), q.q, a, at);
    }
};

// Rows [r0, r0 + NR * rows) x panels [p, p + NC) over their B rows ub[c]: per group its tile steps (C stored at the
// end of each split), then the epilogue of every row and panel into f32 accumulators; the outputs stored at the end.
template <class T, class F, int NR, int NC>
void block(const F& f, const Int4Acts& a, int64_t r0, int rows, uint8_t* const* ub, int64_t p, float* y, int64_t ldy) {
    constexpr int S = F::kSplits;
    const int64_t G = f.group(), kb = f.step_bytes(), steps = G / kb / S, groups = f.w.k_padded / G;
    const int nrows = NR * rows;
    const int8_t* ar = a.q + r0 * a.ldq;
    alignas(64) float acc[2 * kTileRows][2 * kInt8PanelN];
    alignas(64) int32_t c[S][2 * kTileRows][2 * kInt8PanelN];
    constexpr int64_t ldc = int64_t(sizeof c[0][0]);
    for (int r = 0; r < nrows; ++r)
        for (int pc = 0; pc < NC; ++pc) _mm512_store_ps(&acc[r][pc * kInt8PanelN], _mm512_setzero_ps());
    for (int64_t g = 0; g < groups; ++g) {
        for (int sp = 0; sp < S; ++sp) {
            amx::zero_block<T, NR, NC>();
            for (int64_t st = 0; st < steps; ++st) {
                const int64_t k0 = g * G + (sp * steps + st) * kb;
                const void* b[2] = {ub[0] + k0 / 4 * kTileBytes, ub[1] + k0 / 4 * kTileBytes};
                amx::step_block<T, NR, NC, true>(ar + k0, a.ldq, b);
            }
            amx::store_block<T, NR, NC>(&c[sp][0][0], ldc);
        }
        for (int pc = 0; pc < NC; ++pc) {
            const typename F::Params q = f.params(p + pc, g);
            for (int r = 0; r < nrows; ++r) {
                float* at = &acc[r][pc * kInt8PanelN];
                const int32_t* sums[S];
                for (int sp = 0; sp < S; ++sp) sums[sp] = &c[sp][r][pc * kInt8PanelN];
                __m512 v = _mm512_load_ps(at);
                f.epilogue(v, q, sums, a, (r0 + r) * a.ldsum + g);
                _mm512_store_ps(at, v);
            }
        }
    }
    for (int pc = 0; pc < NC; ++pc) {
        const __mmask16 mk = avx512::tail_mask(p + pc, f.w.n);
        for (int r = 0; r < nrows; ++r)
            _mm512_mask_storeu_ps(y + (r0 + r) * ldy + (p + pc) * kInt8PanelN, mk,
                                  _mm512_load_ps(&acc[r][pc * kInt8PanelN]));
    }
}

// All m rows x panels [p0, p1) of one form: rows in chunks of about amx::kChunkBytes of activations.
template <class T, class F>
void tiles(F& f, const Int4Acts& a, int64_t m, int64_t p0, int64_t p1, float* y, int64_t ldy) {
    thread_local std::vector<uint8_t, AlignedAllocator64<uint8_t>> buf;
    const size_t panel_bytes = size_t(f.w.k_padded * kInt8PanelN);
    if (buf.size() < 2 * panel_bytes) buf.resize(2 * panel_bytes);
    uint8_t* const ub[2] = {buf.data(), buf.data() + panel_bytes};
    amx::row_chunks<T>(
        m, a.ldq, [&](int rows) { return amx::gemm_config(rows, f.step_bytes()); },
        [&](int64_t r0, int64_t r1, int rows) {
            amx::panel_blocks(
                r0, r1, rows, p0, p1, [&](int64_t p, int nc) { f.setup(p, nc, ub); },
                [&]<int NR, int NC>(int64_t r, int64_t p) { block<T, F, NR, NC>(f, a, r, rows, ub, p, y, ldy); });
        });
}

template <class T>
void group_form(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y, int64_t ldy) {
    with_int4_kind(w.kind, [&](auto kind) {
        GroupForm<kind.value> f{w};
        tiles<T>(f, a, m, p0, p1, y, ldy);
    });
}

// The K-quant layout: each run of consecutive panels of one type under its form (a panel is all Q4_K or all Q6_K).
template <class T>
void kquant(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y, int64_t ldy) {
    thread_local std::vector<float, AlignedAllocator64<float>> tab;
    for (int64_t p = p0; p < p1;) {
        int64_t q = p + 1;
        while (q < p1 && w.panel_q6[size_t(q)] == w.panel_q6[size_t(p)]) ++q;
        if (w.panel_q6[size_t(p)]) {
            Q6kForm f{w};
            tiles<T>(f, a, m, p, q, y, ldy);
        } else {
            Q4kForm f{w, tab};
            tiles<T>(f, a, m, p, q, y, ldy);
        }
        p = q;
    }
}

}  // namespace

void w4a8_panels_amx(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y, int64_t ldy) {
    group_form<amx::AmxTiles>(a, m, w, p0, p1, y, ldy);
}

void w4a8_panels_amx_model(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y,
                           int64_t ldy) {
    group_form<amx::TileModel>(a, m, w, p0, p1, y, ldy);
}

void w4a8_kq_panels_amx(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y,
                        int64_t ldy) {
    kquant<amx::AmxTiles>(a, m, w, p0, p1, y, ldy);
}

void w4a8_kq_panels_amx_model(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y,
                              int64_t ldy) {
    kquant<amx::TileModel>(a, m, w, p0, p1, y, ldy);
}

}  // namespace lattice::int4_detail
