// W8A16 GEMM for m > kGemvMaxRows (prefill chunks, large decode batches): y[m, n] = (x[m, k] . w[n, :k]^T)
// * sw[n] with int8 weights converted to the activation dtype inside the kernel, tile by tile, so no
// call ever writes a dequantized copy of the weight (the path before: dequantize all n x k weights
// into a scratch matrix, then a float GEMM, every call).
// Layout: x [m, k] contiguous in f16/bf16; w [n_alloc, ldw] int8, row = output channel, ldw a multiple
// of 16 >= k, columns [k, ldw) zero (make_linear pads them), w 16-byte aligned; sw [n] f32; out [m, n]
// contiguous, act or f32.
// Tiling: wmma_tile.cuh's 64 x 128 tile per block of 8 warps (x staged with 16-byte loads when k % 8 == 0
// and x is aligned); the weight tile here is 128 rows x 32 bytes of int8, 16-byte loads, converted to the
// activation dtype (int8 values are exact in f16 and bf16). The per-channel scale is applied once in the
// epilogue (it commutes with the sum over k), from the accumulators staged through shared memory.
// Numerics: products of activation-dtype x and exact integer weights summed in fp32, scaled in fp32,
// rounded once to the output dtype: at least as accurate as dequantize-then-GEMM, which rounds every
// w * sw to the activation dtype first.
// Not tuned: single-stage (load, sync, mma, sync); cp.async double buffering and a larger k step are
// the next steps once a GPU run measures it against the dequantize + cuBLASLt path it replaces.
#include <algorithm>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/wmma_tile.cuh"

namespace lattice::cuda {
namespace {

using namespace wmma_tile;
static_assert(kBN * kBK == kThreads * 16, "16 weight bytes per thread per tile");

template <typename T, typename OutT, bool kVecX>
__global__ void __launch_bounds__(kThreads)
    w8a16_wmma_kernel(OutT* __restrict__ out, const T* __restrict__ x, const int8_t* __restrict__ w, int64_t ldw,
                      const float* __restrict__ sw, int64_t m, int64_t n, int64_t k) {
    extern __shared__ __align__(128) unsigned char smem[];
    const auto [as, bs, cs, tid, wm, wn, m0, n0] = block_of<T>(smem);

    Acc acc[2][2];
    zero(acc);

    const int wr = tid / 2, wc = (tid % 2) * 16;  // weight tile: 16 bytes per thread
    for (int64_t k0 = 0; k0 < k; k0 += kBK) {
        stage_x<T, kVecX>(as, x, k, m, k, m0, k0, tid);
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
        mma_step(acc, as, bs, wm, wn);
        __syncthreads();  // the tiles are overwritten next step (and by cs after the loop)
    }
    store_tile<OutT, true>(out, cs, acc, sw, m, n, m0, n0, tid, wm, wn);
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
