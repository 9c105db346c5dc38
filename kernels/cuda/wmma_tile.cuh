// The tensor-core tile shared by the weight-only GEMMs for m above the GEMV rows (gemm_w8a16.cu: int8
// weights; int4_gemm.cu: 4-bit weights): a block of 8 warps computes a 64 x 128 tile of y; per 32-wide k step
// it stages the x tile (64 x 32, 16-byte loads when the rows allow, else element by element with zeros past m
// and k) and the caller's weight tile (128 rows x 32, already in the activation dtype) in shared memory, rows
// padded by 8 elements against bank conflicts; each warp owns 32 x 32 of the tile as 2 x 2 WMMA 16x16x16
// fragments with fp32 accumulators. After the k loop the accumulators are staged through shared memory
// (over the x and weight tiles) and written out, times a per-channel scale where the caller has one.
// Shared memory: as [kBM][kLds] and bs [kBN][kLds] of T, later cs [kBM][kLdc] floats; kSmem bytes in all.
#pragma once

#include <mma.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/device_common.cuh"

namespace lattice::cuda::wmma_tile {

namespace wmma = nvcuda::wmma;

constexpr int kBM = 64, kBN = 128, kBK = 32, kThreads = 256;
constexpr int kLds = kBK + 8;  // staged row length (elements): 80 bytes, a multiple of 16 (WMMA ldm)
constexpr int kLdc = kBN + 4;  // accumulator staging row (floats)
constexpr size_t kSmemAB = size_t(kBM + kBN) * kLds * 2;
constexpr size_t kSmemC = size_t(kBM) * kLdc * 4;
constexpr size_t kSmem = kSmemAB > kSmemC ? kSmemAB : kSmemC;  // 33 KiB: under the 48 KiB default
static_assert(kBM * kBK == kThreads * 8, "one 16-byte x load per thread per tile");

using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// A block's place in the tile grid: its shared tiles, thread, warp tile (2 x 4 warps of 32 x 32) and origin
// (grid x: column tiles of kBN, grid y: row tiles of kBM).
template <typename T>
struct Block {
    T* as;      // [kBM][kLds]
    T* bs;      // [kBN][kLds]: weight row j is column j of B (col-major k x n)
    float* cs;  // [kBM][kLdc], over as and bs after the k loop
    int tid, wm, wn;
    int64_t m0, n0;
};
template <typename T>
__device__ __forceinline__ Block<T> block_of(unsigned char* smem) {
    const int tid = int(threadIdx.x), warp = tid >> 5;
    T* as = reinterpret_cast<T*>(smem);
    return Block<T>{as,       as + kBM * kLds, reinterpret_cast<float*>(smem), tid, warp / 4, warp % 4,
                    int64_t(blockIdx.y) * kBM, int64_t(blockIdx.x) * kBN};
}

__device__ __forceinline__ void zero(Acc (&acc)[2][2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
}

// Thread tid's 8 elements of the x tile at (m0, k0): x [m, ldx], columns >= k and rows >= m as zeros.
template <typename T, bool kVecX>
__device__ __forceinline__ void stage_x(T* as, const T* __restrict__ x, int64_t ldx, int64_t m, int64_t k, int64_t m0,
                                        int64_t k0, int tid) {
    const int xr = tid / 4, xc = (tid % 4) * 8;
    const int64_t gm = m0 + xr, gk = k0 + xc;
    T* dst = as + xr * kLds + xc;
    if (kVecX && gm < m && gk + 8 <= k) {
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(x + gm * ldx + gk);
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) dst[e] = gm < m && gk + e < k ? x[gm * ldx + gk + e] : from_f32<T>(0.0f);
    }
}

// The staged k step (kBK wide) into the warp's (wm, wn) 32 x 32 accumulators; bs: weight row j is column j
// of B (col-major k x n).
template <typename T>
__device__ __forceinline__ void mma_step(Acc (&acc)[2][2], const T* as, const T* bs, int wm, int wn) {
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
}

// The block's tile out (after the k loop's last barrier): out[gm * n + gn] = acc (times sw[gn] when kScale)
// for gm < m, gn < n. cs overlays the staged tiles.
template <typename OutT, bool kScale>
__device__ __forceinline__ void store_tile(OutT* __restrict__ out, float* cs, Acc (&acc)[2][2],
                                           const float* __restrict__ sw, int64_t m, int64_t n, int64_t m0, int64_t n0,
                                           int tid, int wm, int wn) {
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
        if (gm < m && gn < n) {
            if constexpr (kScale)
                out[gm * n + gn] = from_f32<OutT>(cs[r * kLdc + c] * sw[gn]);
            else
                out[gm * n + gn] = from_f32<OutT>(cs[r * kLdc + c]);
        }
    }
}

}  // namespace lattice::cuda::wmma_tile
