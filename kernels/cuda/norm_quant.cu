// Row kernels of the CUDA forward: RMSNorm (plain, fused with the residual add, and fused add + norm +
// per-token int8 quantization), the per-token int8 quantization, and SiLU x up (optionally quantized).
// One block per row for the row reductions (fp32 sums): rows of n % 8 == 0 elements take the
// vectorized register-resident kernels (16-byte loads; see "vectorized row kernels" below), others
// scalar loops. The per-element math comes from kernels/common/llama_math.h and quantize.h so it matches the
// CPU kernels. Rows are [m, n] row-major.
#include "kernels/common/quantize.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/rows_launch.cuh"

namespace lattice::cuda {
namespace {

using namespace rows_launch;

template <typename T>
__global__ void rmsnorm_kernel(T* out, const T* x, const float* w, int64_t n, float eps) {
    __shared__ float scratch[32];
    const T* xr = x + int64_t(blockIdx.x) * n;
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const float v = to_f32(xr[j]);
        ss += v * v;
    }
    const float inv = math::rms_inv(block_sum(ss, scratch), n, eps);
    T* o = out + int64_t(blockIdx.x) * n;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) o[j] = from_f32<T>(to_f32(xr[j]) * inv * w[j]);
}

// residual += x (stored rounded to T; the norm sees exactly the stored value), then the norm.
// Optional outputs: out (T) and q/scales (int8 per token, quantizing the T-rounded normed value
// so the fused path equals rmsnorm followed by quantize_rows).
template <typename T>
__global__ void add_rmsnorm_kernel(T* residual, const T* x, T* out, int8_t* q, int64_t ldq, float* scales,
                                   const float* w, int64_t n, float eps) {
    __shared__ float scratch[32];
    const int64_t base = int64_t(blockIdx.x) * n;
    T* r = residual + base;
    float ss = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        float v = to_f32(r[j]);
        if (x) {
            const T s = from_f32<T>(v + to_f32(x[base + j]));
            r[j] = s;
            v = to_f32(s);
        }
        ss += v * v;
    }
    const float inv = math::rms_inv(block_sum(ss, scratch), n, eps);  // block_sum syncs: r[] is visible
    float amax = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const T y = from_f32<T>(to_f32(r[j]) * inv * w[j]);
        if (out) out[base + j] = y;
        amax = fmaxf(amax, fabsf(to_f32(y)));
    }
    if (!q) return;
    amax = block_max(amax, scratch);
    const float qs = int8_scale_from_absmax(amax);
    int8_t* qr = q + int64_t(blockIdx.x) * ldq;
    for (int64_t j = threadIdx.x; j < ldq; j += blockDim.x)
        qr[j] = j < n ? quantize_int8_value(to_f32(from_f32<T>(to_f32(r[j]) * inv * w[j])), qs) : int8_t(0);
    if (threadIdx.x == 0) scales[blockIdx.x] = qs;
}

template <typename T>
__global__ void quantize_kernel(int8_t* q, int64_t ldq, float* scales, const T* x, int64_t k) {
    __shared__ float scratch[32];
    const T* xr = x + int64_t(blockIdx.x) * k;
    float amax = 0.0f;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) amax = fmaxf(amax, fabsf(to_f32(xr[j])));
    amax = block_max(amax, scratch);
    const float qs = int8_scale_from_absmax(amax);
    int8_t* qr = q + int64_t(blockIdx.x) * ldq;
    for (int64_t j = threadIdx.x; j < ldq; j += blockDim.x)
        qr[j] = j < k ? quantize_int8_value(to_f32(xr[j]), qs) : int8_t(0);
    if (threadIdx.x == 0) scales[blockIdx.x] = qs;
}

template <typename T>
__global__ void silu_mul_kernel(T* out, const T* gu, int64_t m, int64_t f) {
    const int64_t total = m * f;
    for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
        const int64_t i = t / f, j = t % f;
        const float g = to_f32(gu[i * 2 * f + j]), u = to_f32(gu[i * 2 * f + f + j]);
        out[t] = from_f32<T>(math::silu(g) * u);
    }
}

// ---- vectorized row kernels (16-byte loads, the row kept in registers) ----
// For rows of n % 8 == 0 elements (every hidden/FFN size of the Llama family) with 16-byte-aligned
// rows: each thread owns up to kRowVecs vectors of 8 elements, so a row is read from memory once
// and the reduction, the normalized output and its int8 quantization all come from registers. One
// block per row, sized to the row (n / 8 / kRowVecs threads rounded up to a warp, <= 1024): at
// decode (m = 1..32) a 70B row is 16 KB, which one SM streams in about a microsecond; splitting a
// row over several blocks would need a grid-wide reduction (a second launch or a cluster, sm_90
// only) that costs more than the row itself. Rows too long for the registers (> 32768 elements) or
// misaligned take the scalar kernels above, which compute the same values.
constexpr int kVecElems = 8;   // 16 bytes of f16/bf16
constexpr int kRowVecs = 4;    // vectors per thread: rows up to 8 * 4 * 1024 = 32768 elements
constexpr int kMaxRowThreads = 1024;

template <typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&v)[kVecElems]) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < kVecElems; ++i) v[i] = to_f32(e[i]);
}

// Rounds v to T, stores it (when p is not null) and returns the rounded values in v.
template <typename T>
__device__ __forceinline__ void round_store_vec(T* p, float (&v)[kVecElems]) {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < kVecElems; ++i) {
        e[i] = from_f32<T>(v[i]);
        v[i] = to_f32(e[i]);
    }
    if (p) *reinterpret_cast<uint4*>(p) = raw;
}

// Quantizes a register-resident row (v: this thread's vectors, vector index j = threadIdx.x + r *
// blockDim.x) into q[0, ldq) with int8 scale from the block's absmax; zero-fills the padding.
__device__ __forceinline__ void quantize_row_regs(const float (&v)[kRowVecs][kVecElems], int64_t nv, float amax,
                                                  int8_t* q, int64_t ldq, float* scale, float* scratch) {
    amax = block_max(amax, scratch);
    const float qs = int8_scale_from_absmax(amax);
#pragma unroll
    for (int r = 0; r < kRowVecs; ++r) {
        const int64_t j = threadIdx.x + int64_t(r) * blockDim.x;
        if (j >= nv) break;
        uint2 packed;
        int8_t* e = reinterpret_cast<int8_t*>(&packed);
#pragma unroll
        for (int i = 0; i < kVecElems; ++i) e[i] = quantize_int8_value(v[r][i], qs);
        *reinterpret_cast<uint2*>(q + j * kVecElems) = packed;
    }
    for (int64_t j = nv * kVecElems + threadIdx.x; j < ldq; j += blockDim.x) q[j] = 0;
    if (threadIdx.x == 0) *scale = qs;
}

// add_rmsnorm_kernel's contract (x null: no add; out / q optional) on register-resident rows.
template <typename T>
__global__ void __launch_bounds__(kMaxRowThreads)
    add_rmsnorm_vec_kernel(T* residual, const T* x, T* out, int8_t* q, int64_t ldq, float* scales, const float* w,
                           int64_t n, float eps) {
    __shared__ float scratch[32];
    const int64_t base = int64_t(blockIdx.x) * n, nv = n / kVecElems;
    float v[kRowVecs][kVecElems];
    float ss = 0.0f;
#pragma unroll
    for (int r = 0; r < kRowVecs; ++r) {
        const int64_t j = threadIdx.x + int64_t(r) * blockDim.x;
        if (j >= nv) break;
        load_vec(residual + base + j * kVecElems, v[r]);
        if (x) {
            float a[kVecElems];
            load_vec(x + base + j * kVecElems, a);
#pragma unroll
            for (int i = 0; i < kVecElems; ++i) v[r][i] += a[i];
            round_store_vec(residual + base + j * kVecElems, v[r]);
        }
#pragma unroll
        for (int i = 0; i < kVecElems; ++i) ss += v[r][i] * v[r][i];
    }
    const float inv = math::rms_inv(block_sum(ss, scratch), n, eps);
    float amax = 0.0f;
#pragma unroll
    for (int r = 0; r < kRowVecs; ++r) {
        const int64_t j = threadIdx.x + int64_t(r) * blockDim.x;
        if (j >= nv) break;
        const float4 w0 = *reinterpret_cast<const float4*>(w + j * kVecElems);
        const float4 w1 = *reinterpret_cast<const float4*>(w + j * kVecElems + 4);
        const float wv[kVecElems] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
        for (int i = 0; i < kVecElems; ++i) v[r][i] = v[r][i] * inv * wv[i];
        round_store_vec(out ? out + base + j * kVecElems : nullptr, v[r]);
#pragma unroll
        for (int i = 0; i < kVecElems; ++i) amax = fmaxf(amax, fabsf(v[r][i]));
    }
    if (q) quantize_row_regs(v, nv, amax, q + int64_t(blockIdx.x) * ldq, ldq, scales + blockIdx.x, scratch);
}

// out = silu(gate) * up per row of gu = [gate | up] ([m, 2f]); out and/or q (+ scales) optional.
template <typename T>
__global__ void __launch_bounds__(kMaxRowThreads)
    silu_mul_vec_kernel(T* out, int8_t* q, int64_t ldq, float* scales, const T* gu, int64_t f) {
    __shared__ float scratch[32];
    const T* g = gu + int64_t(blockIdx.x) * 2 * f;
    const int64_t nv = f / kVecElems;
    float v[kRowVecs][kVecElems];
    float amax = 0.0f;
#pragma unroll
    for (int r = 0; r < kRowVecs; ++r) {
        const int64_t j = threadIdx.x + int64_t(r) * blockDim.x;
        if (j >= nv) break;
        float u[kVecElems];
        load_vec(g + j * kVecElems, v[r]);
        load_vec(g + f + j * kVecElems, u);
#pragma unroll
        for (int i = 0; i < kVecElems; ++i) v[r][i] = math::silu(v[r][i]) * u[i];
        round_store_vec(out ? out + int64_t(blockIdx.x) * f + j * kVecElems : nullptr, v[r]);
#pragma unroll
        for (int i = 0; i < kVecElems; ++i) amax = fmaxf(amax, fabsf(v[r][i]));
    }
    if (q) quantize_row_regs(v, nv, amax, q + int64_t(blockIdx.x) * ldq, ldq, scales + blockIdx.x, scratch);
}

template <typename T>
__global__ void __launch_bounds__(kMaxRowThreads)
    quantize_vec_kernel(int8_t* q, int64_t ldq, float* scales, const T* x, int64_t k) {
    __shared__ float scratch[32];
    const T* xr = x + int64_t(blockIdx.x) * k;
    const int64_t nv = k / kVecElems;
    float v[kRowVecs][kVecElems];
    float amax = 0.0f;
#pragma unroll
    for (int r = 0; r < kRowVecs; ++r) {
        const int64_t j = threadIdx.x + int64_t(r) * blockDim.x;
        if (j >= nv) break;
        load_vec(xr + j * kVecElems, v[r]);
#pragma unroll
        for (int i = 0; i < kVecElems; ++i) amax = fmaxf(amax, fabsf(v[r][i]));
    }
    quantize_row_regs(v, nv, amax, q + int64_t(blockIdx.x) * ldq, ldq, scales + blockIdx.x, scratch);
}

// Threads for a register-resident row of n elements, or 0 when the row must take the scalar
// kernel (n not a multiple of 8, too long, or a pointer not aligned for the vector accesses).
unsigned vec_row_threads(int64_t n, std::initializer_list<const void*> ptrs16, const int8_t* q = nullptr,
                         int64_t ldq = 0) {
    if (n % kVecElems != 0) return 0;
    const int64_t nv = n / kVecElems;
    const int64_t threads = (ceil_div(nv, kRowVecs) + 31) / 32 * 32;
    if (threads > kMaxRowThreads) return 0;
    for (const void* p : ptrs16)
        if (p && !aligned_to(p, 16)) return 0;
    if (q && (ldq % kVecElems != 0 || !aligned_to(q, 8))) return 0;
    return unsigned(threads < 32 ? 32 : threads);
}

}  // namespace

void rmsnorm(void* out, const void* x, const float* w, int64_t m, int64_t n, float eps, DType act,
             cudaStream_t stream) {
    check_rows(m, "rmsnorm");
    if (m == 0) return;
    if (const unsigned threads = vec_row_threads(n, {out, x, w})) {
        // x is only read: add_rmsnorm with no add and no quantization is exactly rmsnorm.
        LATTICE_DISPATCH_ACT(act, add_rmsnorm_vec_kernel<T><<<unsigned(m), threads, 0, stream>>>(
                                      static_cast<T*>(const_cast<void*>(x)), nullptr, static_cast<T*>(out), nullptr,
                                      0, nullptr, w, n, eps));
    } else {
        LATTICE_DISPATCH_ACT(act, rmsnorm_kernel<T><<<unsigned(m), kRowThreads, 0, stream>>>(
                                      static_cast<T*>(out), static_cast<const T*>(x), w, n, eps));
    }
    CUDA_CHECK_LAUNCH();
}

void add_rmsnorm(void* residual, const void* x, void* out, const float* w, int64_t m, int64_t n, float eps, DType act,
                 cudaStream_t stream) {
    add_rmsnorm_quant(residual, x, out, nullptr, 0, nullptr, w, m, n, eps, act, stream);
}

void add_rmsnorm_quant(void* residual, const void* x, void* out, int8_t* q, int64_t ldq, float* scales, const float* w,
                       int64_t m, int64_t n, float eps, DType act, cudaStream_t stream) {
    check_rows(m, "add_rmsnorm");
    KERNEL_CHECK(!q || (ldq >= n && scales),
                 "cuda::add_rmsnorm_quant: ldq " + std::to_string(ldq) + " < n " + std::to_string(n) + " or no scales");
    if (m == 0) return;
    if (const unsigned threads = vec_row_threads(n, {residual, x, out, w}, q, ldq)) {
        LATTICE_DISPATCH_ACT(act, add_rmsnorm_vec_kernel<T><<<unsigned(m), threads, 0, stream>>>(
                                      static_cast<T*>(residual), static_cast<const T*>(x), static_cast<T*>(out), q,
                                      ldq, scales, w, n, eps));
    } else {
        LATTICE_DISPATCH_ACT(act, add_rmsnorm_kernel<T><<<unsigned(m), kRowThreads, 0, stream>>>(
                                      static_cast<T*>(residual), static_cast<const T*>(x), static_cast<T*>(out), q,
                                      ldq, scales, w, n, eps));
    }
    CUDA_CHECK_LAUNCH();
}

void quantize_rows(int8_t* q, int64_t ldq, float* scales, const void* x, int64_t m, int64_t k, DType act,
                   cudaStream_t stream) {
    check_rows(m, "quantize_rows");
    KERNEL_CHECK(ldq >= k, "cuda::quantize_rows: ldq " + std::to_string(ldq) + " < k " + std::to_string(k));
    if (m == 0) return;
    if (const unsigned threads = vec_row_threads(k, {x}, q, ldq)) {
        LATTICE_DISPATCH_ACT(act, quantize_vec_kernel<T><<<unsigned(m), threads, 0, stream>>>(
                                      q, ldq, scales, static_cast<const T*>(x), k));
    } else {
        LATTICE_DISPATCH_ACT(act, quantize_kernel<T><<<unsigned(m), kRowThreads, 0, stream>>>(
                                      q, ldq, scales, static_cast<const T*>(x), k));
    }
    CUDA_CHECK_LAUNCH();
}

void silu_mul(void* out, const void* gate_up, int64_t m, int64_t f, DType act, cudaStream_t stream) {
    silu_mul_quant(out, nullptr, 0, nullptr, gate_up, m, f, act, stream);
}

void silu_mul_quant(void* out, int8_t* q, int64_t ldq, float* scales, const void* gate_up, int64_t m, int64_t f,
                    DType act, cudaStream_t stream) {
    check_rows(m, "silu_mul");
    KERNEL_CHECK(!q || (ldq >= f && scales),
                 "cuda::silu_mul_quant: ldq " + std::to_string(ldq) + " < f " + std::to_string(f) + " or no scales");
    KERNEL_CHECK(out != nullptr, "cuda::silu_mul_quant: no output");
    if (m * f == 0) return;
    if (const unsigned threads = vec_row_threads(f, {out, gate_up}, q, ldq)) {
        LATTICE_DISPATCH_ACT(act, silu_mul_vec_kernel<T><<<unsigned(m), threads, 0, stream>>>(
                                      static_cast<T*>(out), q, ldq, scales, static_cast<const T*>(gate_up), f));
        CUDA_CHECK_LAUNCH();
        return;
    }
    // Scalar path: silu_mul, then (when asked) the quantization of its T-rounded output, which is
    // what the vector kernel computes in one pass.
    LATTICE_DISPATCH_ACT(act, silu_mul_kernel<T><<<grid_for(m * f), 256, 0, stream>>>(
                                  static_cast<T*>(out), static_cast<const T*>(gate_up), m, f));
    CUDA_CHECK_LAUNCH();
    if (q) quantize_rows(q, ldq, scales, out, m, f, act, stream);
}

}  // namespace lattice::cuda
