// Float GEMM dispatch and the scalar reference path (see gemm_f32.h).
#include "kernels/cpu/gemm_f32.h"

#include "base/error.h"

namespace lattice {

FloatIsa best_float_isa() {
#if defined(__x86_64__)
    static const FloatIsa isa = [] {
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl"))
            return FloatIsa::kAvx512;
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return FloatIsa::kAvx2;
        return FloatIsa::kScalar;
    }();
    return isa;
#else
    return FloatIsa::kScalar;
#endif
}

std::string_view float_isa_name(FloatIsa isa) {
    switch (isa) {
        case FloatIsa::kScalar: return "scalar";
        case FloatIsa::kAvx2: return "avx2";
        case FloatIsa::kAvx512: return "avx512";
    }
    return "?";
}

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
              FloatIsa isa) {
    LATTICE_CHECK(wt == DType::kF32 || wt == DType::kF16 || wt == DType::kBF16, "gemm_f32: weight dtype {} unsupported",
                  dtype_name(wt));
    if (isa == FloatIsa::kAvx512 && best_float_isa() != FloatIsa::kAvx512) isa = best_float_isa();
    if (isa == FloatIsa::kAvx2 && best_float_isa() == FloatIsa::kScalar) isa = FloatIsa::kScalar;
    auto fn = isa == FloatIsa::kAvx512 ? detail::gemm_f32_rows_avx512
              : isa == FloatIsa::kAvx2 ? detail::gemm_f32_rows_avx2
                                       : detail::gemm_f32_rows_scalar;
    pool.parallel_for(
        n, [&](int64_t n0, int64_t n1, int) { fn(x, m, k, w, wt, n0, n1, y, n); }, 16);
}

}  // namespace lattice
