// Device helpers shared by the .cu files: fp16/bf16 <-> fp32 conversion by type, warp/block
// reductions, and the dispatch from a runtime DType to the kernel's template type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>

#include "kernels/common/llama_math.h"
#include "base/cuda_check.h"
#include "base/dtype.h"

namespace lattice::cuda {

template <typename T>
__device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32<float>(float v) {
    return v;
}
template <>
__device__ __forceinline__ float to_f32<__half>(__half v) {
    return __half2float(v);
}
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
    return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
    return v;
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
    return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ int warp_sum_i(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Block-wide reductions; every thread gets the result. blockDim.x must be a multiple of 32
// (<= 1024). `scratch` holds 32 floats of shared memory; callers may reuse it after return.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : -3.402823466e38f;
    return warp_max(v);
}

inline int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

}  // namespace lattice::cuda

// Runs `body` with `T` bound to the activation type for `act` (f16 or bf16).
#define LATTICE_DISPATCH_ACT(act, ...)                                                                      \
    do {                                                                                                    \
        if ((act) == ::lattice::DType::kF16) {                                                              \
            using T = __half;                                                                               \
            __VA_ARGS__;                                                                                    \
        } else if ((act) == ::lattice::DType::kBF16) {                                                      \
            using T = __nv_bfloat16;                                                                        \
            __VA_ARGS__;                                                                                    \
        } else {                                                                                            \
            LATTICE_THROW_CALL_ERROR(                                                                    \
                __FILE__, __LINE__, "dispatch",                                                             \
                "activation dtype " + std::string(::lattice::dtype_name(act)) + " (expected f16 or bf16)"); \
        }                                                                                                   \
    } while (0)

// Same for any float dtype (f32, f16, bf16), binding `U`.
#define LATTICE_DISPATCH_FLOAT(dt, ...)                                                              \
    do {                                                                                             \
        if ((dt) == ::lattice::DType::kF32) {                                                        \
            using U = float;                                                                         \
            __VA_ARGS__;                                                                             \
        } else if ((dt) == ::lattice::DType::kF16) {                                                 \
            using U = __half;                                                                        \
            __VA_ARGS__;                                                                             \
        } else if ((dt) == ::lattice::DType::kBF16) {                                                \
            using U = __nv_bfloat16;                                                                 \
            __VA_ARGS__;                                                                             \
        } else {                                                                                     \
            LATTICE_THROW_CALL_ERROR(                                                             \
                __FILE__, __LINE__, "dispatch",                                                      \
                "dtype " + std::string(::lattice::dtype_name(dt)) + " (expected f32, f16 or bf16)"); \
        }                                                                                            \
    } while (0)
