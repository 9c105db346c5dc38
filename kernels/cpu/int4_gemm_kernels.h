// Internal interface between int4_gemm.cpp (packing, activation preparation, threading) and the per-ISA
// kernel files (int4_gemm_ref.cpp, _avx2.cpp, _avx512.cpp, _kq*.cpp, _amx_avx512.cpp). Not for use outside them.
//
// Each *_panels function computes all m rows for output panels [p0, p1) of the packed weights (layout in
// int4_gemm.h) and writes y[r * ldy + c] for the channels c < n of those panels only.
// W4A8 activations (Int4Acts): q int8 [m][ldq] (ldq >= k_padded, zero past k), xsum int32 [m][ldsum]
// (sum of q over each group), scales f32 [m][ldsum] (one per row and group).
// W4A16 activations (F32Acts): x f32 [m][ldx] (ldx >= k_padded, zero past k), xsum f32 [m][ldsum] (sum of x
// over each group, read by kAffine only).
#pragma once

#include <cstdint>

#include "kernels/cpu/int4_gemm.h"

namespace lattice::int4_detail {

struct Int4Acts {
    const int8_t* q = nullptr;
    int64_t ldq = 0;
    const int32_t* xsum = nullptr;
    int64_t ldsum = 0;
    const float* scales = nullptr;  // [m][ldsum]
    const int32_t* xsum16 = nullptr;  // K-quant layout: [m][ldsum], the sum of q over each group's first 16
};

struct F32Acts {
    const float* x = nullptr;
    int64_t ldx = 0;
    const float* xsum = nullptr;
    int64_t ldsum = 0;
};

// Offsets inside a block (int4_gemm.h).
inline int64_t scale_offset(int64_t group) {
    return 8 * group;
}
inline int64_t extra_offset(int64_t group) {
    return 8 * group + 32;
}

void w4a8_panels_scalar(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y,
                        int64_t ldy);
void w4a8_panels_avx2(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y, int64_t ldy);
void w4a8_panels_avx512(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y,
                        int64_t ldy);
// The group form on AMX-INT8 tiles (int4_gemm_amx_avx512.cpp), any m >= 1 (the front sends m >= kInt4AmxMinM at
// the amx level); only where isa_supported(kAmx). The _model form runs the same kernel on the software tile model
// (amx_tiles.h): the tests' way to run it without AMX (AVX-512 VNNI needed, for its epilogue).
void w4a8_panels_amx(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y, int64_t ldy);
void w4a8_panels_amx_model(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y,
                           int64_t ldy);

// K-quant layout (int4_gemm.h): offsets inside a super-block (sub-block g's 6-bit scale and minimum from
// Q4_K's 12 scale bytes: kernels/common/int4.h q4k_scale_min).
inline constexpr int64_t kKqQ4D = 0, kKqQ4Dmin = 32, kKqQ4Scales = 64, kKqQ4Nib = 256;
inline constexpr int64_t kKqQ6Group = 384, kKqQ6D = 0, kKqQ6Scales = 64, kKqQ6Nib = 320;
// q (0..63) of element i (0..31) of group g of channel j in a Q6_K super-block of the layout.
inline int kq_q6_value(const uint8_t* sb, int g, int j, int i) {
    const int c = (i % 16) / 4, t = i % 4, hi = i / 16;
    const uint8_t b = sb[kKqQ6Nib + kKqQ6Group * g + c * 64 + j * 4 + t];
    const uint8_t h = sb[kKqQ6Nib + kKqQ6Group * g + 256 + (c / 2) * 64 + j * 4 + t];
    const int e = (c % 2) * 2 + hi;
    return (hi ? b >> 4 : b & 15) | ((h >> (2 * e)) & 3) << 4;
}

// K-quant packing (int4_gemm_kq.cpp): whether w's super-blocks can take the layout, the packing into p (whose
// n, k, group, groups, n_panels are set), and the dequantized value of column col of channel j of panel p.
bool kq_packable(const Int4Matrix& w);
void pack_kq(const Int4Matrix& w, PackedInt4& p);
float kq_value(const PackedInt4& w, int64_t p, int j, int64_t col);

void w4a8_kq_panels_scalar(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y,
                           int64_t ldy);
void w4a8_kq_panels_avx512(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y,
                           int64_t ldy);
// The K-quant layout on AMX-INT8 tiles (int4_gemm_amx_avx512.cpp; as w4a8_panels_amx): Q4_K panels a group of 32
// a tile step, Q6_K panels two steps of 16 (its sub-blocks' own scales).
void w4a8_kq_panels_amx(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y,
                        int64_t ldy);
void w4a8_kq_panels_amx_model(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y,
                              int64_t ldy);

void w4a16_panels_scalar(const F32Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y,
                         int64_t ldy);
void w4a16_panels_avx2(const F32Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y, int64_t ldy);
void w4a16_panels_avx512(const F32Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y,
                         int64_t ldy);

}  // namespace lattice::int4_detail
