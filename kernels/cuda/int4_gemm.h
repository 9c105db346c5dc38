// CUDA W4A16 linears: 4-bit weights in groups (kernels/common/int4.h) times fp16/bf16 activations, fp32
// accumulation. Host-callable launchers of int4_gemm.cu; plain C++ (cuda_runtime_api.h only). Every launcher
// enqueues on `stream` and never synchronizes (graph-capturable). All pointers are device pointers.
//
// Device layout of one linear (CudaBackend::make_linear_int4 uploads it; nothing is expanded):
//   qs  u8  [n][kp / 2]   the Int4Weights nibbles as they are (GGUF order: byte i of 32-column block b holds
//                         column 32 b + i low and 32 b + 16 + i high), kp = k rounded up to the group
//   d   f16 [n][groups]   scales
//   a   f16 [n][groups]   kZeroPoint: the zero points as f16 (exact, 0..16); kAffine: the minimums; kOffset8: null
// Every weight is w = fma(q - c, d, m) in fp32 with (c, m) = (8, 0), (z, 0) or (0, m) by kind: q - c is exact
// and one rounding follows, so w equals kernels/common/int4.h's int4_value bit for bit.
// Stored column j multiplies input channel perm[j] (GPTQ act-order): the kernels read activations already in
// stored order; int4_gather_rows puts them there (and zero-pads them to kp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/dtype.h"

namespace lattice::cuda {

struct Int4Dev {
    const uint8_t* qs = nullptr;
    const uint16_t* d = nullptr;
    const uint16_t* a = nullptr;  // null for kOffset8
    bool affine = false;          // kAffine: a holds minimums; else a (or 8) is subtracted from q
    int64_t n = 0, k = 0, kp = 0, group = 32;
};

// Decode rows per gemv_w4a16 call (more rows run gemm_w4a16).
constexpr int kInt4GemvMaxRows = 8;

// xg[i, j] = j < k ? x[i, perm ? perm[j] : j] : 0 for j < kp: x [m, k] contiguous, xg [m, kp], act dtype.
void int4_gather_rows(void* xg, const void* x, const int32_t* perm, int64_t m, int64_t k, int64_t kp, DType act,
                      cudaStream_t stream);

// Decode GEMV, 1 <= m <= kInt4GemvMaxRows: out[m, n] = x[m, :kp] . W^T with x [m, kp] contiguous, in stored
// column order and zero in [k, kp) (int4_gather_rows), 16-byte aligned. out_dtype: act or f32.
void gemv_w4a16(void* out, const void* x, const Int4Dev& w, int64_t m, DType act, DType out_dtype, cudaStream_t stream);

// Prefill GEMM, any m: out[m, n] = x[m, :k] . W^T with x [m, ldx] rows (ldx >= k) in stored column order
// (tensor cores: the 4-bit tile dequantized to the activation dtype in shared memory). out_dtype: act or f32.
void gemm_w4a16(void* out, const void* x, int64_t ldx, const Int4Dev& w, int64_t m, DType act, DType out_dtype,
                cudaStream_t stream);

}  // namespace lattice::cuda
