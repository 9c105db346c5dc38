// Memory-bound elementwise CUDA kernels: embedding gather, RoPE, add, the int32 -> float dequantization
// epilogue of the INT8 GEMM and the int8 weights' dequantization, random fills and dtype conversion. The
// per-element math comes from kernels/common/llama_math.h so it matches the CPU kernels. Rows are [m, n]
// row-major. The row reductions (RMSNorm, quantization, SiLU x up) are norm_quant.cu.
#include "kernels/common/quantize.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/rows_launch.cuh"

namespace lattice::cuda {
namespace {

using namespace rows_launch;

template <typename T, typename U>
__global__ void embed_kernel(T* out, const U* table, int64_t table_rows, int64_t hidden, const int32_t* ids,
                             int64_t row_offset) {
    const int64_t i = blockIdx.x;
    const int64_t row = int64_t(ids[i]) - row_offset;
    const bool local = row >= 0 && row < table_rows;
    T* o = out + i * hidden;
    for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x)
        o[j] = from_f32<T>(local ? to_f32(table[row * hidden + j]) : 0.0f);
}

// One block per token; thread t rotates pair (t % half) of head (t / half) over q and k heads.
template <typename T>
__global__ void rope_kernel(T* qkv, const int32_t* positions, int64_t row_len, int64_t n_rot_heads, int64_t hd,
                            const float* inv_freq) {
    const int64_t half = hd / 2;
    const int32_t pos = positions[blockIdx.x];
    T* row = qkv + int64_t(blockIdx.x) * row_len;
    for (int64_t t = threadIdx.x; t < n_rot_heads * half; t += blockDim.x) {
        const int64_t h = t / half, i = t % half;
        T* v = row + h * hd;
        float x0 = to_f32(v[i]), x1 = to_f32(v[i + half]);
        math::rope_pair(x0, x1, math::rope_cos_sin(pos, inv_freq[i]));
        v[i] = from_f32<T>(x0);
        v[i + half] = from_f32<T>(x1);
    }
}

template <typename T>
__global__ void add_kernel(T* out, const T* a, const T* b, int64_t n) {
    for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < n; t += int64_t(gridDim.x) * blockDim.x)
        out[t] = from_f32<T>(to_f32(a[t]) + to_f32(b[t]));
}

template <typename T>
__global__ void dequant_kernel(T* out, const int32_t* acc, int64_t ld_acc, const float* sx, const float* sw, int64_t m,
                               int64_t n) {
    const int64_t total = m * n;
    for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
        const int64_t i = t / n, j = t % n;
        // Same order as the GEMV epilogue and the CPU kernels (int8_gemm_kernels.h): acc * (sx * sw).
        out[t] = from_f32<T>(float(acc[i * ld_acc + j]) * ((sx ? sx[i] : 1.0f) * sw[j]));
    }
}

template <typename T>
__global__ void dequant_weights_kernel(T* out, const int8_t* w, int64_t ldw, const float* sw, int64_t n, int64_t k) {
    const int64_t total = n * k;
    for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
        const int64_t i = t / k, j = t % k;
        out[t] = from_f32<T>(float(w[i * ldw + j]) * sw[i]);
    }
}

__device__ __forceinline__ uint64_t mix64(uint64_t x) {  // splitmix64 finalizer
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

template <typename U>
__global__ void fill_random_kernel(U* out, int64_t n, uint64_t seed, float scale) {
    for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < n; t += int64_t(gridDim.x) * blockDim.x) {
        const uint64_t r = mix64(seed * 0x9e3779b97f4a7c15ull + uint64_t(t));
        const float u = float(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
        out[t] = from_f32<U>((2.0f * u - 1.0f) * scale);
    }
}

__global__ void fill_random_i8_kernel(int8_t* out, int64_t n, uint64_t seed) {
    for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < n; t += int64_t(gridDim.x) * blockDim.x) {
        const uint64_t r = mix64(seed * 0x9e3779b97f4a7c15ull + uint64_t(t));
        out[t] = int8_t(int(r % 255u) - 127);
    }
}

template <typename O, typename I>
__global__ void convert_kernel(O* out, const I* in, int64_t n) {
    for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < n; t += int64_t(gridDim.x) * blockDim.x)
        out[t] = from_f32<O>(to_f32(in[t]));
}

}  // namespace

void embed(void* out, DType act, const void* table, DType table_dtype, int64_t table_rows, int64_t hidden,
           const int32_t* ids, int64_t m, int64_t row_offset, cudaStream_t stream) {
    check_rows(m, "embed");
    if (m == 0) return;
    LATTICE_DISPATCH_ACT(act, LATTICE_DISPATCH_FLOAT(table_dtype, {
                             embed_kernel<T, U><<<unsigned(m), kRowThreads, 0, stream>>>(
                                 static_cast<T*>(out), static_cast<const U*>(table), table_rows, hidden, ids,
                                 row_offset);
                         }));
    CUDA_CHECK_LAUNCH();
}

void rope(void* qkv, const int32_t* positions, int64_t m, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
          const float* inv_freq, DType act, cudaStream_t stream) {
    check_rows(m, "rope");
    KERNEL_CHECK(head_dim % 2 == 0, "cuda::rope: odd head_dim " + std::to_string(head_dim));
    if (m == 0) return;
    const int64_t row_len = (n_heads + 2 * n_kv_heads) * head_dim;
    LATTICE_DISPATCH_ACT(act, rope_kernel<T><<<unsigned(m), kRowThreads, 0, stream>>>(
                                  static_cast<T*>(qkv), positions, row_len, n_heads + n_kv_heads, head_dim, inv_freq));
    CUDA_CHECK_LAUNCH();
}

void add(void* out, const void* a, const void* b, int64_t n, DType act, cudaStream_t stream) {
    if (n == 0) return;
    LATTICE_DISPATCH_ACT(act, add_kernel<T><<<grid_for(n), 256, 0, stream>>>(
                                  static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n));
    CUDA_CHECK_LAUNCH();
}

void dequant_i32(void* out, const int32_t* acc, int64_t ld_acc, const float* sx, const float* sw, int64_t m, int64_t n,
                 DType act, DType out_dtype, cudaStream_t stream) {
    KERNEL_CHECK(out_dtype == act || out_dtype == DType::kF32,
                 "cuda::dequant_i32: output dtype " + std::string(dtype_name(out_dtype)) + " (act or f32)");
    if (m * n == 0) return;
    if (out_dtype == DType::kF32) {
        dequant_kernel<float><<<grid_for(m * n), 256, 0, stream>>>(static_cast<float*>(out), acc, ld_acc, sx, sw, m, n);
    } else {
        LATTICE_DISPATCH_ACT(act, dequant_kernel<T>
                             <<<grid_for(m * n), 256, 0, stream>>>(static_cast<T*>(out), acc, ld_acc, sx, sw, m, n));
    }
    CUDA_CHECK_LAUNCH();
}

void dequant_weights(void* out, const int8_t* w, int64_t ldw, const float* sw, int64_t n, int64_t k, DType act,
                     cudaStream_t stream) {
    if (n * k == 0) return;
    LATTICE_DISPATCH_ACT(
        act, dequant_weights_kernel<T><<<grid_for(n * k), 256, 0, stream>>>(static_cast<T*>(out), w, ldw, sw, n, k));
    CUDA_CHECK_LAUNCH();
}

void fill_random(void* out, DType dtype, int64_t n, uint64_t seed, float scale, cudaStream_t stream) {
    if (n == 0) return;
    if (dtype == DType::kI8) {
        fill_random_i8_kernel<<<grid_for(n), 256, 0, stream>>>(static_cast<int8_t*>(out), n, seed);
    } else {
        LATTICE_DISPATCH_FLOAT(
            dtype, fill_random_kernel<U><<<grid_for(n), 256, 0, stream>>>(static_cast<U*>(out), n, seed, scale));
    }
    CUDA_CHECK_LAUNCH();
}

void convert(void* out, DType out_dtype, const void* in, DType in_dtype, int64_t n, cudaStream_t stream) {
    if (n == 0) return;
    LATTICE_DISPATCH_FLOAT(out_dtype, {
        using O = U;
        LATTICE_DISPATCH_FLOAT(in_dtype, convert_kernel<O, U>
                               <<<grid_for(n), 256, 0, stream>>>(static_cast<O*>(out), static_cast<const U*>(in), n));
    });
    CUDA_CHECK_LAUNCH();
}

}  // namespace lattice::cuda
