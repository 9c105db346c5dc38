// AVX-512 instantiation of the float GEMM (compiled with -mavx512f/bw/vl; see gemm_f32_impl.h).
#include "kernels/cpu/gemm_f32.h"
#include "kernels/cpu/gemm_f32_impl.h"

#include <immintrin.h>

namespace lattice::detail {

namespace {
struct V512 {
    using reg = __m512;
    static constexpr int kWidth = 16;
    static constexpr int kNR = 4;
    static reg zero() { return _mm512_setzero_ps(); }
    static reg load_f32(const float* p) { return _mm512_loadu_ps(p); }
    static reg load_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
    static reg load_bf16(const uint16_t* p) {
        __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    }
    static reg set1(float v) { return _mm512_set1_ps(v); }
    static void store(float* p, reg a) { _mm512_storeu_ps(p, a); }
    static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
    static float reduce(reg a) { return _mm512_reduce_add_ps(a); }
};
}  // namespace

void gemm_f32_rows_avx512(const float* x, int64_t m, int64_t k, const void* w, DType wt, int64_t n0, int64_t n1,
                          float* y, int64_t ldy) {
    gemm_rows_any<V512>(x, m, k, w, wt, n0, n1, y, ldy);
}

}  // namespace lattice::detail
