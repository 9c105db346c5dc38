// Float GEMM for the CPU backend: y[m, n] = x[m, k] . W[n, k]^T with fp32 activations and weights
// kept in their checkpoint precision (f32, f16 or bf16; widening to fp32 is exact), fp32 accumulate.
// Threads split N (each streams its own contiguous slice of weight rows). ISA paths: scalar
// reference, AVX2+F16C, AVX-512: vector_level of the one ISA decision (isa.h), or a level the caller names.
#pragma once

#include "kernels/cpu/isa.h"
#include "kernels/cpu/thread_pool.h"
#include "base/dtype.h"

#include <cstdint>

namespace lattice {

// y[m, n] = x . W^T. W is [n, k] row-major of dtype wt (f32/f16/bf16). Runs the kernel of vector_level(isa);
// throws when this CPU cannot run `isa`.
void gemm_f32(const float* x, int64_t m, int64_t k, const void* w, DType wt, int64_t n, float* y, ThreadPool& pool,
              IsaLevel isa);
inline void gemm_f32(const float* x, int64_t m, int64_t k, const void* w, DType wt, int64_t n, float* y,
                     ThreadPool& pool) {
    gemm_f32(x, m, k, w, wt, n, y, pool, detect_isa());
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
