// Float GEMM dispatch and the scalar reference path (see gemm_f32.h).
#include "kernels/cpu/gemm_f32.h"

#include "base/error.h"

namespace lattice {

namespace detail {

void gemm_f32_rows_scalar(const float* x, int64_t m, int64_t k, const void* w, DType wt, int64_t n0, int64_t n1,
                          float* y, int64_t ldy) {
    for (int64_t j = n0; j < n1; ++j) {
        for (int64_t i = 0; i < m; ++i) {
            const float* xr = x + i * k;
            float acc = 0.0f;
            switch (wt) {
                case DType::kF32: {
                    const float* wr = static_cast<const float*>(w) + j * k;
                    for (int64_t p = 0; p < k; ++p) acc += xr[p] * wr[p];
                    break;
                }
                case DType::kF16: {
                    const uint16_t* wr = static_cast<const uint16_t*>(w) + j * k;
                    for (int64_t p = 0; p < k; ++p) acc += xr[p] * f16_to_f32(wr[p]);
                    break;
                }
                case DType::kBF16: {
                    const uint16_t* wr = static_cast<const uint16_t*>(w) + j * k;
                    for (int64_t p = 0; p < k; ++p) acc += xr[p] * bf16_to_f32(wr[p]);
                    break;
                }
                default: LATTICE_FAIL("gemm_f32: weight dtype {} unsupported", dtype_name(wt));
            }
            y[i * ldy + j] = acc;
        }
    }
}

}  // namespace detail

void gemm_f32(const float* x, int64_t m, int64_t k, const void* w, DType wt, int64_t n, float* y, ThreadPool& pool,
              IsaLevel isa) {
    LATTICE_CHECK(wt == DType::kF32 || wt == DType::kF16 || wt == DType::kBF16, "gemm_f32: weight dtype {} unsupported",
                  dtype_name(wt));
    LATTICE_CHECK(isa_supported(isa), "gemm_f32: ISA '{}' not supported by this CPU", isa_name(isa));
    const IsaLevel level = vector_level(isa);
    note_path(KernelFamily::kGemmF32, level);
    auto fn = level == IsaLevel::kAvx512Vnni ? detail::gemm_f32_rows_avx512
              : level == IsaLevel::kAvx2     ? detail::gemm_f32_rows_avx2
                                             : detail::gemm_f32_rows_scalar;
    if (n < 16 * int64_t(pool.size()) && m >= 8 * int64_t(pool.size())) {
        // Too few columns to share (a LoRA adapter's A^T: n = its rank): rows split instead; each row's outputs
        // are computed as in the column split, so the results are the same.
        pool.parallel_for(
            m, [&](int64_t i0, int64_t i1, int) { fn(x + i0 * k, i1 - i0, k, w, wt, 0, n, y + i0 * n, n); }, 4);
        return;
    }
    pool.parallel_for(
        n, [&](int64_t n0, int64_t n1, int) { fn(x, m, k, w, wt, n0, n1, y, n); }, 16);
}

}  // namespace lattice
