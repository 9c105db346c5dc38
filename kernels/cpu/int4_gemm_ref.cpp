// Scalar reference paths of the 4-bit GEMMs, reading the same packed layout as the SIMD paths
// (int4_gemm.h). Plain loops; the W4A8 one performs exactly the float operations int4_gemm.h specifies
// (per group in group order: the products of the weight and activation scales, std::fma), which every
// SIMD path must match bit for bit.
#include <cmath>
#include <cstring>

#include "base/dtype.h"
#include "kernels/common/byte_loads.h"
#include "kernels/cpu/int4_gemm_kernels.h"

namespace lattice::int4_detail {

namespace {

// Zero point of channel j in a block (kOffset8: 8; kAffine: 0, unused).
int32_t zero_point(const PackedInt4& w, const uint8_t* blk, int j) {
    if (w.kind == Int4Kind::kOffset8) return 8;
    if (w.kind == Int4Kind::kZeroPoint) return blk[extra_offset(w.group) + j];
    return 0;
}

}  // namespace

void w4a8_panels_scalar(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y,
                        int64_t ldy) {
    const int64_t G = w.group, subs = G / kInt4Block;
    for (int64_t p = p0; p < p1; ++p) {
        const int64_t j0 = p * kInt8PanelN;
        const int64_t cnt = w.n - j0 < kInt8PanelN ? w.n - j0 : kInt8PanelN;
        for (int64_t r = 0; r < m; ++r) {
            const int8_t* xr = a.q + r * a.ldq;
            float acc[kInt8PanelN] = {};
            for (int64_t g = 0; g < w.groups; ++g) {
                const uint8_t* blk = w.block(p, g);
                int32_t isum[kInt8PanelN] = {};
                for (int64_t s = 0; s < subs; ++s)
                    for (int c = 0; c < 4; ++c) {
                        const int8_t* xs = xr + g * G + s * kInt4Block + c * 4;
                        const uint8_t* chunk = blk + s * 256 + c * 64;
                        for (int j = 0; j < kInt8PanelN; ++j)
                            for (int t = 0; t < 4; ++t) {
                                const uint8_t b = chunk[j * 4 + t];
                                isum[j] += int32_t(b & 15) * xs[t] + int32_t(b >> 4) * xs[16 + t];
                            }
                    }
                const int32_t X = a.xsum[r * a.ldsum + g];
                const float sg = a.scales[r * a.ldsum + g];
                for (int j = 0; j < kInt8PanelN; ++j) {
                    const float d = f16_to_f32(load_u16(blk + scale_offset(G) + 2 * j));
                    if (w.kind == Int4Kind::kAffine) {
                        const float mn = f16_to_f32(load_u16(blk + extra_offset(G) + 2 * j));
                        acc[j] = std::fma(float(isum[j]), d * sg, acc[j]);
                        acc[j] = std::fma(mn * sg, float(X), acc[j]);
                    } else {
                        acc[j] = std::fma(float(isum[j] - zero_point(w, blk, j) * X), d * sg, acc[j]);
                    }
                }
            }
            for (int64_t j = 0; j < cnt; ++j) y[r * ldy + j0 + j] = acc[j];
        }
    }
}

void w4a16_panels_scalar(const F32Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y,
                         int64_t ldy) {
    const int64_t G = w.group, subs = G / kInt4Block;
    for (int64_t p = p0; p < p1; ++p) {
        const int64_t j0 = p * kInt8PanelN;
        const int64_t cnt = w.n - j0 < kInt8PanelN ? w.n - j0 : kInt8PanelN;
        for (int64_t r = 0; r < m; ++r) {
            const float* xr = a.x + r * a.ldx;
            float acc[kInt8PanelN] = {};
            for (int64_t g = 0; g < w.groups; ++g) {
                const uint8_t* blk = w.block(p, g);
                for (int j = 0; j < kInt8PanelN; ++j) {
                    const int32_t z = zero_point(w, blk, j);
                    float s = 0.0f;
                    for (int64_t sb = 0; sb < subs; ++sb)
                        for (int c = 0; c < 4; ++c) {
                            const float* xs = xr + g * G + sb * kInt4Block + c * 4;
                            const uint8_t* chunk = blk + sb * 256 + c * 64;
                            for (int t = 0; t < 4; ++t) {
                                const uint8_t b = chunk[j * 4 + t];
                                s += xs[t] * float(int32_t(b & 15) - z) + xs[16 + t] * float(int32_t(b >> 4) - z);
                            }
                        }
                    const float d = f16_to_f32(load_u16(blk + scale_offset(G) + 2 * j));
                    acc[j] += d * s;
                    if (w.kind == Int4Kind::kAffine)
                        acc[j] += f16_to_f32(load_u16(blk + extra_offset(G) + 2 * j)) * a.xsum[r * a.ldsum + g];
                }
            }
            for (int64_t j = 0; j < cnt; ++j) y[r * ldy + j0 + j] = acc[j];
        }
    }
}

}  // namespace lattice::int4_detail
