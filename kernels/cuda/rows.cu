// Row-level CUDA kernels of the model families beyond Llama (declared in kernels.h):
//   add_bias          x[i, :] += bias: Qwen2's q/k/v biases on the fused q|k|v rows, after the GEMM.
//   gather_rows       one MoE expert's tokens copied into contiguous rows (its GEMM's input).
//   scatter_add_rows  the expert's outputs added back to their tokens, weighted by the router.
// Layout: activations [rows, cols] row-major in the activation dtype (f16 / bf16); bias and weights
// f32; row indices i32 on the device. Math in fp32 with one rounding per stored element, the CPU
// ops' semantics (kernels/cpu/ops.h add_bias_rows; runtime/backend/cpu gather / scatter-add).
// One block per row, threads across the columns: these rows are a few thousand elements and the
// kernels are memory-bound copies; an index outside the tensor never reads or writes out of bounds
// (gather writes zeros, scatter skips), since a kernel cannot throw (the host checked the routes).
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/kernels.h"

namespace lattice::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void add_bias_kernel(T* x, const float* bias, int64_t n) {
    T* row = x + int64_t(blockIdx.x) * n;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) row[j] = from_f32<T>(to_f32(row[j]) + bias[j]);
}

template <typename T>
__global__ void gather_rows_kernel(T* dst, const T* src, const int32_t* rows, int64_t src_rows, int64_t cols) {
    const int64_t i = blockIdx.x;
    const int32_t r = rows[i];
    const bool ok = r >= 0 && r < src_rows;
    T* o = dst + i * cols;
    const T* s = src + (ok ? int64_t(r) * cols : 0);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) o[j] = ok ? s[j] : from_f32<T>(0.0f);
}

template <typename T>
__global__ void scatter_add_rows_kernel(T* dst, const T* src, const int32_t* rows, const float* w, int64_t dst_rows,
                                        int64_t cols) {
    const int64_t i = blockIdx.x;
    const int32_t r = rows[i];
    if (r < 0 || r >= dst_rows) return;  // block-uniform
    const float wi = w[i];
    T* o = dst + int64_t(r) * cols;
    const T* s = src + i * cols;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) o[j] = from_f32<T>(fmaf(wi, to_f32(s[j]), to_f32(o[j])));
}

void check_grid(int64_t rows, int64_t cols, const char* op) {
    KERNEL_CHECK(rows >= 0 && rows <= 0x7fffffff && cols >= 0, std::string("cuda::") + op + ": " +
                                                                   std::to_string(rows) + " rows of " +
                                                                   std::to_string(cols) + " out of range");
}

}  // namespace

void add_bias(void* x, const float* bias, int64_t m, int64_t n, DType act, cudaStream_t stream) {
    check_grid(m, n, "add_bias");
    if (m == 0 || n == 0) return;
    LATTICE_DISPATCH_ACT(act, add_bias_kernel<T><<<unsigned(m), kThreads, 0, stream>>>(static_cast<T*>(x), bias, n));
    CUDA_CHECK_LAUNCH();
}

void gather_rows(void* dst, const void* src, const int32_t* rows, int64_t n, int64_t src_rows, int64_t cols, DType act,
                 cudaStream_t stream) {
    check_grid(n, cols, "gather_rows");
    if (n == 0 || cols == 0) return;
    LATTICE_DISPATCH_ACT(act, gather_rows_kernel<T><<<unsigned(n), kThreads, 0, stream>>>(
                                  static_cast<T*>(dst), static_cast<const T*>(src), rows, src_rows, cols));
    CUDA_CHECK_LAUNCH();
}

void scatter_add_rows(void* dst, const void* src, const int32_t* rows, const float* w, int64_t n, int64_t dst_rows,
                      int64_t cols, DType act, cudaStream_t stream) {
    check_grid(n, cols, "scatter_add_rows");
    if (n == 0 || cols == 0) return;
    LATTICE_DISPATCH_ACT(act, scatter_add_rows_kernel<T><<<unsigned(n), kThreads, 0, stream>>>(
                                  static_cast<T*>(dst), static_cast<const T*>(src), rows, w, dst_rows, cols));
    CUDA_CHECK_LAUNCH();
}

}  // namespace lattice::cuda
