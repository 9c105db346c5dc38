// Scalar reference of the W4A8 GEMM on the K-quant layout (GGUF Q4_K / Q6_K super-blocks, int4_gemm.h): plain
// loops over the same packed bytes, exact int32 sums per group (Q6_K: per 16-column sub-block, times its int8
// scale), then the float operations int4_gemm.h specifies per group, in group order, with std::fma. The
// AVX-512 path (int4_gemm_kq_avx512.cpp) must equal it bit for bit.
#include <cmath>
#include <cstring>

#include "base/dtype.h"
#include "kernels/cpu/int4_gemm_kernels.h"

namespace lattice::int4_detail {

namespace {

float f16_at(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return f16_to_f32(v);
}

// One row r of panel p (Q4_K) into acc[16].
void q4k_row(const Int4Acts& a, int64_t r, const PackedInt4& w, int64_t p, float* acc) {
    const int8_t* xr = a.q + r * a.ldq;
    for (int64_t sbi = 0; sbi < w.k / 256; ++sbi) {
        const uint8_t* sb = w.kq_block(p, sbi);
        for (int g = 0; g < 8; ++g) {
            const int64_t gi = sbi * 8 + g;
            const int32_t X = a.xsum[r * a.ldsum + gi];
            const float sg = a.scales[r * a.ldsum + gi];
            for (int j = 0; j < kInt8PanelN; ++j) {
                int32_t I = 0;
                for (int i = 0; i < 32; ++i) {
                    const uint8_t b = sb[kKqQ4Nib + g * 256 + (i % 16) / 4 * 64 + j * 4 + i % 4];
                    I += int32_t(i < 16 ? (b & 15) : (b >> 4)) * xr[gi * 32 + i];
                }
                uint8_t s[12];
                for (int b = 0; b < 12; ++b) s[b] = sb[kKqQ4Scales + 16 * b + j];
                int sc = 0, mn = 0;
                q4k_scale_min(s, g, &sc, &mn);
                const float D = f16_at(sb + kKqQ4D + 2 * j) * float(sc);
                const float M = f16_at(sb + kKqQ4Dmin + 2 * j) * float(mn);
                acc[j] = std::fma(float(I), D * sg, acc[j]);
                acc[j] = std::fma(-(M * sg), float(X), acc[j]);
            }
        }
    }
}

// One row r of panel p (Q6_K) into acc[16].
void q6k_row(const Int4Acts& a, int64_t r, const PackedInt4& w, int64_t p, float* acc) {
    const int8_t* xr = a.q + r * a.ldq;
    for (int64_t sbi = 0; sbi < w.k / 256; ++sbi) {
        const uint8_t* sb = w.kq_block(p, sbi);
        for (int g = 0; g < 8; ++g) {
            const int64_t gi = sbi * 8 + g;
            const int32_t X = a.xsum[r * a.ldsum + gi], Xa = a.xsum16[r * a.ldsum + gi], Xb = X - Xa;
            const float sg = a.scales[r * a.ldsum + gi];
            for (int j = 0; j < kInt8PanelN; ++j) {
                int32_t Ia = 0, Ib = 0;
                for (int i = 0; i < 32; ++i) (i < 16 ? Ia : Ib) += kq_q6_value(sb, g, j, i) * xr[gi * 32 + i];
                const int32_t sa = int8_t(sb[kKqQ6Scales + 16 * (2 * g) + j]);
                const int32_t sbv = int8_t(sb[kKqQ6Scales + 16 * (2 * g + 1) + j]);
                const int32_t T = sa * (Ia - 32 * Xa) + sbv * (Ib - 32 * Xb);
                acc[j] = std::fma(float(T), f16_at(sb + kKqQ6D + 2 * j) * sg, acc[j]);
            }
        }
    }
}

}  // namespace

void w4a8_kq_panels_scalar(const Int4Acts& a, int64_t m, const PackedInt4& w, int64_t p0, int64_t p1, float* y,
                           int64_t ldy) {
    for (int64_t p = p0; p < p1; ++p) {
        const int64_t j0 = p * kInt8PanelN;
        const int64_t cnt = w.n - j0 < kInt8PanelN ? w.n - j0 : kInt8PanelN;
        for (int64_t r = 0; r < m; ++r) {
            float acc[kInt8PanelN] = {};
            if (w.panel_q6[size_t(p)])
                q6k_row(a, r, w, p, acc);
            else
                q4k_row(a, r, w, p, acc);
            for (int64_t j = 0; j < cnt; ++j) y[r * ldy + j0 + j] = acc[j];
        }
    }
}

}  // namespace lattice::int4_detail
