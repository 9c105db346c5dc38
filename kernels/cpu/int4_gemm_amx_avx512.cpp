// The W4A8 GEMM of the group form (int4_gemm.h) on AMX-INT8 tiles, m >= kInt4AmxMinM at the amx level. A panel
// pair's nibbles are unpacked once (per chunk of rows) into AMX B rows: a 64-byte chunk of a block holds, in its
// low nibbles, k-group 8 s + c of the 16 channels (byte 4 j + t: channel j, k 4 (8 s + c) + t) and in its high
// nibbles k-group 8 s + 4 + c, which is exactly a B tile row of unsigned bytes. The activations are the prepared
// int8 rows (Int4Acts::q, signed), so tdpbsud (A signed, B unsigned) gives each group's exact int32 sums with no
// correction. A group ends every tile step: the C tiles go to memory and each row's 16 sums take the group
// epilogue of the VNNI kernel (int4_avx512.h) into f32 accumulators kept in memory, so the outputs equal the VNNI
// kernel's (and the scalar reference's) bit for bit.
// - A tile step is one group of 32 or 64 k (A rows of 32 or 64 bytes, B of 8 or 16 rows); a group of 128 is two
//   steps into the same C tiles before its epilogue.
// - A block is 2 x 2 tiles (32 rows x 32 channels; C tiles 0-3, A 4-5, B 6-7: amx_tiles.h); rows past the last 16
//   run under a second configuration whose A and C tiles have that many rows.
// - Rows in chunks of about 1 MiB of activations, so a chunk stays in L2 while the thread's panel pairs pass over
//   it; the pair's unpacked B (2 x 64 KiB at k = 4096) stays in L2 across the chunk's row blocks.
// Where the time goes (by instruction count, not measured: no AMX at hand): the epilogue's 4-5 vector operations per
// row, panel and group are the same as the VNNI kernel's, which spends 8 vpdpbusd beside them; the tiles replace
// those and the nibble unpacking per row block. The K-quant layout (Q4_K / Q6_K, sub-blocks of 16 in Q6_K) stays on
// the VNNI kernel. Never run on AMX hardware by its author; its indexing, shapes and tails are tested on the tile
// model (amx_tiles.h) on every machine with AVX-512 VNNI, and against the instructions where AMX is present.
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

constexpr int64_t kChunkBytes = int64_t(1) << 20;

// Panel p's nibbles as B rows: k-group q (k = 4 q .. 4 q + 3) of its 16 channels at out + 64 q, k_padded / 4 rows.
void unpack_panel(const PackedInt4& w, int64_t p, uint8_t* out) {
    const __m512i mask = _mm512_set1_epi8(0x0F);
    const int64_t subs = w.group / kInt4Block;
    for (int64_t g = 0; g < w.groups; ++g) {
        const uint8_t* bg = w.block(p, g);
        for (int64_t s = 0; s < subs; ++s)
            for (int c = 0; c < 4; ++c) {
                const __m512i v = _mm512_loadu_si512(bg + s * 256 + c * 64);
                const int64_t q = (g * w.group + s * kInt4Block) / 4 + c;
                _mm512_store_si512(out + q * kTileBytes, _mm512_and_si512(v, mask));
                _mm512_store_si512(out + (q + 4) * kTileBytes, _mm512_and_si512(_mm512_srli_epi16(v, 4), mask));
            }
    }
}

// Rows [r0, r0 + NR * rows) x panels [p, p + NC) over their unpacked B rows ub[c]: per group the tile steps, then
// the epilogue of every row and panel; the rows' outputs stored at the end.
template <class T, Int4Kind K, int NR, int NC>
void block(const Int4Acts& a, int64_t r0, int rows, uint8_t* const* ub, const PackedInt4& w, int64_t p, float* y,
           int64_t ldy) {
    const int64_t G = w.group, kb = std::min<int64_t>(G, kTileBytes);
    const int nrows = NR * rows;
    const int8_t* ar = a.q + r0 * a.ldq;
    alignas(64) float acc[2 * kTileRows][2 * kInt8PanelN];
    alignas(64) int32_t c[2 * kTileRows][2 * kInt8PanelN];
    constexpr int64_t ldc = int64_t(sizeof c[0]);
    for (int r = 0; r < nrows; ++r)
        for (int pc = 0; pc < NC; ++pc) _mm512_store_ps(&acc[r][pc * kInt8PanelN], _mm512_setzero_ps());
    for (int64_t g = 0; g < w.groups; ++g) {
        T::template zero_c<0, 0>();
        if constexpr (NC == 2) T::template zero_c<0, 1>();
        if constexpr (NR == 2) T::template zero_c<1, 0>();
        if constexpr (NR == 2 && NC == 2) T::template zero_c<1, 1>();
        for (int64_t k0 = g * G; k0 < (g + 1) * G; k0 += kb) {
            T::template load_a<0>(ar + k0, a.ldq);
            if constexpr (NR == 2) T::template load_a<1>(ar + kTileRows * a.ldq + k0, a.ldq);
            T::template load_b<0>(ub[0] + k0 / 4 * kTileBytes);
            if constexpr (NC == 2) T::template load_b<1>(ub[1] + k0 / 4 * kTileBytes);
            T::template dot_su<0, 0>();
            if constexpr (NC == 2) T::template dot_su<0, 1>();
            if constexpr (NR == 2) T::template dot_su<1, 0>();
            if constexpr (NR == 2 && NC == 2) T::template dot_su<1, 1>();
        }
        T::template store_c<0, 0>(&c[0][0], ldc);
        if constexpr (NC == 2) T::template store_c<0, 1>(&c[0][kInt8PanelN], ldc);
        if constexpr (NR == 2) T::template store_c<1, 0>(&c[kTileRows][0], ldc);
        if constexpr (NR == 2 && NC == 2) T::template store_c<1, 1>(&c[kTileRows][kInt8PanelN], ldc);
        for (int pc = 0; pc < NC; ++pc) {
            const GroupParams q = group_params<K>(w.block(p + pc, g), G);
            for (int r = 0; r < nrows; ++r) {
                float* at = &acc[r][pc * kInt8PanelN];
                __m512 v = _mm512_load_ps(at);
                const int64_t i = (r0 + r) * a.ldsum + g;
                group_epilogue<K>(v, _mm512_load_si512(&c[r][pc * kInt8PanelN]), q, a.xsum[i], a.scales[i]);
                _mm512_store_ps(at, v);
            }
        }
    }
    for (int pc = 0; pc < NC; ++pc) {
        const __mmask16 mk = avx512::tail_mask(p + pc, w.n);
        for (int r = 0; r < nrows; ++r)
            _mm512_mask_storeu_ps(y + (r0 + r) * ldy + (p + pc) * kInt8PanelN, mk,
                                  _mm512_load_ps(&acc[r][pc * kInt8PanelN]));
    }
}

// Rows [r0, r1) x the thread's panels [p0, p1): whole 16-row tiles (rows == 16), or one tail of r1 - r0 = rows < 16.
template <class T, Int4Kind K>
void rows_over_panels(const Int4Acts& a, int64_t r0, int64_t r1, int rows, const PackedInt4& w, int64_t p0, int64_t p1,
                      uint8_t* const* ub, float* y, int64_t ldy) {
    for (int64_t p = p0; p < p1; p += 2) {
        const int nc = p + 1 < p1 ? 2 : 1;
        for (int c = 0; c < nc; ++c) unpack_panel(w, p + c, ub[c]);
        for (int64_t r = r0; r < r1;) {
            const bool two = rows == kTileRows && r + 2 * kTileRows <= r1;
            if (two && nc == 2)
                block<T, K, 2, 2>(a, r, rows, ub, w, p, y, ldy);
            else if (two)
                block<T, K, 2, 1>(a, r, rows, ub, w, p, y, ldy);
            else if (nc == 2)
                block<T, K, 1, 2>(a, r, rows, ub, w, p, y, ldy);
            else
                block<T, K, 1, 1>(a, r, rows, ub, w, p, y, ldy);
            r += two ? 2 * kTileRows : kTileRows;
        }
    }
}

template <class T, Int4Kind K>
void w4a8_tiles(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y, int64_t ldy) {
    thread_local std::vector<uint8_t, AlignedAllocator64<uint8_t>> buf;
    const size_t panel_bytes = size_t(w.k_padded * kInt8PanelN);
    if (buf.size() < 2 * panel_bytes) buf.resize(2 * panel_bytes);
    uint8_t* const ub[2] = {buf.data(), buf.data() + panel_bytes};
    const int a_bytes = int(std::min<int64_t>(w.group, kTileBytes));
    const int64_t full_rows = m / kTileRows * kTileRows;
    const int64_t chunk = std::max<int64_t>(2 * kTileRows, kChunkBytes / a.ldq / (2 * kTileRows) * (2 * kTileRows));
    if (full_rows > 0) {
        T::configure(amx::gemm_config(kTileRows, a_bytes));
        for (int64_t r = 0; r < full_rows; r += chunk)
            rows_over_panels<T, K>(a, r, std::min(full_rows, r + chunk), kTileRows, w, p0, p1, ub, y, ldy);
    }
    if (m > full_rows) {
        const int rows = int(m - full_rows);
        T::configure(amx::gemm_config(rows, a_bytes));
        rows_over_panels<T, K>(a, full_rows, m, rows, w, p0, p1, ub, y, ldy);
    }
    T::release();
}

}  // namespace

void w4a8_panels_amx(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y, int64_t ldy) {
    with_int4_kind(w.kind, [&](auto kind) { w4a8_tiles<amx::AmxTiles, kind.value>(a, m, w, p0, p1, y, ldy); });
}

void w4a8_panels_amx_model(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y,
                           int64_t ldy) {
    with_int4_kind(w.kind, [&](auto kind) { w4a8_tiles<amx::TileModel, kind.value>(a, m, w, p0, p1, y, ldy); });
}

}  // namespace lattice::int4_detail
