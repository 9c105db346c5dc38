// Scalar reference paths of the int8 GEMMs, reading the same packed layout as the SIMD paths
// (int8_gemm.h). Plain loops, int32 accumulation (exact for k <= kInt8MaxK); they define the
// results the SIMD paths must match exactly (W8A8 / s8s8) and run on any x86-64 or other CPU.
#include <cstring>

#include "kernels/cpu/int8_gemm_kernels.h"

namespace lattice::int8_detail {

void s8_panels_scalar(const void* a_void, int64_t m, int64_t lda, const PackedInt8& w, int64_t p0, int64_t p1,
                      const Int8Epilogue& ep) {
    const int8_t* a = static_cast<const int8_t*>(a_void);
    const int64_t groups = w.k_padded / kInt8GroupK;
    for (int64_t p = p0; p < p1; ++p) {
        const int8_t* b = w.panel(p);
        for (int64_t r = 0; r < m; ++r) {
            const int8_t* ar = a + r * lda;
            int32_t acc[kInt8PanelN] = {};
            for (int64_t g = 0; g < groups; ++g) {
                const int8_t* bg = b + g * 64;
                const int8_t* ag = ar + g * 4;
                for (int j = 0; j < kInt8PanelN; ++j)
                    for (int t = 0; t < 4; ++t) acc[j] += int32_t(ag[t]) * int32_t(bg[j * 4 + t]);
            }
            store_panel_row(acc, r, p, w.n, ep);
        }
    }
}

void w8a16_panels_scalar(const float* x, int64_t m, int64_t ldx, const PackedInt8& w, const float* scales,
                         int64_t p0, int64_t p1, float* y, int64_t ldy) {
    const int64_t groups = w.k_padded / kInt8GroupK;
    for (int64_t p = p0; p < p1; ++p) {
        const int8_t* b = w.panel(p);
        int64_t j0 = p * kInt8PanelN;
        int64_t cnt = w.n - j0 < kInt8PanelN ? w.n - j0 : kInt8PanelN;
        for (int64_t r = 0; r < m; ++r) {
            const float* xr = x + r * ldx;
            float acc[kInt8PanelN] = {};
            for (int64_t g = 0; g < groups; ++g) {
                const int8_t* bg = b + g * 64;
                const float* xg = xr + g * 4;
                for (int j = 0; j < kInt8PanelN; ++j)
                    for (int t = 0; t < 4; ++t) acc[j] += xg[t] * float(bg[j * 4 + t]);
            }
            for (int64_t j = 0; j < cnt; ++j) y[r * ldy + j0 + j] = acc[j] * scales[j0 + j];
        }
    }
}

}  // namespace lattice::int8_detail
