// CUDA kernels of the blocks beyond Llama's skeleton (declared in kernels.h): GeGLU (gelu_tanh x up),
// QK-norm (an RMSNorm per q and k head of the fused q|k|v rows), scaling (Gemma's embedding scale) and
// soft-capping (Gemma 2's final logits). Activations [rows, cols] row-major in the activation dtype,
// weights f32; math in fp32 through kernels/common/llama_math.h (the CPU kernels' functions), one
// rounding per stored element. Simple kernels: one block per row (GeGLU), one thread per head
// (QK-norm: head_dim is at most a few hundred elements), grid-stride elementwise loops.
#include <algorithm>

#include "kernels/common/llama_math.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/kernels.h"

namespace lattice::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void gelu_tanh_mul_kernel(T* out, const T* gu, int64_t f) {
    const T* g = gu + int64_t(blockIdx.x) * 2 * f;
    T* o = out + int64_t(blockIdx.x) * f;
    for (int64_t j = threadIdx.x; j < f; j += blockDim.x) o[j] = from_f32<T>(math::gelu_tanh(to_f32(g[j])) * to_f32(g[f + j]));
}

template <typename T>
__global__ void head_rmsnorm_kernel(T* qkv, int64_t m, int64_t row_len, int64_t nq, int64_t nkv, int64_t hd,
                                    const float* q_w, const float* k_w, float eps) {
    const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, heads = nq + nkv;
    if (i >= m * heads) return;
    const int64_t h = i % heads;
    T* x = qkv + (i / heads) * row_len + h * hd;
    const float* w = h < nq ? q_w : k_w;
    float ss = 0.0f;
    for (int64_t d = 0; d < hd; ++d) ss += to_f32(x[d]) * to_f32(x[d]);
    const float inv = math::rms_inv(ss, hd, eps);
    for (int64_t d = 0; d < hd; ++d) x[d] = from_f32<T>(to_f32(x[d]) * inv * w[d]);
}

template <typename T>
__global__ void scale_kernel(T* x, int64_t n, float s) {
    for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < n; t += int64_t(gridDim.x) * blockDim.x)
        x[t] = from_f32<T>(to_f32(x[t]) * s);
}

template <typename T>
__global__ void softcap_kernel(T* x, int64_t n, float cap) {
    for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < n; t += int64_t(gridDim.x) * blockDim.x)
        x[t] = from_f32<T>(math::softcap(to_f32(x[t]), cap));
}

unsigned grid_of(int64_t n) {
    return unsigned(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535));
}

}  // namespace

void gelu_tanh_mul(void* out, const void* gate_up, int64_t m, int64_t f, DType act, cudaStream_t stream) {
    KERNEL_CHECK(m >= 0 && m <= 0x7fffffff && f >= 0, "cuda::gelu_tanh_mul: rows out of range");
    if (m == 0 || f == 0) return;
    LATTICE_DISPATCH_ACT(act, gelu_tanh_mul_kernel<T><<<unsigned(m), kThreads, 0, stream>>>(
                                  static_cast<T*>(out), static_cast<const T*>(gate_up), f));
    CUDA_CHECK_LAUNCH();
}

void head_rmsnorm(void* qkv, int64_t m, int64_t row_len, int64_t nq, int64_t nkv, int64_t hd, const float* q_w,
                  const float* k_w, float eps, DType act, cudaStream_t stream) {
    const int64_t n = m * (nq + nkv);
    KERNEL_CHECK(n >= 0 && (n + kThreads - 1) / kThreads <= 0x7fffffff, "cuda::head_rmsnorm: heads out of range");
    if (n == 0) return;
    LATTICE_DISPATCH_ACT(act, head_rmsnorm_kernel<T><<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
                                  static_cast<T*>(qkv), m, row_len, nq, nkv, hd, q_w, k_w, eps));
    CUDA_CHECK_LAUNCH();
}

void scale(void* x, int64_t n, float s, DType dtype, cudaStream_t stream) {
    if (n == 0) return;
    if (dtype == DType::kF32)
        scale_kernel<float><<<grid_of(n), kThreads, 0, stream>>>(static_cast<float*>(x), n, s);
    else
        LATTICE_DISPATCH_ACT(dtype, scale_kernel<T><<<grid_of(n), kThreads, 0, stream>>>(static_cast<T*>(x), n, s));
    CUDA_CHECK_LAUNCH();
}

void softcap(void* x, int64_t n, float cap, DType dtype, cudaStream_t stream) {
    if (n == 0) return;
    if (dtype == DType::kF32)
        softcap_kernel<float><<<grid_of(n), kThreads, 0, stream>>>(static_cast<float*>(x), n, cap);
    else
        LATTICE_DISPATCH_ACT(dtype, softcap_kernel<T><<<grid_of(n), kThreads, 0, stream>>>(static_cast<T*>(x), n, cap));
    CUDA_CHECK_LAUNCH();
}

}  // namespace lattice::cuda
