// 4-bit weight GEMMs for the CPU backend: W4A8 (4-bit weights x per-token int8 activations, int32 dot
// products per group, then the group's float scale) and W4A16 (4-bit weights dequantized in registers
// against f32 activations), with a scalar reference and AVX2 / AVX-512 VNNI paths chosen at run time.
// The scheme, the exact relation of each result to the dequantized weights, and the measurements:
// docs/quantization.md ("4-bit weights").
//
// Weights: the unpacked form of kernels/common/int4.h (kinds offset8 / zero-point / affine, groups of 32, 64
// or 128, f16 scales, an optional act-order permutation of the input channels, which the fronts apply to the
// activations when they prepare them).
//
// PackedInt4 is the layout the kernels
// stream (prepared once at load). Output channels in panels of 16 (n padded with zero channels), k
// padded to a multiple of G (zero nibbles; activations are zero there). Panel p's groups are
// consecutive blocks of block_bytes, block (p, g) at data + (p * groups + g) * block_bytes:
//   [0, 8G)          nibbles: for each 32-element sub-block s < G / 32 and chunk c < 4, 64 bytes at
//                    s * 256 + c * 64; byte 4 j + t holds channel 16 p + j's elements
//                    32 s' + 4 c + t (low nibble) and 32 s' + 16 + 4 c + t (high nibble), s' = G / 32 * g + s
//   [8G, 8G + 32)    d: f16[16]
//   [8G + 32, +32)   kAffine: m f16[16];  kZeroPoint: z u8[16] then 16 zero bytes;  kOffset8: absent
// A 64-byte chunk's low nibbles are one vpdpbusd operand (16 channels x 4 k, unsigned), its high nibbles
// another; the activations are the signed operand, so there is no +128 correction (docs/quantization.md).
//
// K-quant layout (kq: GGUF Q4_K / Q6_K super-blocks kept at the file's bits, 4.5 and 6.5625 a weight; packed
// from Int4Matrix::kq for W4A8 on the scalar and AVX-512 paths). k is a multiple of 256, group = 32 (the
// activations' groups), each panel is all Q4_K or all Q6_K (panel_q6), its 256-column super-blocks sb at
// data + panel_at[p] + sb * (kKqQ4Bytes | kKqQ6Bytes). Scales come first in a super-block, so a GEMV reads it
// front to back (with the scales after the nibbles the Q4_K GEMV ran at 0.6 of the stream rate from DRAM).
// Group g < 8 of a super-block is sub-block g:
//   Q4_K (2304 B): [0, +32) d f16[16]; [32, +32) dmin f16[16]; [64, +192) the 12 packed scale bytes, byte b of
//     channel j at 64 + 16 b + j (dequant.h: 6-bit sc_g, mn_g); [256 + 256 g, +256) nibbles, the chunk order
//     above (G = 32). w = (d sc_g) q - (dmin mn_g), q in 0..15.
//   Q6_K (3392 B): [0, +32) d f16[16]; [32, +32) zero (keeps every 64-byte load aligned: 212 bytes per channel
//     against the file's 210); [64, +256) int8 scales, the 16-column sub-block b of channel j at 64 + 16 b + j;
//     [320 + 384 g, +256) the low 4 bits of q in the chunk order; [320 + 384 g + 256 + 64 h, +64) their top 2
//     bits for chunks 2h, 2h + 1: byte 4 j + t, bits 2 e .. 2 e + 1 for chunk 2h + e / 2 (e in 0..3), of the
//     low nibble's element (e even) or the high nibble's (e odd). w = (d sc_b) (q - 32), q in 0..63.
// Nothing is rounded: the file's bytes per super-block and channel (144; 210 + 2 of padding), rearranged.
//
// Threads split output panels (N), never K; results do not depend on the thread count. Outputs must not
// alias inputs. The gemm calls keep a thread_local activation scratch of the calling thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "kernels/common/int4.h"
#include "kernels/common/int4_quantize.h"
#include "kernels/cpu/int8_gemm.h"
#include "kernels/cpu/thread_pool.h"

namespace lattice {

// Weights packed for the kernels (layout above).
struct PackedInt4 {
    std::vector<uint8_t, AlignedAllocator64<uint8_t>> data;  // [n_panels][groups][block_bytes]
    int64_t n = 0, k = 0, k_padded = 0, group = 32, groups = 0, n_panels = 0, block_bytes = 0;
    Int4Kind kind = Int4Kind::kAffine;
    IsaLevel isa = IsaLevel::kScalar;  // kernel used by the gemm calls (vector_level of it, isa.h)
    std::vector<int32_t> perm;         // [k] input channel of each stored column (act-order), empty: identity
    bool kq = false;                   // the K-quant layout (above)
    std::vector<int64_t> panel_at;     // kq: byte offset of panel p in data, [n_panels + 1]
    std::vector<uint8_t> panel_q6;     // kq: 1 where panel p is Q6_K, 0 where Q4_K

    const uint8_t* block(int64_t p, int64_t g) const { return data.data() + (p * groups + g) * block_bytes; }
    const uint8_t* kq_block(int64_t p, int64_t sb) const;
    int64_t bytes() const { return int64_t(data.size()); }
};

inline constexpr int64_t kKqQ4Bytes = 2304, kKqQ6Bytes = 3392;

inline const uint8_t* PackedInt4::kq_block(int64_t p, int64_t sb) const {
    return data.data() + panel_at[size_t(p)] + sb * (panel_q6[size_t(p)] ? kKqQ6Bytes : kKqQ4Bytes);
}

// Smallest m whose W4A8 runs on AMX tiles at the amx level (one tile's rows); below it the AVX-512 VNNI kernels.
inline constexpr int64_t kInt4AmxMinM = 16;

// Who runs the W4A8 GEMMs at m >= kInt4AmxMinM at `isa`, in words (lattice doctor).
std::string int4_prefill_kernel(IsaLevel isa);

// Packs w for `isa`. Throws when the CPU cannot run `isa`, k > kInt4MaxK or the matrix is invalid. With
// `kquant` (a W4A8 linear), w's K-quant super-blocks (Int4Matrix::kq) are packed in the K-quant layout when the
// ISA has kernels for it (vector_level scalar or AVX-512) and every part but the last holds whole panels of
// 16 rows; otherwise, and without them, the group form is packed.
PackedInt4 pack_int4_weights(const Int4Matrix& w, IsaLevel isa, bool kquant = false);

// Whether pack_int4_weights keeps a W4A8 linear's K-quant super-blocks on `isa` (vector_level scalar or
// AVX-512: the K-quant layout; AVX2 packs the group form). The memory estimates count bytes by it.
bool int4_kquant_isa(IsaLevel isa);

// The dequantized weights back from the packed layout: out [n, k] f32 in input-channel order
// (dequantize_int4 of the source, bit for bit).
void dequantize_packed_int4(const PackedInt4& w, float* out);

// W4A8: each row of x [m, k] f32 is quantized per group of the weights' G columns (quantize_row_int8 over
// the group: scale s_{r,g}, int8 xq; a per-token scale per group, as llama.cpp's Q8 activation blocks, so an
// outlier channel costs resolution in its own group only), and
//   y[r, c] = acc,  acc = sum over groups g in order of
//     kOffset8:   acc = fma(float(I_g - 8 X_g), d_g * s_g, acc)
//     kZeroPoint: acc = fma(float(I_g - z_g X_g), d_g * s_g, acc)
//     kAffine:    acc = fma(float(I_g), d_g * s_g, acc); acc = fma(m_g * s_g, float(X_g), acc)
// where I_g = sum_{k in g} q xq and X_g = sum_{k in g} xq are exact int32 and the products d_g * s_g,
// m_g * s_g are rounded to f32. Every ISA path performs exactly these float operations, so y is
// bit-identical across paths; in real arithmetic it is sum_k w[c, k] * (xq[r, k] * s_{r,g(k)}) with the
// dequantized weights (q d + m unrounded), within (2 groups + 2) units of roundoff of the terms. y: [m, n].
// The K-quant layout, per group g (32 columns) in order, with D = d sc_g, M = dmin mn_g (exact in f32):
//     Q4_K:       acc = fma(float(I_g), D * s_g, acc); acc = fma(-(M * s_g), float(X_g), acc)
//     Q6_K:       acc = fma(float(sc_a (I_a - 32 X_a) + sc_b (I_b - 32 X_b)), d * s_g, acc)
// where a, b are the group's two 16-column sub-blocks (I, X their sums as above, the int32 sum exact).
// Kernels: vector_level(w.isa)'s (int4_gemm_kernels.h); at the amx level, from kInt4AmxMinM rows, AMX-INT8 tiles
// (int4_gemm_amx_avx512.cpp: the same int32 sums and float operations, so the same bits).
void gemm_w4a8(const float* x, int64_t m, int64_t k, const PackedInt4& w, float* y, ThreadPool& pool);

// W4A16 (weight-only): y[r, c] = sum_k x[r, k] * w[c, k] computed per group as
//   d_g * sum_{k in g} x (q - 8 | q - z)      or      d_g * sum_{k in g} x q + m_g * sum_{k in g} x
// with f32 accumulation whose order differs between ISA paths (and between decode and prefill), so
// paths agree within a rounding bound (tests/kernels/cpu/test_int4_gemm.cpp derives it), not bit for bit.
void gemm_w4a16(const float* x, int64_t m, int64_t k, const PackedInt4& w, float* y, ThreadPool& pool);

}  // namespace lattice
