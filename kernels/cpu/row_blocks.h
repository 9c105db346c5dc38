// Row blocks of the GEMM register tiles, shared by every per-ISA kernel file: a tile is a template over its
// row count MR (a compile-time constant, so its accumulators stay in registers); the rows of a call are cut
// into blocks of MRMAX rows and the last block, of fewer rows, runs the tile instantiated for exactly them.
// ISA-neutral templates only (no intrinsics): each kernel file instantiates them with its own tile lambda.
#pragma once

#include <cstdint>

namespace lattice {

// tile.template operator()<MR>(r0) for MR == rem (1 <= rem <= MRMAX).
template <int MRMAX, class Tile>
[[gnu::always_inline]] inline void row_block(int rem, int64_t r0, Tile& tile) {
    if (rem == MRMAX) {
        tile.template operator()<MRMAX>(r0);
    } else if constexpr (MRMAX > 1) {
        row_block<MRMAX - 1>(rem, r0, tile);
    }
}

// Rows [0, m) in blocks of MRMAX: tile<MRMAX>(r0) for each full block, tile<m % MRMAX>(r0) for the rest.
// tile: a generic lambda, [&]<int MR>(int64_t r0) { ... }.
template <int MRMAX, class Tile>
[[gnu::always_inline]] inline void for_row_blocks(int64_t m, Tile&& tile) {
    for (int64_t r0 = 0; r0 < m; r0 += MRMAX) row_block<MRMAX>(int(m - r0 < MRMAX ? m - r0 : MRMAX), r0, tile);
}

}  // namespace lattice
