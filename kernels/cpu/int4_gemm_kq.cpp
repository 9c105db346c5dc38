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

// Element e (0..255) of a Q6_K block (dequant.h's order): q in 0..63.
int q6_of(const uint8_t* blk, int e) {
    const int h = e / 128, r = e % 128;
    const int lo = (blk[64 * h + r % 64] >> (4 * (r / 64))) & 15;
    const int hi = (blk[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
    return lo | hi << 4;
}

// Element e of a Q4_K block: q in 0..15.
int q4_of(const uint8_t* blk, int e) {
    const int j = e / 32, t = e % 32;
    const uint8_t b = blk[16 + (j / 2) * 32 + t];
    return j % 2 == 0 ? b & 15 : b >> 4;
}

// Channel j's super-block `src` (Q4_K) into the layout's super-block `out`.
void pack_q4_super(const uint8_t* src, int j, uint8_t* out) {
    for (int g = 0; g < 8; ++g)
        for (int c = 0; c < 4; ++c)
            for (int t = 0; t < 4; ++t)
                out[int4_detail::kKqQ4Nib + g * 256 + c * 64 + j * 4 + t] =
                    uint8_t(q4_of(src, 32 * g + 4 * c + t) | q4_of(src, 32 * g + 16 + 4 * c + t) << 4);
    std::memcpy(out + int4_detail::kKqQ4D + 2 * j, src, 2);
    std::memcpy(out + int4_detail::kKqQ4Dmin + 2 * j, src + 2, 2);
    for (int b = 0; b < 12; ++b) out[int4_detail::kKqQ4Scales + 16 * b + j] = src[4 + b];
}

// Channel j's super-block `src` (Q6_K) into the layout's super-block `out`.
void pack_q6_super(const uint8_t* src, int j, uint8_t* out) {
    for (int g = 0; g < 8; ++g) {
        uint8_t* grp = out + int4_detail::kKqQ6Nib + int4_detail::kKqQ6Group * g;
        for (int c = 0; c < 4; ++c)
            for (int t = 0; t < 4; ++t) {
                const int lo = q6_of(src, 32 * g + 4 * c + t), hi = q6_of(src, 32 * g + 16 + 4 * c + t);
                grp[c * 64 + j * 4 + t] = uint8_t((lo & 15) | (hi & 15) << 4);
                uint8_t& h = grp[256 + (c / 2) * 64 + j * 4 + t];
                const int e = (c % 2) * 2;
                h = uint8_t(h | (lo >> 4) << (2 * e) | (hi >> 4) << (2 * (e + 1)));
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
