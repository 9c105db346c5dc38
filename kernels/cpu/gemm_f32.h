// Float GEMM for the CPU backend: y[m, n] = x[m, k] . W[n, k]^T with fp32 activations and weights
// kept in their checkpoint precision (f32, f16 or bf16; widening to fp32 is exact), fp32 accumulate.
// Threads split N (each streams its own contiguous slice of weight rows). ISA paths: scalar
// reference, AVX2+F16C, AVX-512; chosen at run time (best_float_isa) or forced (tests, benchmarks).
#pragma once

#include "kernels/cpu/thread_pool.h"
#include "base/dtype.h"

#include <cstdint>
#include <string_view>

namespace lattice {

enum class FloatIsa { kScalar, kAvx2, kAvx512 };
FloatIsa best_float_isa();  // from cpuid
std::string_view float_isa_name(FloatIsa isa);

// y[m, n] = x . W^T. W is [n, k] row-major of dtype wt (f32/f16/bf16).
void gemm_f32(const float* x, int64_t m, int64_t k, const void* w, DType wt, int64_t n, float* y, ThreadPool& pool,
              FloatIsa isa);
inline void gemm_f32(const float* x, int64_t m, int64_t k, const void* w, DType wt, int64_t n, float* y,
                     ThreadPool& pool) {
    gemm_f32(x, m, k, w, wt, n, y, pool, best_float_isa());
}

// Per-ISA workers over weight rows [n0, n1); y has leading dimension ldy (= n).
namespace detail {
void gemm_f32_rows_scalar(const float* x, int64_t m, int64_t k, const void* w, DType wt, int64_t n0, int64_t n1,
                          float* y, int64_t ldy);
void gemm_f32_rows_avx2(const float* x, int64_t m, int64_t k, const void* w, DType wt, int64_t n0, int64_t n1,
                        float* y, int64_t ldy);
void gemm_f32_rows_avx512(const float* x, int64_t m, int64_t k, const void* w, DType wt, int64_t n0, int64_t n1,
                          float* y, int64_t ldy);
}  // namespace detail

}  // namespace lattice
