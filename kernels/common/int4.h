// 4-bit weights in groups, the unpacked form every source gives and every backend takes: GGUF Q4_0 / Q4_1
// blocks, AWQ / GPTQ checkpoints and lattice's own quantizer all arrive as an Int4Weights, whatever their file
// layout (runtime/weights undoes it), and a backend packs it for its kernels (kernels/cpu/int4_gemm.h).
//
// Per output channel n, groups of G consecutive stored columns (G = 32, 64 or 128) share an f16 scale d and,
// by kind, an offset:
//   kOffset8    w = (q - 8) d        GGUF Q4_0
//   kZeroPoint  w = (q - z) d        z in 0..16 per group (AWQ / GPTQ zero points; 16 only from GPTQ v1 files,
//                                    which store z - 1 in 4 bits and are read as stored + 1)
//   kAffine     w = q d + m          GGUF Q4_1; GGUF Q4_K (each 32-element sub-block a group: d = f16(d_super * sc),
//                                    m = f16(-dmin * mn), rounded once; runtime/weights/dequant.h); lattice's
//                                    quantizer of float weights
// with q in 0..15, computed in f32 as written (q - 8, q - z and q d are exact: d has 11 significant bits), which
// is gguf-py's arithmetic and the NumPy references' (tests). Stored column c is input channel perm[c] when a
// permutation is given (GPTQ act-order: the channels sorted by group so that groups are contiguous; the
// activations are gathered the same way), else input channel c.
// Nibble order: 16 bytes per 32 stored columns; byte i of block b holds column 32 b + i (low nibble) and
// 32 b + 16 + i (high nibble), GGUF's order. Rows hold k_padded() = round_up(k, G) columns (zero past k).
// K-quant super-blocks beside (Int4Weights::kq): a GGUF Q4_K / Q6_K linear also carries its own 256-column
// super-blocks, rows in order, part after part; the group form above holds the same rows (Q4_K's scales rounded
// to f16, Q6_K re-quantized to 4 bits) for every consumer that does not read K-quants (CUDA, AVX2, W4A16, a
// converted checkpoint); the CPU's W4A8 packs the super-blocks themselves (kernels/cpu/int4_gemm.h), so a load for
// it reads them alone (kquant_only: no group form made only to be dropped).
#pragma once

#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/dtype.h"

namespace lattice {

enum class Int4Kind : uint8_t { kOffset8, kZeroPoint, kAffine };

// Calls f(std::integral_constant<Int4Kind, k>{}) for the run-time kind k: one switch for the kernels'
// per-kind template instances (each ISA's translation unit instantiates its own).
template <class F>
decltype(auto) with_int4_kind(Int4Kind k, F&& f) {
    switch (k) {
        case Int4Kind::kOffset8: return f(std::integral_constant<Int4Kind, Int4Kind::kOffset8>{});
        case Int4Kind::kZeroPoint: return f(std::integral_constant<Int4Kind, Int4Kind::kZeroPoint>{});
        case Int4Kind::kAffine: break;
    }
    return f(std::integral_constant<Int4Kind, Int4Kind::kAffine>{});
}

inline std::string_view int4_kind_name(Int4Kind k) {
    switch (k) {
        case Int4Kind::kOffset8:
            return "offset8";
        case Int4Kind::kZeroPoint:
            return "zero-point";
        case Int4Kind::kAffine:
            return "affine";
    }
    return "?";
}

// Columns per 16-byte nibble block.
inline constexpr int64_t kInt4Block = 32;

// Rows of a linear in GGUF K-quant super-blocks as the file stores them (runtime/weights/dequant.h): type kQ4_K
// (144 bytes per 256 columns) or kQ6_K (210 bytes), `rows` rows of k / 256 blocks each.
struct Int4KQuantPart {
    DType type = DType::kQ4_K;
    int64_t rows = 0;
    std::vector<uint8_t> blocks;
};

// Non-owning view of 4-bit weights [n, k].
struct Int4Matrix {
    int64_t n = 0, k = 0;
    int64_t group = 32;  // 32, 64 or 128
    Int4Kind kind = Int4Kind::kAffine;
    const uint8_t* qs = nullptr;    // [n][k_padded / 2] nibbles (order above)
    const uint16_t* d = nullptr;    // f16 [n][groups]
    const uint16_t* m = nullptr;    // f16 [n][groups], kAffine
    const uint8_t* z = nullptr;     // [n][groups] zero points 0..16, kZeroPoint
    const int32_t* perm = nullptr;  // [k] input channel of each stored column, or null (identity)
    const std::vector<Int4KQuantPart>* kq = nullptr;  // the same rows as K-quant super-blocks, or null / empty
    // kq only, no group form (Int4Weights::kquant_only): only the K-quant layout can pack it.
    bool kquant_only() const { return !qs && kq && !kq->empty(); }
    int64_t k_padded() const { return (k + group - 1) / group * group; }
    int64_t groups() const { return k_padded() / group; }
};

// Owning storage of an Int4Matrix.
struct Int4Weights {
    int64_t n = 0, k = 0, group = 32;
    Int4Kind kind = Int4Kind::kAffine;
    std::vector<uint8_t> qs;
    std::vector<uint16_t> d, m;
    std::vector<uint8_t> z;
    std::vector<int32_t> perm;  // empty: identity
    std::vector<Int4KQuantPart> kq;  // the rows as K-quant super-blocks too (their rows sum to n), or empty
    Int4Weights() = default;
    // Sized and zero-filled for [n, k] in groups of `group` (the caller checks the group; see check_int4_matrix).
    Int4Weights(int64_t n_, int64_t k_, int64_t group_, Int4Kind kind_) : n(n_), k(k_), group(group_), kind(kind_) {
        const int64_t kp = group_ > 0 ? (k_ + group_ - 1) / group_ * group_ : 0, groups = group_ > 0 ? kp / group_ : 0;
        qs.assign(size_t(n_ * kp / 2), 0);
        d.assign(size_t(n_ * groups), 0);
        if (kind_ == Int4Kind::kAffine) m.assign(size_t(n_ * groups), 0);
        if (kind_ == Int4Kind::kZeroPoint) z.assign(size_t(n_ * groups), 0);
    }
    Int4Matrix matrix() const {
        Int4Matrix w;
        w.n = n;
        w.k = k;
        w.group = group;
        w.kind = kind;
        w.qs = qs.empty() ? nullptr : qs.data();
        w.d = d.empty() ? nullptr : d.data();
        w.m = m.empty() ? nullptr : m.data();
        w.z = z.empty() ? nullptr : z.data();
        w.perm = perm.empty() ? nullptr : perm.data();
        w.kq = kq.empty() ? nullptr : &kq;
        return w;
    }
    int64_t k_padded() const { return (k + group - 1) / group * group; }
    int64_t groups() const { return k_padded() / group; }
    // Rows held as K-quant super-blocks only (TensorSource::read_kquant): kq, no group form (qs, d, m empty).
    bool kquant_only() const { return qs.empty() && !kq.empty(); }
    static Int4Weights kquant_rows(int64_t n_, int64_t k_, Int4KQuantPart part) {
        Int4Weights w;
        w.n = n_;
        w.k = k_;
        w.kq.push_back(std::move(part));
        return w;
    }
    // The nibble of stored column c of row r, and setting it.
    uint8_t nibble(int64_t r, int64_t c) const {
        const uint8_t b = qs[size_t(r * (k_padded() / 2) + c / kInt4Block * 16 + c % 16)];
        return c % kInt4Block < 16 ? uint8_t(b & 15) : uint8_t(b >> 4);
    }
    void set_nibble(int64_t r, int64_t c, uint8_t q) {
        uint8_t& b = qs[size_t(r * (k_padded() / 2) + c / kInt4Block * 16 + c % 16)];
        b = c % kInt4Block < 16 ? uint8_t((b & 0xF0) | (q & 15)) : uint8_t((b & 0x0F) | (q << 4));
    }
};

// Dequantized value of stored column `col` (< k_padded) of row `row`, in f32, by the kind's formula.
inline float int4_value(const Int4Matrix& w, int64_t row, int64_t col) {
    const uint8_t b = w.qs[row * (w.k_padded() / 2) + col / kInt4Block * 16 + col % 16];
    const int32_t q = col % kInt4Block < 16 ? (b & 15) : (b >> 4);
    const int64_t gi = row * w.groups() + col / w.group;
    const float d = f16_to_f32(w.d[gi]);
    switch (w.kind) {
        case Int4Kind::kOffset8:
            return float(q - 8) * d;
        case Int4Kind::kZeroPoint:
            return float(q - int32_t(w.z[gi])) * d;
        case Int4Kind::kAffine:
            return float(q) * d + f16_to_f32(w.m[gi]);
    }
    return 0.0f;
}

// All weights dequantized into out [n, k] in input-channel order (through the permutation), f32.
inline void dequantize_int4(const Int4Matrix& w, float* out) {
    for (int64_t r = 0; r < w.n; ++r)
        for (int64_t c = 0; c < w.k; ++c) out[r * w.k + (w.perm ? w.perm[c] : c)] = int4_value(w, r, c);
}

// GGUF Q4_K / Q5_K: the 6-bit scale and minimum of sub-block j (0..7) from a super-block's 12 packed scale
// bytes s: bytes 0..3 hold the scales of sub-blocks 0..3 and bytes 4..7 their minimums in their low 6 bits;
// sub-blocks 4..7 take their low 4 bits from bytes 8..11 (scale low nibble, minimum high nibble) and their
// top 2 bits from the top 2 bits of bytes 0..3 (scales) and 4..7 (minimums). The file's dequantization
// (runtime/weights/dequant_k.cpp) and the CPU's K-quant kernels (kernels/cpu/int4_gemm_kq*.cpp) share it.
inline void q4k_scale_min(const uint8_t* s, int j, int* sc, int* mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
        *mn = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

}  // namespace lattice
