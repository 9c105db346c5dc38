// Pieces shared by the decode GEMVs over int8 weights (gemv.cu) and 4-bit weights (int4_gemm.cu): the block
// shape (8 warps, 4 output channels per warp), the streamed weight load, the activation conversion, the
// choice of k-slices per channel group and the dispatch of m to a compile-time row count.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/device_common.cuh"

namespace lattice::cuda::gemv_common {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kChannels = 4;  // output channels per warp

// 16 bytes of weights: streamed once, kept out of L1 so x stays there.
__device__ __forceinline__ int4 load_weights(const void* p) {
    int4 v;
    asm("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// 4 consecutive activations (8 bytes) -> floats.
template <typename T>
__device__ __forceinline__ void act4_to_f32(uint2 r, float (&f)[4]);
template <>
__device__ __forceinline__ void act4_to_f32<__half>(uint2 r, float (&f)[4]) {
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&r.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&r.y));
    f[0] = a.x;
    f[1] = a.y;
    f[2] = b.x;
    f[3] = b.y;
}
template <>
__device__ __forceinline__ void act4_to_f32<__nv_bfloat16>(uint2 r, float (&f)[4]) {
    f[0] = __uint_as_float(r.x << 16);
    f[1] = __uint_as_float(r.x & 0xffff0000u);
    f[2] = __uint_as_float(r.y << 16);
    f[3] = __uint_as_float(r.y & 0xffff0000u);
}

// Multiprocessors of the current device (asked once per thread and device).
inline int sm_count() {
    thread_local int device = -1, sms = 0;
    int d = 0;
    CUDA_CHECK(cudaGetDevice(&d));
    if (d != device) {
        CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d));
        device = d;
    }
    return sms;
}

// log2 of the k-slices per channel group: the fewest (1, 2, 4, 8) giving >= 16 warps per SM, while every slice
// keeps >= 2 steps: `work` (the k extent, in the caller's unit) >= min_work << ks_log.
inline int pick_slices_log(int64_t n, int64_t work, int64_t min_work) {
    const int64_t groups = ceil_div(n, kChannels), want = int64_t(16) * sm_count();
    int ks_log = 0;
    while (ks_log < 3 && (groups << ks_log) < want && work >= (min_work << ks_log)) ++ks_log;
    return ks_log;
}

// Calls f(std::integral_constant<int, M>) for M == m (1 <= m <= MaxM).
template <int MaxM, int M = 1, typename F>
void with_rows(int64_t m, F&& f) {
    if constexpr (M < MaxM) {
        if (m != M) return with_rows<MaxM, M + 1>(m, f);
    }
    f(std::integral_constant<int, M>{});
}

}  // namespace lattice::cuda::gemv_common
