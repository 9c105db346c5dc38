// AMX tiles for the own tile kernels (int8_gemm_amx_avx512.cpp: W8A8 / s8s8; int4_gemm_amx_avx512.cpp: W4A8), in
// two forms with one interface:
//   AmxTiles     the instructions (ldtilecfg, tileloadd, tdpbusd, tdpbsud, tilestored, tilezero, tilerelease) as
//                inline asm: no target attribute is needed, and unlike GCC 12's intrinsics (whose tileloadd and
//                ldtilecfg declare no memory read past the config's first 8 bytes) every statement names the
//                memory it touches, so the compiler cannot move a store to a buffer past the tile load that
//                reads it. Only where isa_supported(kAmx): CPUID, XCR0 and the tile permission. Encodings checked
//                identical to GCC's intrinsics' (objdump of both).
//   TileModel    a software model of the same operations, after the ISA reference's description: per thread,
//                a palette-1 configuration and eight tiles of up to 16 rows x 64 bytes; a load or store moves a
//                tile's configured rows and bytes; tdpbusd (tdpbsud) adds, for every (row of A, column of C), the
//                dot products of A's unsigned (signed) bytes with B's signed (unsigned) bytes four at a time in
//                wrapping int32; a shape the hardware refuses (#UD: an unconfigured tile, A's rows not C's, A's
//                bytes not 4 x B's rows, B's bytes not C's) throws. The tests run the kernels on it on every
//                machine, so their indexing, shapes and tails are checked where no AMX exists; on AMX machines the
//                same tests compare the instructions with it.
// Written by hand: oneDNN (onednn_int8.h) is the other provider of the W8A8 GEMM, but it keeps a second, reordered
// copy of the weights; the int8 kernel reads the packed VNNI panels in place (their 64-byte k-groups are AMX's B
// rows). oneDNN has no W4A8 with a scale per group of 32.
//
// Roles are fixed (a kernel's 2 x 2 block of 16 x 16 int32): C tiles 0-3 (C[r][c] = tile 2r + c), A tiles 4-5
// (rows block r), B tiles 6-7 (panel c). C and B rows are 64 bytes; A rows kTileBytes (or fewer: gemm_config's
// a_bytes, B then a_bytes / 4 rows); a row tail configures A and C with its own row count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "base/error.h"

namespace lattice::amx {

inline constexpr int kTileRows = 16;   // rows of a tile
inline constexpr int kTileBytes = 64;  // bytes of a tile row
inline constexpr int kTiles = 8;

// The 64-byte operand of ldtilecfg, palette 1.
struct alignas(64) TileConfig {
    uint8_t palette = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};  // bytes per row of tile i (i < 8)
    uint8_t rows[16] = {};    // rows of tile i
};
static_assert(sizeof(TileConfig) == 64);

// A GEMM's configuration: C and A tiles `rows` rows (16, or a row tail), A rows `a_bytes` bytes (a multiple of 4,
// <= 64), B tiles a_bytes / 4 rows; C and B rows 64 bytes.
inline TileConfig gemm_config(int rows, int a_bytes = kTileBytes) {
    TileConfig c;
    for (int t = 0; t < kTiles; ++t) {
        c.colsb[t] = uint16_t(t == 4 || t == 5 ? a_bytes : kTileBytes);
        c.rows[t] = uint8_t(t >= 6 ? a_bytes / 4 : rows);
    }
    return c;
}

struct AmxTiles {
    static void configure(const TileConfig& c) { asm volatile("ldtilecfg %0" ::"m"(c) : "memory"); }
    static void release() { asm volatile("tilerelease" ::: "memory"); }

    // A rows block r (tile 4 + r) from `p`, rows `stride` bytes apart.
    template <int R>
    static void load_a(const void* p, int64_t stride) {
        static_assert(R == 0 || R == 1);
        if constexpr (R == 0)
            asm volatile("tileloadd (%0,%1,1), %%tmm4" ::"r"(p), "r"(stride) : "memory");
        else
            asm volatile("tileloadd (%0,%1,1), %%tmm5" ::"r"(p), "r"(stride) : "memory");
    }
    // B of panel c (tile 6 + c): its configured rows (k-groups) of 64 bytes, consecutive.
    template <int C>
    static void load_b(const void* p) {
        static_assert(C == 0 || C == 1);
        const int64_t stride = kTileBytes;
        if constexpr (C == 0)
            asm volatile("tileloadd (%0,%1,1), %%tmm6" ::"r"(p), "r"(stride) : "memory");
        else
            asm volatile("tileloadd (%0,%1,1), %%tmm7" ::"r"(p), "r"(stride) : "memory");
    }
    // C[r][c] += A[r] . B[c], A's bytes unsigned and B's signed (tdpbusd).
    template <int R, int C>
    static void dot() {
        static_assert((R == 0 || R == 1) && (C == 0 || C == 1));
        if constexpr (R == 0 && C == 0) asm volatile("tdpbusd %%tmm6, %%tmm4, %%tmm0" ::: "memory");
        if constexpr (R == 0 && C == 1) asm volatile("tdpbusd %%tmm7, %%tmm4, %%tmm1" ::: "memory");
        if constexpr (R == 1 && C == 0) asm volatile("tdpbusd %%tmm6, %%tmm5, %%tmm2" ::: "memory");
        if constexpr (R == 1 && C == 1) asm volatile("tdpbusd %%tmm7, %%tmm5, %%tmm3" ::: "memory");
    }
    // The same with A's bytes signed and B's unsigned (tdpbsud).
    template <int R, int C>
    static void dot_su() {
        static_assert((R == 0 || R == 1) && (C == 0 || C == 1));
        if constexpr (R == 0 && C == 0) asm volatile("tdpbsud %%tmm6, %%tmm4, %%tmm0" ::: "memory");
        if constexpr (R == 0 && C == 1) asm volatile("tdpbsud %%tmm7, %%tmm4, %%tmm1" ::: "memory");
        if constexpr (R == 1 && C == 0) asm volatile("tdpbsud %%tmm6, %%tmm5, %%tmm2" ::: "memory");
        if constexpr (R == 1 && C == 1) asm volatile("tdpbsud %%tmm7, %%tmm5, %%tmm3" ::: "memory");
    }
    template <int R, int C>
    static void zero_c() {
        if constexpr (R == 0 && C == 0) asm volatile("tilezero %%tmm0" ::: "memory");
        if constexpr (R == 0 && C == 1) asm volatile("tilezero %%tmm1" ::: "memory");
        if constexpr (R == 1 && C == 0) asm volatile("tilezero %%tmm2" ::: "memory");
        if constexpr (R == 1 && C == 1) asm volatile("tilezero %%tmm3" ::: "memory");
    }
    template <int R, int C>
    static void store_c(void* p, int64_t stride) {
        if constexpr (R == 0 && C == 0) asm volatile("tilestored %%tmm0, (%0,%1,1)" ::"r"(p), "r"(stride) : "memory");
        if constexpr (R == 0 && C == 1) asm volatile("tilestored %%tmm1, (%0,%1,1)" ::"r"(p), "r"(stride) : "memory");
        if constexpr (R == 1 && C == 0) asm volatile("tilestored %%tmm2, (%0,%1,1)" ::"r"(p), "r"(stride) : "memory");
        if constexpr (R == 1 && C == 1) asm volatile("tilestored %%tmm3, (%0,%1,1)" ::"r"(p), "r"(stride) : "memory");
    }
};

class TileModel {
public:
    static void configure(const TileConfig& c) {
        State& s = state();
        LATTICE_CHECK(c.palette == 1 && c.start_row == 0, "AMX model: palette {} start row {}", int(c.palette),
                      int(c.start_row));
        for (int t = 0; t < kTiles; ++t) {
            LATTICE_CHECK(c.rows[t] <= kTileRows && c.colsb[t] <= kTileBytes && (c.rows[t] == 0) == (c.colsb[t] == 0),
                          "AMX model: tile {} configured {} rows x {} bytes", t, int(c.rows[t]), int(c.colsb[t]));
            s.tile[t].rows = c.rows[t];
            s.tile[t].colsb = c.colsb[t];
        }
        std::memset(s.data, 0, sizeof s.data);  // ldtilecfg zeroes the tiles
        s.configured = true;
    }
    static void release() {
        State& s = state();
        s.configured = false;
        std::memset(s.data, 0, sizeof s.data);
    }
    template <int R>
    static void load_a(const void* p, int64_t stride) {
        load(4 + R, p, stride);
    }
    template <int C>
    static void load_b(const void* p) {
        load(6 + C, p, kTileBytes);
    }
    template <int R, int C>
    static void dot() {
        dot_bytes(2 * R + C, 4 + R, 6 + C, false);
    }
    template <int R, int C>
    static void dot_su() {
        dot_bytes(2 * R + C, 4 + R, 6 + C, true);
    }
    template <int R, int C>
    static void zero_c() {
        State& s = state();
        need(s, 2 * R + C);
        std::memset(s.data[2 * R + C], 0, sizeof s.data[0]);
    }
    template <int R, int C>
    static void store_c(void* p, int64_t stride) {
        State& s = state();
        const int t = 2 * R + C;
        need(s, t);
        for (int r = 0; r < s.tile[t].rows; ++r)
            std::memcpy(static_cast<uint8_t*>(p) + r * stride, s.data[t][r], s.tile[t].colsb);
    }

private:
    struct Shape {
        int rows = 0, colsb = 0;
    };
    struct State {
        bool configured = false;
        Shape tile[kTiles];
        uint8_t data[kTiles][kTileRows][kTileBytes];
    };
    static State& state() {
        thread_local State s;
        return s;
    }
    static void need(const State& s, int t) {
        LATTICE_CHECK(s.configured && s.tile[t].rows > 0, "AMX model: tile {} used unconfigured", t);
    }
    static void load(int t, const void* p, int64_t stride) {
        State& s = state();
        need(s, t);
        std::memset(s.data[t], 0, sizeof s.data[0]);  // rows and bytes past the shape read as zero
        for (int r = 0; r < s.tile[t].rows; ++r)
            std::memcpy(s.data[t][r], static_cast<const uint8_t*>(p) + r * stride, s.tile[t].colsb);
    }
    // tdpbusd c, a, b: c[m][n] += sum over k < a.colsb / 4, i < 4 of u8 a[m][4k + i] * s8 b[k][4n + i], mod 2^32;
    // tdpbsud (a_signed): s8 a times u8 b.
    static void dot_bytes(int c, int a, int b, bool a_signed) {
        State& s = state();
        need(s, c);
        need(s, a);
        need(s, b);
        const Shape &sc = s.tile[c], &sa = s.tile[a], &sb = s.tile[b];
        LATTICE_CHECK(sa.rows == sc.rows && sa.colsb == 4 * sb.rows && sb.colsb == sc.colsb && sc.colsb % 4 == 0,
                      "AMX model: {} of C {}x{}, A {}x{}, B {}x{} (bytes): the hardware's #UD",
                      a_signed ? "tdpbsud" : "tdpbusd", sc.rows, sc.colsb, sa.rows, sa.colsb, sb.rows, sb.colsb);
        for (int m = 0; m < sc.rows; ++m)
            for (int n = 0; n < sc.colsb / 4; ++n) {
                uint32_t acc;
                std::memcpy(&acc, &s.data[c][m][4 * n], 4);
                for (int k = 0; k < sa.colsb / 4; ++k)
                    for (int i = 0; i < 4; ++i) {
                        const uint8_t x = s.data[a][m][4 * k + i], y = s.data[b][k][4 * n + i];
                        const int32_t xa = a_signed ? int32_t(int8_t(x)) : int32_t(x);
                        const int32_t yb = a_signed ? int32_t(y) : int32_t(int8_t(y));
                        acc += uint32_t(xa * yb);
                    }
                std::memcpy(&s.data[c][m][4 * n], &acc, 4);
            }
    }
};

// ---- What both tile kernels do with a block and with the rows, for tiles T (AmxTiles or TileModel) ----

// Rows of A per chunk: about 1 MiB, so a chunk stays in L2 while a thread's panel pairs pass over it.
inline constexpr int64_t kChunkBytes = int64_t(1) << 20;

// The block's NR x NC C tiles (each 1 or 2) set to zero.
template <class T, int NR, int NC>
inline void zero_block() {
    T::template zero_c<0, 0>();
    if constexpr (NC == 2) T::template zero_c<0, 1>();
    if constexpr (NR == 2) T::template zero_c<1, 0>();
    if constexpr (NR == 2 && NC == 2) T::template zero_c<1, 1>();
}

// One k step of the block: A's row tiles from a (rows lda bytes apart; the second tile 16 rows on), B of panel c
// from b[c]; tdpbusd (A unsigned, B signed) or, with kSignedA, tdpbsud (A signed, B unsigned).
template <class T, int NR, int NC, bool kSignedA>
inline void step_block(const void* a, int64_t lda, const void* const* b) {
    T::template load_a<0>(a, lda);
    if constexpr (NR == 2) T::template load_a<1>(static_cast<const uint8_t*>(a) + kTileRows * lda, lda);
    T::template load_b<0>(b[0]);
    if constexpr (NC == 2) T::template load_b<1>(b[1]);
    auto dot = []<int R, int C>() {
        if constexpr (kSignedA)
            T::template dot_su<R, C>();
        else
            T::template dot<R, C>();
    };
    dot.template operator()<0, 0>();
    if constexpr (NC == 2) dot.template operator()<0, 1>();
    if constexpr (NR == 2) dot.template operator()<1, 0>();
    if constexpr (NR == 2 && NC == 2) dot.template operator()<1, 1>();
}

// The block's C tiles to c: int32 rows ldc bytes apart, tile (r, c) at row 16 r, column 16 c.
template <class T, int NR, int NC>
inline void store_block(int32_t* c, int64_t ldc) {
    const int64_t row = ldc / int64_t(sizeof(int32_t));
    T::template store_c<0, 0>(c, ldc);
    if constexpr (NC == 2) T::template store_c<0, 1>(c + kTileBytes / 4, ldc);
    if constexpr (NR == 2) T::template store_c<1, 0>(c + kTileRows * row, ldc);
    if constexpr (NR == 2 && NC == 2) T::template store_c<1, 1>(c + kTileRows * row + kTileBytes / 4, ldc);
}

// Rows [0, m) of A (rows lda bytes apart) in tiles: the full 16-row tiles under config(16), in chunks of about
// kChunkBytes (a multiple of 32 rows), then the rows past the last 16 under config(that many); rows(r0, r1,
// tile_rows) runs each range. The tiles are released at the end.
template <class T, class Config, class Rows>
inline void row_chunks(int64_t m, int64_t lda, Config config, Rows rows) {
    const int64_t full_rows = m / kTileRows * kTileRows;
    const int64_t chunk = std::max<int64_t>(2 * kTileRows, kChunkBytes / lda / (2 * kTileRows) * (2 * kTileRows));
    if (full_rows > 0) {
        T::configure(config(kTileRows));
        for (int64_t r = 0; r < full_rows; r += chunk) rows(r, std::min(full_rows, r + chunk), kTileRows);
    }
    if (m > full_rows) {
        const int tail = int(m - full_rows);
        T::configure(config(tail));
        rows(full_rows, m, tail);
    }
    T::release();
}

// Rows [r0, r1) (whole 16-row tiles when tile_rows == 16, else one tail of that many rows) x the panel pairs of
// [p0, p1): setup(p, nc) once per pair (nc = 2, or 1 for a last odd panel), then block.template operator()<NR,
// NC>(r, p) for each block of NR row tiles (2 while 32 rows remain).
template <class Setup, class Block>
inline void panel_blocks(int64_t r0, int64_t r1, int tile_rows, int64_t p0, int64_t p1, Setup setup, Block block) {
    for (int64_t p = p0; p < p1; p += 2) {
        const int nc = p + 1 < p1 ? 2 : 1;
        setup(p, nc);
        for (int64_t r = r0; r < r1;) {
            const bool two = tile_rows == kTileRows && r + 2 * kTileRows <= r1;
            if (two && nc == 2)
                block.template operator()<2, 2>(r, p);
            else if (two)
                block.template operator()<2, 1>(r, p);
            else if (nc == 2)
                block.template operator()<1, 2>(r, p);
            else
                block.template operator()<1, 1>(r, p);
            r += two ? 2 * kTileRows : kTileRows;
        }
    }
}

}  // namespace lattice::amx
