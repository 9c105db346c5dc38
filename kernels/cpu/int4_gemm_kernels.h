// Internal interface between int4_gemm.cpp (packing, activation preparation, threading) and the per-ISA
// kernel files (int4_gemm_ref.cpp, _avx2.cpp, _avx512.cpp). Not for use outside them.
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

void w4a16_panels_scalar(const F32Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y,
                         int64_t ldy);
void w4a16_panels_avx2(const F32Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y, int64_t ldy);
void w4a16_panels_avx512(const F32Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y,
                         int64_t ldy);

}  // namespace lattice::int4_detail
