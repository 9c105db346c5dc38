// Decode GEMVs (m <= kGemvMaxRows tokens) over int8 weights [n, ldw] with per-channel scales.
// Decode is weight-bandwidth bound, so each warp streams one output channel's weight row with
// 16-byte loads and applies it to all m rows held in registers; no shared memory, no tiles.
//   w8a16: x stays fp16/bf16, the int8 weight is converted and FMA'd in fp32, scaled at the end.
//   w8a8:  x is pre-quantized per token; __dp4a accumulates in int32 (exact, identical to the
//          IMMA GEMM and the CPU reference), dequantized by sx[i] * sw[c] at the end.
// Invariants: ldw % 16 == 0 and w is zero padded in [k, ldw) (make_linear guarantees both).
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/kernels.h"

namespace lattice::cuda {
namespace {

constexpr int kWarps = 8;

template <typename T, typename O, int M, bool kVecX>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_w8a16_kernel(O* out, const T* x, const int8_t* w, int64_t ldw, const float* sw, int64_t n, int64_t k) {
    const int lane = threadIdx.x & 31;
    const int64_t c = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
    if (c >= n) return;
    const int8_t* wr = w + c * ldw;
    float acc[M];
#pragma unroll
    for (int i = 0; i < M; ++i) acc[i] = 0.0f;
#pragma unroll 4
    for (int64_t kb = int64_t(lane) * 16; kb < k; kb += 32 * 16) {  // unrolled: several 16-byte loads in flight
        const int4 wv = __ldg(reinterpret_cast<const int4*>(wr + kb));
        const int8_t* wb = reinterpret_cast<const int8_t*>(&wv);
        float wf[16];
#pragma unroll
        for (int e = 0; e < 16; ++e) wf[e] = float(wb[e]);
#pragma unroll
        for (int i = 0; i < M; ++i) {
            const T* xr = x + int64_t(i) * k + kb;
            if (kVecX && kb + 16 <= k) {
                const int4 xv0 = *reinterpret_cast<const int4*>(xr);
                const int4 xv1 = *reinterpret_cast<const int4*>(xr + 8);
                const T* x0 = reinterpret_cast<const T*>(&xv0);
                const T* x1 = reinterpret_cast<const T*>(&xv1);
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[i] += wf[e] * to_f32(x0[e]) + wf[e + 8] * to_f32(x1[e]);
            } else {
#pragma unroll
                for (int e = 0; e < 16; ++e)
                    if (kb + e < k) acc[i] += wf[e] * to_f32(xr[e]);
            }
        }
    }
    const float s = sw[c];
#pragma unroll
    for (int i = 0; i < M; ++i) {
        const float v = warp_sum(acc[i]);
        if (lane == 0) out[int64_t(i) * n + c] = from_f32<O>(v * s);
    }
}

template <typename O, int M>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_w8a8_kernel(O* out, const int8_t* xq, int64_t ldx, const float* sx, const int8_t* w, int64_t ldw,
                     const float* sw, int64_t n, int64_t k) {
    const int lane = threadIdx.x & 31;
    const int64_t c = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
    if (c >= n) return;
    const int8_t* wr = w + c * ldw;
    int acc[M];
#pragma unroll
    for (int i = 0; i < M; ++i) acc[i] = 0;
#pragma unroll 4
    for (int64_t kb = int64_t(lane) * 16; kb < k; kb += 32 * 16) {  // unrolled: several 16-byte loads in flight
        const int4 wv = __ldg(reinterpret_cast<const int4*>(wr + kb));
#pragma unroll
        for (int i = 0; i < M; ++i) {
            const int4 xv = *reinterpret_cast<const int4*>(xq + int64_t(i) * ldx + kb);
            acc[i] = __dp4a(wv.x, xv.x, acc[i]);
            acc[i] = __dp4a(wv.y, xv.y, acc[i]);
            acc[i] = __dp4a(wv.z, xv.z, acc[i]);
            acc[i] = __dp4a(wv.w, xv.w, acc[i]);
        }
    }
    const float s = sw[c];
#pragma unroll
    for (int i = 0; i < M; ++i) {
        const int v = warp_sum_i(acc[i]);
        if (lane == 0) out[int64_t(i) * n + c] = from_f32<O>(float(v) * (sx[i] * s));
    }
}

template <typename T, typename O, int M>
void launch_w8a16(O* out, const T* x, const int8_t* w, int64_t ldw, const float* sw, int64_t n, int64_t k,
                  cudaStream_t stream) {
    const unsigned grid = unsigned(ceil_div(n, kWarps));
    const bool vec = k % 8 == 0 && (reinterpret_cast<uintptr_t>(x) % 16) == 0;
    if (vec)
        gemv_w8a16_kernel<T, O, M, true><<<grid, kWarps * 32, 0, stream>>>(out, x, w, ldw, sw, n, k);
    else
        gemv_w8a16_kernel<T, O, M, false><<<grid, kWarps * 32, 0, stream>>>(out, x, w, ldw, sw, n, k);
}

template <typename T, typename O>
void run_w8a16(O* o, const T* x, const int8_t* w, int64_t ldw, const float* sw, int64_t m, int64_t n, int64_t k,
               cudaStream_t stream) {
    switch (m) {
        case 1:
            launch_w8a16<T, O, 1>(o, x, w, ldw, sw, n, k, stream);
            break;
        case 2:
            launch_w8a16<T, O, 2>(o, x, w, ldw, sw, n, k, stream);
            break;
        case 3:
            launch_w8a16<T, O, 3>(o, x, w, ldw, sw, n, k, stream);
            break;
        case 4:
            launch_w8a16<T, O, 4>(o, x, w, ldw, sw, n, k, stream);
            break;
        case 5:
            launch_w8a16<T, O, 5>(o, x, w, ldw, sw, n, k, stream);
            break;
        case 6:
            launch_w8a16<T, O, 6>(o, x, w, ldw, sw, n, k, stream);
            break;
        case 7:
            launch_w8a16<T, O, 7>(o, x, w, ldw, sw, n, k, stream);
            break;
        default:
            launch_w8a16<T, O, 8>(o, x, w, ldw, sw, n, k, stream);
            break;
    }
}

template <typename O, int M>
void launch_w8a8(O* out, const int8_t* xq, int64_t ldx, const float* sx, const int8_t* w, int64_t ldw, const float* sw,
                 int64_t n, int64_t k, cudaStream_t stream) {
    gemv_w8a8_kernel<O, M>
        <<<unsigned(ceil_div(n, kWarps)), kWarps * 32, 0, stream>>>(out, xq, ldx, sx, w, ldw, sw, n, k);
}

template <typename O>
void run_w8a8(O* o, const int8_t* xq, int64_t ldx, const float* sx, const int8_t* w, int64_t ldw, const float* sw,
              int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
    switch (m) {
        case 1:
            launch_w8a8<O, 1>(o, xq, ldx, sx, w, ldw, sw, n, k, stream);
            break;
        case 2:
            launch_w8a8<O, 2>(o, xq, ldx, sx, w, ldw, sw, n, k, stream);
            break;
        case 3:
            launch_w8a8<O, 3>(o, xq, ldx, sx, w, ldw, sw, n, k, stream);
            break;
        case 4:
            launch_w8a8<O, 4>(o, xq, ldx, sx, w, ldw, sw, n, k, stream);
            break;
        case 5:
            launch_w8a8<O, 5>(o, xq, ldx, sx, w, ldw, sw, n, k, stream);
            break;
        case 6:
            launch_w8a8<O, 6>(o, xq, ldx, sx, w, ldw, sw, n, k, stream);
            break;
        case 7:
            launch_w8a8<O, 7>(o, xq, ldx, sx, w, ldw, sw, n, k, stream);
            break;
        default:
            launch_w8a8<O, 8>(o, xq, ldx, sx, w, ldw, sw, n, k, stream);
            break;
    }
}

void check_out(DType out_dtype, DType act, const char* op) {
    KERNEL_CHECK(out_dtype == act || out_dtype == DType::kF32, std::string("cuda::") + op + ": output dtype " +
                                                                   std::string(dtype_name(out_dtype)) +
                                                                   " (expected the activation dtype or f32)");
}

}  // namespace

void gemv_w8a16(void* out, const void* x, const int8_t* w, int64_t ldw, const float* sw, int64_t m, int64_t n,
                int64_t k, DType act, DType out_dtype, cudaStream_t stream) {
    KERNEL_CHECK(m >= 1 && m <= kGemvMaxRows, "cuda::gemv_w8a16: m = " + std::to_string(m) + " (1..8)");
    KERNEL_CHECK(ldw % 16 == 0 && ldw >= k, "cuda::gemv_w8a16: ldw " + std::to_string(ldw) + " for k " +
                                                std::to_string(k) + " (multiple of 16 >= k)");
    check_out(out_dtype, act, "gemv_w8a16");
    if (n == 0) return;
    LATTICE_DISPATCH_ACT(act, {
        const T* xi = static_cast<const T*>(x);
        if (out_dtype == DType::kF32)
            run_w8a16<T, float>(static_cast<float*>(out), xi, w, ldw, sw, m, n, k, stream);
        else
            run_w8a16<T, T>(static_cast<T*>(out), xi, w, ldw, sw, m, n, k, stream);
    });
    CUDA_CHECK_LAUNCH();
}

void gemv_w8a8(void* out, const int8_t* xq, int64_t ldx, const float* sx, const int8_t* w, int64_t ldw, const float* sw,
               int64_t m, int64_t n, int64_t k, DType act, DType out_dtype, cudaStream_t stream) {
    KERNEL_CHECK(m >= 1 && m <= kGemvMaxRows, "cuda::gemv_w8a8: m = " + std::to_string(m) + " (1..8)");
    KERNEL_CHECK(k % 16 == 0 && ldx % 16 == 0 && ldw % 16 == 0 && ldx >= k && ldw >= k,
                 "cuda::gemv_w8a8: k " + std::to_string(k) + ", ldx " + std::to_string(ldx) + ", ldw " +
                     std::to_string(ldw) + " must be multiples of 16 with ld >= k");
    check_out(out_dtype, act, "gemv_w8a8");
    if (n == 0) return;
    if (out_dtype == DType::kF32) {
        run_w8a8<float>(static_cast<float*>(out), xq, ldx, sx, w, ldw, sw, m, n, k, stream);
    } else {
        LATTICE_DISPATCH_ACT(act, run_w8a8<T>(static_cast<T*>(out), xq, ldx, sx, w, ldw, sw, m, n, k, stream));
    }
    CUDA_CHECK_LAUNCH();
}

}  // namespace lattice::cuda
