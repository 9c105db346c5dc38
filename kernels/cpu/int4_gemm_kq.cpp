// Packing of GGUF K-quant super-blocks (Q4_K, Q6_K: Int4Matrix::kq) into the K-quant layout of
// kernels/cpu/int4_gemm.h, and its dequantization. Nothing is rounded: each super-block's bytes per channel
// are the file's (144 for Q4_K, 210 for Q6_K plus 2 bytes of alignment), moved so that the kernels read 16
// channels' nibbles, top bits and scales as vectors. Scalar on purpose (load time). Invariants: k is a multiple
// of 256; every part but the last holds whole panels of 16 rows (kq_packable), so a panel is all one type; rows
// past n are zero (d = 0).
#include <cstring>

#include "base/error.h"
#include "kernels/common/byte_loads.h"
#include "kernels/cpu/int4_gemm.h"
#include "kernels/cpu/int4_gemm_kernels.h"

namespace lattice {

namespace {

constexpr int64_t kSuper = 256;

// GGUF's Q4_K block: d, dmin (f16), 12 scale bytes, then 128 bytes of nibbles: byte 32 p + i holds element i of
// sub-block 2 p in its low nibble and of sub-block 2 p + 1 in its high one. Q6_K: 128 bytes of low nibbles (byte
// 64 h + 32 (s % 2) + i holds element i of sub-block 4 h + s in nibble s / 2), 64 bytes of top bit pairs (byte
// 32 h + i, pair s), 16 int8 scales, d. The packers read them a sub-block at a time (the shifts fixed per
// sub-block), as dequant.h orders the elements.

// Channel j's super-block `src` (Q4_K) into the layout's super-block `out`.
void pack_q4_super(const uint8_t* src, int j, uint8_t* out) {
    for (int g = 0; g < 8; ++g) {
        const uint8_t* qs = src + 16 + (g / 2) * 32;
        const int sh = 4 * (g % 2);
        uint8_t* o = out + int4_detail::kKqQ4Nib + g * 256 + j * 4;
        for (int c = 0; c < 4; ++c)
            for (int t = 0; t < 4; ++t) {
                const int i = 4 * c + t;
                o[c * 64 + t] = uint8_t(((qs[i] >> sh) & 15) | ((qs[16 + i] >> sh) & 15) << 4);
            }
    }
    std::memcpy(out + int4_detail::kKqQ4D + 2 * j, src, 2);
    std::memcpy(out + int4_detail::kKqQ4Dmin + 2 * j, src + 2, 2);
    for (int b = 0; b < 12; ++b) out[int4_detail::kKqQ4Scales + 16 * b + j] = src[4 + b];
}

// Channel j's super-block `src` (Q6_K) into the layout's super-block `out`.
void pack_q6_super(const uint8_t* src, int j, uint8_t* out) {
    for (int g = 0; g < 8; ++g) {
        const int h = g / 4, s = g % 4;
        const uint8_t* ql = src + 64 * h + 32 * (s % 2);
        const uint8_t* qh = src + 128 + 32 * h;
        const int sl = 4 * (s / 2), st = 2 * s;
        uint8_t* grp = out + int4_detail::kKqQ6Nib + int4_detail::kKqQ6Group * g;
        for (int c = 0; c < 4; ++c)
            for (int t = 0; t < 4; ++t) {
                const int i = 4 * c + t;
                const int lo = ((ql[i] >> sl) & 15) | ((qh[i] >> st) & 3) << 4;
                const int hi = ((ql[16 + i] >> sl) & 15) | ((qh[16 + i] >> st) & 3) << 4;
                grp[c * 64 + j * 4 + t] = uint8_t((lo & 15) | (hi & 15) << 4);
                uint8_t& top = grp[256 + (c / 2) * 64 + j * 4 + t];
                const int e = (c % 2) * 2;
                top = uint8_t(top | (lo >> 4) << (2 * e) | (hi >> 4) << (2 * (e + 1)));
            }
    }
    for (int b = 0; b < 16; ++b) out[int4_detail::kKqQ6Scales + 16 * b + j] = src[192 + b];
    std::memcpy(out + int4_detail::kKqQ6D + 2 * j, src + 208, 2);
}

}  // namespace

namespace int4_detail {

bool kq_packable(const Int4Matrix& w) {
    if (!w.kq || w.kq->empty() || w.k % kSuper != 0 || w.perm) return false;
    int64_t rows = 0;
    for (size_t i = 0; i < w.kq->size(); ++i) {
        const Int4KQuantPart& part = (*w.kq)[i];
        if (part.type != DType::kQ4_K && part.type != DType::kQ6_K) return false;
        if (int64_t(part.blocks.size()) != part.rows * (w.k / kSuper) * dtype_block_bytes(part.type)) return false;
        if (i + 1 < w.kq->size() && part.rows % kInt8PanelN != 0) return false;
        rows += part.rows;
    }
    return rows == w.n;
}

void pack_kq(const Int4Matrix& w, PackedInt4& p) {
    const int64_t supers = w.k / kSuper;
    p.kq = true;
    p.panel_at.assign(1, 0);
    for (const Int4KQuantPart& part : *w.kq) {
        const bool q6 = part.type == DType::kQ6_K;
        const int64_t panels = (part.rows + kInt8PanelN - 1) / kInt8PanelN;
        for (int64_t i = 0; i < panels; ++i) {
            p.panel_q6.push_back(q6 ? 1 : 0);
            p.panel_at.push_back(p.panel_at.back() + supers * (q6 ? kKqQ6Bytes : kKqQ4Bytes));
        }
    }
    p.data.assign(size_t(p.panel_at.back()), 0);
    int64_t panel = 0;
    const int64_t bb_all = w.k / kSuper;
    for (const Int4KQuantPart& part : *w.kq) {
        const bool q6 = part.type == DType::kQ6_K;
        const int64_t bb = dtype_block_bytes(part.type);
        for (int64_t r0 = 0; r0 < part.rows; r0 += kInt8PanelN, ++panel)
            for (int64_t sb = 0; sb < bb_all; ++sb) {
                uint8_t* out = p.data.data() + p.panel_at[size_t(panel)] + sb * (q6 ? kKqQ6Bytes : kKqQ4Bytes);
                for (int j = 0; j < kInt8PanelN && r0 + j < part.rows; ++j) {
                    const uint8_t* src = part.blocks.data() + ((r0 + j) * bb_all + sb) * bb;
                    if (q6)
                        pack_q6_super(src, j, out);
                    else
                        pack_q4_super(src, j, out);
                }
            }
    }
}

// Value of column col of channel j in panel p: Q4_K (d sc) q - (dmin mn), Q6_K (d sc) (q - 32), as dequant.h.
float kq_value(const PackedInt4& w, int64_t p, int j, int64_t col) {
    const uint8_t* sb = w.kq_block(p, col / kSuper);
    const int g = int(col % kSuper / 32), i = int(col % 32);
    if (w.panel_q6[size_t(p)]) {
        const float d = f16_to_f32(load_u16(sb + int4_detail::kKqQ6D + 2 * j));
        const auto sc = int8_t(sb[int4_detail::kKqQ6Scales + 16 * (2 * g + i / 16) + j]);
        return (d * float(sc)) * float(int4_detail::kq_q6_value(sb, g, j, i) - 32);
    }
    uint8_t s[12];
    for (int b = 0; b < 12; ++b) s[b] = sb[int4_detail::kKqQ4Scales + 16 * b + j];
    int sc = 0, mn = 0;
    q4k_scale_min(s, g, &sc, &mn);
    const float d = f16_to_f32(load_u16(sb + int4_detail::kKqQ4D + 2 * j));
    const float dmin = f16_to_f32(load_u16(sb + int4_detail::kKqQ4Dmin + 2 * j));
    const uint8_t b = sb[int4_detail::kKqQ4Nib + g * 256 + (i % 16) / 4 * 64 + j * 4 + i % 4];
    const int q = i < 16 ? (b & 15) : (b >> 4);
    return (d * float(sc)) * float(q) - dmin * float(mn);
}

}  // namespace int4_detail
}  // namespace lattice
