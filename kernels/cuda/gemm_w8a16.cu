// W8A16 GEMM for m > kGemvMaxRows (prefill chunks, large decode batches): y[m, n] = (x[m, k] . w[n, :k]^T)
// * sw[n] with int8 weights converted to the activation dtype inside the kernel, tile by tile, so no
// call ever writes a dequantized copy of the weight (the path before: dequantize all n x k weights
// into a scratch matrix, then a float GEMM, every call).
// Layout: x [m, k] contiguous in f16/bf16; w [n_alloc, ldw] int8, row = output channel, ldw a multiple
// of 16 >= k, columns [k, ldw) zero (make_linear pads them), w 16-byte aligned; sw [n] f32; out [m, n]
// contiguous, act or f32.
// Tiling: a block of 8 warps computes a 64 x 128 tile of y; per 32-wide k step it stages the x tile
// (64 x 32, 16-byte loads when k % 8 == 0 and x is aligned, else element by element with zeros past
// m and k) and the weight tile (128 rows x 32 bytes of int8, 16-byte loads, converted to the
// activation dtype: int8 values are exact in f16 and bf16) in shared memory, rows padded by 8
// elements against bank conflicts; each warp owns 32 x 32 of the tile as 2 x 2 WMMA 16x16x16
// fragments with fp32 accumulators. The per-channel scale is applied once in the epilogue (it
// commutes with the sum over k), from the accumulators staged through shared memory.
// Numerics: products of activation-dtype x and exact integer weights summed in fp32, scaled in fp32,
// rounded once to the output dtype: at least as accurate as dequantize-then-GEMM, which rounds every
// w * sw to the activation dtype first.
// Not tuned: single-stage (load, sync, mma, sync); cp.async double buffering and a larger k step are
// the next steps once a GPU run measures it against the dequantize + cuBLASLt path it replaces.
#include <mma.h>

#include <algorithm>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/kernels.h"

namespace lattice::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kBM = 64, kBN = 128, kBK = 32, kThreads = 256;
constexpr int kLds = kBK + 8;  // staged row length (elements): 80 bytes, a multiple of 16 (WMMA ldm)
constexpr int kLdc = kBN + 4;  // accumulator staging row (floats)
constexpr size_t kSmemAB = size_t(kBM + kBN) * kLds * 2;
constexpr size_t kSmemC = size_t(kBM) * kLdc * 4;
constexpr size_t kSmem = kSmemAB > kSmemC ? kSmemAB : kSmemC;  // 33 KiB: under the 48 KiB default
static_assert(kBM * kBK == kThreads * 8 && kBN * kBK == kThreads * 16, "one 16-byte load per thread per tile");

template <typename T, typename OutT, bool kVecX>
__global__ void __launch_bounds__(kThreads)
    w8a16_wmma_kernel(OutT* __restrict__ out, const T* __restrict__ x, const int8_t* __restrict__ w, int64_t ldw,
                      const float* __restrict__ sw, int64_t m, int64_t n, int64_t k) {
    extern __shared__ __align__(128) unsigned char smem[];
    T* as = reinterpret_cast<T*>(smem);          // [kBM][kLds]
    T* bs = as + kBM * kLds;                     // [kBN][kLds]: weight row j is column j of B (col-major k x n)
    float* cs = reinterpret_cast<float*>(smem);  // [kBM][kLdc], after the k loop
    const int tid = int(threadIdx.x), warp = tid >> 5;
    const int wm = warp / 4, wn = warp % 4;  // 2 x 4 warps of 32 x 32
    const int64_t m0 = int64_t(blockIdx.y) * kBM, n0 = int64_t(blockIdx.x) * kBN;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    const int xr = tid / 4, xc = (tid % 4) * 8;   // x tile: 8 elements per thread
    const int wr = tid / 2, wc = (tid % 2) * 16;  // weight tile: 16 bytes per thread
    for (int64_t k0 = 0; k0 < k; k0 += kBK) {
        {
            const int64_t gm = m0 + xr, gk = k0 + xc;
            T* dst = as + xr * kLds + xc;
            if (kVecX && gm < m && gk + 8 <= k) {
                *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(x + gm * k + gk);
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) dst[e] = gm < m && gk + e < k ? x[gm * k + gk + e] : from_f32<T>(0.0f);
            }
        }
        {
            const int64_t gn = n0 + wr, gk = k0 + wc;
            T* dst = bs + wr * kLds + wc;
            if (gn < n && gk < ldw) {  // ldw % 16 == 0: the 16 bytes lie inside the row (zeros past k)
                const int4 v = *reinterpret_cast<const int4*>(w + gn * ldw + gk);
                const int8_t* b = reinterpret_cast<const int8_t*>(&v);
#pragma unroll
                for (int e = 0; e < 16; ++e) dst[e] = from_f32<T>(float(b[e]));
            } else {
#pragma unroll
                for (int e = 0; e < 16; ++e) dst[e] = from_f32<T>(0.0f);
            }
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kBK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], as + (wm * 32 + i * 16) * kLds + kk, kLds);
#pragma unroll
            for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b[j], bs + (wn * 32 + j * 16) * kLds + kk, kLds);
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads();  // the tiles are overwritten next step (and by cs after the loop)
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(cs + (wm * 32 + i * 16) * kLdc + wn * 32 + j * 16, acc[i][j], kLdc,
                                    wmma::mem_row_major);
    __syncthreads();
    for (int idx = tid; idx < kBM * kBN; idx += kThreads) {
        const int r = idx / kBN, c = idx % kBN;
        const int64_t gm = m0 + r, gn = n0 + c;
        if (gm < m && gn < n) out[gm * n + gn] = from_f32<OutT>(cs[r * kLdc + c] * sw[gn]);
    }
}

template <typename T, typename OutT>
void launch(OutT* out, const T* x, const int8_t* w, int64_t ldw, const float* sw, int64_t m, int64_t n, int64_t k,
            cudaStream_t stream) {
    const dim3 grid(unsigned(ceil_div(n, kBN)), unsigned(ceil_div(m, kBM)));
    const bool vec = k % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
    if (vec)
        w8a16_wmma_kernel<T, OutT, true><<<grid, kThreads, kSmem, stream>>>(out, x, w, ldw, sw, m, n, k);
    else
        w8a16_wmma_kernel<T, OutT, false><<<grid, kThreads, kSmem, stream>>>(out, x, w, ldw, sw, m, n, k);
}

}  // namespace

void gemm_w8a16(void* out, const void* x, const int8_t* w, int64_t ldw, const float* sw, int64_t m, int64_t n,
                int64_t k, DType act, DType out_dtype, cudaStream_t stream) {
    KERNEL_CHECK(m >= 0 && n >= 0 && k >= 0 && ldw % 16 == 0 && ldw >= k && reinterpret_cast<uintptr_t>(w) % 16 == 0,
                 "cuda::gemm_w8a16: k " + std::to_string(k) + ", ldw " + std::to_string(ldw) +
                     " (multiple of 16 >= k), w 16-byte aligned");
    KERNEL_CHECK(out_dtype == act || out_dtype == DType::kF32, "cuda::gemm_w8a16: output dtype " +
                                                                   std::string(dtype_name(out_dtype)) +
                                                                   " (expected the activation dtype or f32)");
    KERNEL_CHECK(ceil_div(m, kBM) <= 65535, "cuda::gemm_w8a16: m = " + std::to_string(m) + " rows (grid too large)");
    if (m == 0 || n == 0) return;
    LATTICE_DISPATCH_ACT(act, {
        const T* xi = static_cast<const T*>(x);
        if (out_dtype == DType::kF32)
            launch<T, float>(static_cast<float*>(out), xi, w, ldw, sw, m, n, k, stream);
        else
            launch<T, T>(static_cast<T*>(out), xi, w, ldw, sw, m, n, k, stream);
    });
    CUDA_CHECK_LAUNCH();
}

}  // namespace lattice::cuda
