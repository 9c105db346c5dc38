// The W8A8 / s8s8 GEMM on AMX-INT8 tiles (m >= kInt8AmxMinM), on the packed VNNI panels as they are: a panel's
// 64-byte k-group (16 channels x 4 k) is one row of an AMX B tile, so 16 consecutive k-groups (1 KiB) are the B tile
// of 64 k, loaded with a 64-byte stride; A is 16 prepared rows (a + 128 as u8, the avx512 form) x 64 bytes, loaded
// at the rows' stride. A block is 2 x 2 tiles (32 rows x 32 channels, C tiles 0-3, A 4-5, B 6-7: amx_tiles.h);
// the sums - 128 * col_sums go through the epilogue of every path, so the outputs equal the VNNI kernel's bit for bit.
// - k: the full 64-byte blocks straight from the panel; a tail (k_padded % 64) from a zero-padded copy of the
//   panel's last k-groups (the A row's bytes past k_padded meet zeros there); so any k works.
// - m: full 16-row tiles under one configuration, then the rows past the last 16 under a second one whose A and C
//   tiles have that many rows.
// - Rows in chunks of about 1 MiB of A (amx::kChunkBytes) so a chunk stays in L2 while every panel pair of the thread's
//   share passes over it; the pair's B (2 x 64 KiB at k = 4096) stays in L2 across the chunk's row blocks.
// Compiled with the AVX-512 flags (the epilogue's row store is the VNNI kernel's, gemm_avx512.h); AMX implies them.
// Never run on AMX hardware by its author (no machine with AMX was at hand); its indexing, shapes and tails are
// tested on the tile model (amx_tiles.h) on every machine, and against the instructions where AMX is present. Not
// tuned: the blocking above is the textbook one, to be measured against oneDNN (bench_gemm_int8 --isa amx).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/gemm_avx512.h"
#include "kernels/cpu/int8_gemm_kernels.h"

// GCC 12's AVX-512 intrinsics use _mm512_undefined_*() internally and trip a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace lattice::int8_detail {
namespace {

using amx::kTileBytes;
using amx::kTileRows;

// One B tile in a panel: 16 k-groups of 64 bytes (64 k), 1 KiB.
constexpr int64_t kTileB = kTileRows * kTileBytes;
static_assert(kTileBytes == kInt8PanelN * kInt8GroupK, "a panel's k-group is one B tile row");

struct Panels {
    const int8_t* b[2];       // the panels' starts
    const int8_t* tail[2];    // their zero-padded last k block (when k_padded % 64)
    int64_t full_blocks = 0;  // 64-byte k blocks read straight from the panel
};

// Rows [r0, r0 + NR * 16) (or the tail's rows) x panels [p, p + NC): accumulate, store, correct, epilogue.
template <class T, int NR, int NC>
void block(const uint8_t* a, int64_t lda, int64_t r0, int rows, const Panels& pn, const PackedInt8& w, int64_t p,
           const Int8Epilogue& ep) {
    const uint8_t* ar = a + r0 * lda;
    amx::zero_block<T, NR, NC>();
    for (int64_t kb = 0; kb < pn.full_blocks; ++kb) {
        const void* b[2] = {pn.b[0] + kb * kTileB, NC == 2 ? pn.b[1] + kb * kTileB : nullptr};
        amx::step_block<T, NR, NC, false>(ar + kb * kTileBytes, lda, b);
    }
    if (pn.tail[0]) {
        const void* b[2] = {pn.tail[0], pn.tail[1]};
        amx::step_block<T, NR, NC, false>(ar + pn.full_blocks * kTileBytes, lda, b);
    }
    alignas(64) int32_t c[2 * kTileRows][2 * kInt8PanelN];
    amx::store_block<T, NR, NC>(&c[0][0], int64_t(sizeof c[0]));
    for (int pc = 0; pc < NC; ++pc) {
        const __m512i corr = _mm512_slli_epi32(_mm512_loadu_si512(w.col_sums.data() + (p + pc) * kInt8PanelN), 7);
        for (int r = 0; r < NR * rows; ++r)
            avx512::store16(_mm512_sub_epi32(_mm512_load_si512(&c[r][pc * kInt8PanelN]), corr), r0 + r, p + pc, w.n,
                            ep);
    }
}

template <class T>
void s8_panels_tiles(const void* a_in, int64_t m, int64_t lda, const PackedInt8& w, int64_t p0, int64_t p1,
                     const Int8Epilogue& ep) {
    const uint8_t* a = static_cast<const uint8_t*>(a_in);
    const int64_t full = w.k_padded / kTileBytes;
    const int64_t tail_bytes = (w.k_padded % kTileBytes) * kInt8PanelN;  // the panel's last k-groups
    alignas(64) int8_t tails[2][kTileB];
    Panels pn;
    // Per panel pair: its starts, and a zero-padded copy of its last k-groups when k_padded % 64.
    auto setup = [&](int64_t p, int nc) {
        pn = Panels{{w.panel(p), nc == 2 ? w.panel(p + 1) : nullptr}, {nullptr, nullptr}, full};
        if (tail_bytes)
            for (int c = 0; c < nc; ++c) {
                std::memset(tails[c], 0, sizeof tails[c]);
                std::memcpy(tails[c], pn.b[c] + full * kTileB, size_t(tail_bytes));
                pn.tail[c] = tails[c];
            }
    };
    amx::row_chunks<T>(
        m, lda, [](int rows) { return amx::gemm_config(rows); },
        [&](int64_t r0, int64_t r1, int rows) {
            amx::panel_blocks(r0, r1, rows, p0, p1, setup, [&]<int NR, int NC>(int64_t r, int64_t p) {
                block<T, NR, NC>(a, lda, r, rows, pn, w, p, ep);
            });
        });
}

}  // namespace

void s8_panels_amx(const void* a, int64_t m, int64_t lda, const PackedInt8& w, int64_t p0, int64_t p1,
                   const Int8Epilogue& ep) {
    s8_panels_tiles<amx::AmxTiles>(a, m, lda, w, p0, p1, ep);
}

void s8_panels_amx_model(const void* a, int64_t m, int64_t lda, const PackedInt8& w, int64_t p0, int64_t p1,
                         const Int8Epilogue& ep) {
    s8_panels_tiles<amx::TileModel>(a, m, lda, w, p0, p1, ep);
}

}  // namespace lattice::int8_detail
