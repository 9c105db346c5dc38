// Internal interface of the CPU attention (kernels/cpu/attention*.cpp; the op is cpu::attention in ops.h):
//   attention.cpp          the op: checks, storing the step's K/V, work units, the tile walk of each unit
//   attention_kernels.cpp  the tile math (scores, online softmax, weighted V) per ISA variant
//   attention_cache.cpp    the paged cache's rows: storing a token, reading rows and K tiles as f32
// The layouts and the reasons for them are attention.cpp's header.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "base/dtype.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"

namespace lattice::cpu::attn {

constexpr int64_t kTile = 16;  // key positions per tile; a tile never straddles a block when block_size % 16 == 0
constexpr int64_t kRun = 16;   // query tokens per work unit
// Key positions per segment (a multiple of kTile, aligned to position 0): each row's online softmax restarts
// at every segment and the segments are folded in order (attention.cpp), so that one sequence's keys can be
// split among threads at segment bounds without a row's arithmetic depending on the split.
constexpr int64_t kSegment = 256;
// Query rows per register block of the tile math (attention_kernels.cpp): every K and V element loaded
// serves up to kRows rows.
constexpr int kRows = 8;

// How a tile's elements are read: f32 as they are; int8 (converted exactly, the row scales applied to the
// scores and the weights); bf16 (exactly, by a shift).
enum class Elem { kF32, kI8, kBF16 };
template <Elem E>
using ElemT = std::conditional_t<E == Elem::kF32, float, std::conditional_t<E == Elem::kI8, int8_t, uint16_t>>;

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
    float softcap = 0.0f;  // AttentionArgs::softcap: scores become softcap * tanh(score / softcap); 0: none
    // The next tile's K and V (laid out as k and v, at the same strides), requested into L2 a line at a time
    // while this tile's math runs (decode; null: none); its first next_v_rows V rows.
    const ElemT<E>* next_k = nullptr;
    const ElemT<E>* next_v = nullptr;
    int64_t next_v_rows = 0;
    // bf16 tiles under the bf16-dot math (TileKernels::bf16_dot): the rows' queries rounded to bf16, row r at
    // qb + r * hd (the f32 q the kernel also gets is then used only where that math does not apply).
    const uint16_t* qb = nullptr;
};

// One tile for `rows` query rows (consecutive in q, acc, m; l holds kTile floats a row) that share the tile's
// keys [lo, valid): scores, online softmax (running max m, kept lazily: moved only where a score exceeds it
// by more than e^8; running sum l as kTile lanes, summed by the caller at the segment's end; rescaled
// accumulator acc), weighted V rows. s holds kRows x kTile floats of scratch.
template <Elem E>
using TileRowsFn = void (*)(float* acc, float* m, float* l, float* s, const float* q, const Tile<E>& t, int64_t lo,
                            int64_t valid, int64_t hd, int64_t rows);
struct TileKernels {
    TileRowsFn<Elem::kF32> f32;
    TileRowsFn<Elem::kI8> i8;
    TileRowsFn<Elem::kBF16> bf16;
    // Whether `bf16` is the bf16-dot math: at the avx512 level on a CPU with AVX512_BF16 (Zen 4, Cooper Lake,
    // Sapphire Rapids), a bf16 cache's tiles run q . k and p . v as vdpbf16ps, bf16 pairs multiplied and summed
    // into f32 (the queries and the softmax weights rounded to bf16 for it, as a bf16 GPU kernel does; the
    // running max, the sums and the accumulators stay f32), half the instructions of widening every element
    // to f32. Tiles carry the queries in bf16 then (Tile::qb). Elsewhere bf16 tiles are widened exactly and
    // run the f32 math. Head dims that are not a multiple of 16 run the widened math everywhere.
    bool bf16_dot = false;
};
// The variant for a level (vector_level of it); the bf16-dot math where that level and the CPU have it.
TileKernels tile_kernels(IsaLevel isa);

// Where the step's cache rows lie. Block b's bytes start at b * B * nkv * rb; an int8 block's scales follow
// its values. V rows: position p, kv head g at row g * B + p % B. K: kv head g's [hd][B] elements
// (transposed), element d of position p at (g * hd + d) * B + p % B. int8 scales: position p, kv head g
// at (p % B) * nkv + g, for K and V.
struct KvLayout {
    uint8_t* k_cache;
    uint8_t* v_cache;
    const int32_t* block_tables;
    int64_t table_width, B, nkv, hd, rb;
    int64_t es;      // bytes per element
    int64_t values;  // bytes of a row's values (hd * es)

    uint8_t* block_of(uint8_t* c, int64_t seq, int64_t pos) const {
        return c + int64_t(block_tables[seq * table_width + pos / B]) * B * nkv * rb;
    }
    uint8_t* v_row(int64_t seq, int64_t pos, int64_t g) const {
        return block_of(v_cache, seq, pos) + (g * B + pos % B) * values;
    }
    uint8_t* k_column(int64_t seq, int64_t pos, int64_t g) const {  // element d at + d * B * es
        return block_of(k_cache, seq, pos) + (g * hd * B + pos % B) * es;
    }
    float* row_scale(uint8_t* c, int64_t seq, int64_t pos, int64_t g) const {
        return reinterpret_cast<float*>(block_of(c, seq, pos) + B * nkv * hd) + (pos % B) * nkv + g;
    }
};
KvLayout kv_layout(void* k_cache, void* v_cache, const AttentionArgs& a);

// Stores the k and v heads of tokens [0, m) (rows of qkv) in their blocks, converted or quantized.
void store_tokens(const KvLayout& c, const float* qkv, const int32_t* positions, const int32_t* seqs, int64_t m,
                  const AttentionArgs& a);

// Cache readers for tiles that are not read in place. load_row: a cache row as hd floats (an int8 row times
// its scale at *scale_src). load_k_tile: a K tile of a block (its first column at kc, K row d at
// kc + d * stride bytes) as f32 kt[d][kTile], lanes jn .. kTile - 1 zero, int8 column j times scales[j].
struct CacheReaders {
    void (*load_row)(float* out, const uint8_t* src, const uint8_t* scale_src, int64_t hd, DType dt);
    void (*load_k_tile)(float* kt, const uint8_t* kc, int64_t stride, const float* scales, int64_t jn, int64_t hd,
                        DType dt);
};
CacheReaders cache_readers(IsaLevel isa);
// One cache element as a float (int8 times `scale`).
float load_element(const uint8_t* src, float scale, DType dt);

}  // namespace lattice::cpu::attn
