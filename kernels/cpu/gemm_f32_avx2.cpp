// AVX2 + FMA + F16C instantiation of the float GEMM (see gemm_f32_impl.h).
#include "kernels/cpu/gemm_f32.h"
#include "kernels/cpu/gemm_f32_impl.h"

#include <immintrin.h>

namespace lattice::detail {

namespace {
struct V256 {
    using reg = __m256;
    static constexpr int kWidth = 8;
    static constexpr int kNR = 2;
    static reg zero() { return _mm256_setzero_ps(); }
    static reg load_f32(const float* p) { return _mm256_loadu_ps(p); }
    static reg load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
    static reg load_bf16(const uint16_t* p) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
    static reg set1(float v) { return _mm256_set1_ps(v); }
    static void store(float* p, reg a) { _mm256_storeu_ps(p, a); }
    static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
    static float reduce(reg a) {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        return _mm_cvtss_f32(s);
    }
};
}  // namespace

void gemm_f32_rows_avx2(const float* x, int64_t m, int64_t k, const void* w, DType wt, int64_t n0, int64_t n1,
                        float* y, int64_t ldy) {
    gemm_rows_any<V256>(x, m, k, w, wt, n0, n1, y, ldy);
}

}  // namespace lattice::detail
