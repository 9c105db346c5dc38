// CUDA W4A16: 4-bit weights (layout: kernels/cuda/int4_gemm.h) times fp16/bf16 activations, fp32 accumulation.
//
// Decode GEMV (m <= kInt4GemvMaxRows = 8): a block of 8 warps; a warp owns kChannels = 4 output channels and one
// of ks k-slices. Lane l of slice s reads, per step, the 16 bytes (one 32-column block, inside one group since
// G >= 32) of each of its 4 channels with one 128-bit load that bypasses L1 (read once), dequantizes them in
// registers (w = fma(q - c, d, m) from the group's f16 scale and zero point / minimum), and applies them to the
// m rows of x held in registers, which are read through L1 (__ldg: the block's warps share them). The weight
// bytes are therefore streamed from memory exactly once per call. A nibble becomes a float without I2F: the
// byte 0x0q placed under the exponent of 2^23 (one PRMT) is 2^23 + q, and subtracting 2^23 + c leaves q - c
// exactly. Per (channel, row) the warp sums its lanes (shuffles), then the ks slices are summed through shared
// memory. ks (1, 2, 4, 8) is picked per call so that small n still fills the GPU (>= 16 warps per SM when every
// slice keeps >= 2 steps), as the int8 GEMVs do (gemv.cu).
//
// Prefill GEMM (m > 8): the W8A16 tensor-core kernel's tiling (gemm_w8a16.cu: 64 x 128 tile per block of 8
// warps, 32-wide k steps, WMMA 16x16x16 with fp32 accumulators) with the weight tile dequantized from nibbles
// into the activation dtype in shared memory. A 32-wide k step is exactly one 16-byte nibble block per row, in
// one group, so each thread dequantizes 8 bytes (16 weights) with one (c, d, m) triple. Chosen over
// "dequantize the whole linear to an f16 scratch, then cuBLASLt" because it writes no n x k copy per call
// (that costs 2 bytes written and read per weight per chunk, more than the 4-bit read itself) and needs no
// workspace as large as the largest linear. Unlike W8A16 the group scale cannot be applied in the epilogue (it
// changes along k), so the dequantized weight is rounded to the activation dtype once (relative 2^-11 in f16,
// 2^-8 in bf16), the same rounding a dequantize-then-GEMM path has. Not tuned: single-stage like gemm_w8a16.
//
// Act-order (GPTQ perm) and k not a multiple of the group: int4_gather_rows writes the activations in stored
// column order, zero in [k, kp); the GEMV needs that form (its 32-column blocks run to kp, and padded columns'
// weights are not zero: q - 8 for offset8), the GEMM reads any row stride and masks columns >= k itself.
//
// Invariants. Checked: group 32 / 64 / 128, kp = k rounded up to the group, 1 <= m <= 8 for the GEMV, x 16-byte
// aligned for the GEMV. Assumed (CudaBackend::make_linear_int4 guarantees): qs rows of kp / 2 bytes from a
// 16-byte aligned base (kp / 2 is a multiple of 16), d / a [n][kp / G], perm a permutation of 0..k-1.
#include <algorithm>
#include <string>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/gemv_common.cuh"
#include "kernels/cuda/int4_gemm.h"
#include "kernels/cuda/wmma_tile.cuh"

namespace lattice::cuda {
namespace {

constexpr float kMagic = 8388608.0f;  // 2^23: 0x4b000000 | q is 2^23 + q for a byte q

// w = fma(q - c, d, m) for every weight of one (channel, group).
struct GroupParams {
    float c, d, m;
};

__device__ __forceinline__ float half_bits(const uint16_t* p, int64_t i) {
    return __half2float(__ushort_as_half(__ldg(reinterpret_cast<const unsigned short*>(p) + i)));
}

__device__ __forceinline__ GroupParams group_params(const Int4Dev& w, int64_t row, int64_t gi, int64_t groups) {
    const int64_t idx = row * groups + gi;
    const float d = half_bits(w.d, idx);
    const float a = w.a ? half_bits(w.a, idx) : 8.0f;
    return w.affine ? GroupParams{0.0f, d, a} : GroupParams{a, d, 0.0f};
}

// log2 of the 32-column blocks per group (group 32 / 64 / 128, checked by the launchers).
__device__ __forceinline__ int blocks_per_group_log(int64_t group) {
    return group == 32 ? 0 : group == 64 ? 1 : 2;
}

// ---------------------------------------------------------------------------------------------- gather
template <typename T>
__global__ void gather_kernel(T* __restrict__ xg, const T* __restrict__ x, const int32_t* __restrict__ perm, int64_t m,
                              int64_t k, int64_t kp) {
    const int64_t total = m * kp;
    for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
         idx += int64_t(gridDim.x) * blockDim.x) {
        const int64_t i = idx / kp, j = idx % kp;
        xg[idx] = j < k ? x[i * k + (perm ? int64_t(perm[j]) : j)] : from_f32<T>(0.0f);
    }
}

// ---------------------------------------------------------------------------------------------- GEMV
using namespace gemv_common;

// The 4 nibbles (one per byte, each < 16) of `u` dequantized: f = 2^23 + q exactly, f - (2^23 + c) = q - c.
__device__ __forceinline__ void dequant4(uint32_t u, float cm, float d, float m, float* f) {
    f[0] = fmaf(__uint_as_float(__byte_perm(u, 0x4b000000u, 0x7440)) - cm, d, m);
    f[1] = fmaf(__uint_as_float(__byte_perm(u, 0x4b000000u, 0x7441)) - cm, d, m);
    f[2] = fmaf(__uint_as_float(__byte_perm(u, 0x4b000000u, 0x7442)) - cm, d, m);
    f[3] = fmaf(__uint_as_float(__byte_perm(u, 0x4b000000u, 0x7443)) - cm, d, m);
}

// Blocks per SM the registers must allow: 2 for few rows; M > 4 keeps 32 M-dependent accumulators and the 32
// dequantized weights of a word step live, so one block of 8 warps per SM, no spills.
constexpr int w4a16_min_blocks(int m) {
    return m <= 4 ? 2 : 1;
}

template <typename T, typename O, int M>
__global__ void __launch_bounds__(kThreads, w4a16_min_blocks(M))
    gemv_w4a16_kernel(O* __restrict__ out, const T* __restrict__ x, const Int4Dev w, int ks_log) {
    constexpr int V = kChannels * M;
    __shared__ float part[kWarps][V];
    const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
    const int groups_log = 3 - ks_log;  // kWarps = 8 = channel groups * slices
    const int g = warp & ((1 << groups_log) - 1), s = warp >> groups_log;
    const int64_t c0 = ((int64_t(blockIdx.x) << groups_log) + g) * kChannels;
    const int64_t n = w.n, row_bytes = w.kp / 2, nb = w.kp / 32, groups = w.kp / w.group;
    const int bpg_log = blocks_per_group_log(w.group);
    int64_t rows[kChannels];
#pragma unroll
    for (int c = 0; c < kChannels; ++c) rows[c] = c0 + c < n ? c0 + c : n - 1;  // rows past n: never stored
    float acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = 0.0f;
    if (c0 < n) {
        const int64_t stride = int64_t(32) << ks_log;
#pragma unroll 1
        for (int64_t b = int64_t(s) * 32 + lane; b < nb; b += stride) {
            uint32_t wq[kChannels][4];
            float cm[kChannels], dd[kChannels], mm[kChannels];
            const int64_t gi = b >> bpg_log;
#pragma unroll
            for (int c = 0; c < kChannels; ++c) {
                const int4 v = load_weights(w.qs + rows[c] * row_bytes + b * 16);
                wq[c][0] = uint32_t(v.x);
                wq[c][1] = uint32_t(v.y);
                wq[c][2] = uint32_t(v.z);
                wq[c][3] = uint32_t(v.w);
                const GroupParams p = group_params(w, rows[c], gi, groups);
                cm[c] = kMagic + p.c;
                dd[c] = p.d;
                mm[c] = p.m;
            }
            // Word t of a block: bytes 4t..4t+3, low nibbles columns 4t..4t+3, high nibbles 16+4t..16+4t+3.
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                float wf[kChannels][8];
#pragma unroll
                for (int c = 0; c < kChannels; ++c) {
                    dequant4(wq[c][t] & 0x0F0F0F0Fu, cm[c], dd[c], mm[c], &wf[c][0]);
                    dequant4((wq[c][t] >> 4) & 0x0F0F0F0Fu, cm[c], dd[c], mm[c], &wf[c][4]);
                }
#pragma unroll
                for (int i = 0; i < M; ++i) {
                    const T* xr = x + int64_t(i) * w.kp + b * 32 + 4 * t;
                    float xl[4], xh[4];
                    act4_to_f32<T>(__ldg(reinterpret_cast<const uint2*>(xr)), xl);
                    act4_to_f32<T>(__ldg(reinterpret_cast<const uint2*>(xr + 16)), xh);
#pragma unroll
                    for (int c = 0; c < kChannels; ++c)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            acc[c * M + i] = fmaf(wf[c][e], xl[e], acc[c * M + i]);
                            acc[c * M + i] = fmaf(wf[c][4 + e], xh[e], acc[c * M + i]);
                        }
                }
            }
        }
    }
    // Lanes, then slices (every thread reaches the barrier).
#pragma unroll
    for (int j = 0; j < V; ++j) {
        const float v = warp_sum(acc[j]);
        if (lane == 0) part[warp][j] = v;
    }
    __syncthreads();
    const int chs_log = groups_log + 2;  // kChannels = 4 channels per group
    const int chs = 1 << chs_log;
    for (int e = int(threadIdx.x); e < M * chs; e += kThreads) {
        const int i = e >> chs_log, cb = e & (chs - 1), gg = cb / kChannels, c = cb % kChannels;
        const int64_t ch = (int64_t(blockIdx.x) << chs_log) + cb;
        if (ch >= n) continue;
        float sum = part[gg][c * M + i];  // slice 0 is warp gg
        for (int sl = 1; sl < (1 << ks_log); ++sl) sum += part[(sl << groups_log) + gg][c * M + i];
        out[int64_t(i) * n + ch] = from_f32<O>(sum);
    }
}

template <typename T, typename O>
void run_gemv(O* o, const T* x, const Int4Dev& w, int64_t m, cudaStream_t stream) {
    const int ks_log = pick_slices_log(w.n, w.kp / 32, 128);  // >= 2 steps of 32 blocks a slice
    const unsigned grid = unsigned(ceil_div(w.n, int64_t(kWarps >> ks_log) * kChannels));
    with_rows<kInt4GemvMaxRows>(m, [&](auto rows) {
        gemv_w4a16_kernel<T, O, decltype(rows)::value><<<grid, kThreads, 0, stream>>>(o, x, w, ks_log);
    });
}

// ---------------------------------------------------------------------------------------------- GEMM
namespace wt = wmma_tile;
static_assert(wt::kBN * wt::kBK == wt::kThreads * 16, "8 nibble bytes (16 weights) per thread per tile");

template <typename T, typename OutT, bool kVecX>
__global__ void __launch_bounds__(wt::kThreads)
    w4a16_wmma_kernel(OutT* __restrict__ out, const T* __restrict__ x, int64_t ldx, const Int4Dev w, int64_t m) {
    using wt::kBK;
    using wt::kLds;
    extern __shared__ __align__(128) unsigned char smem[];
    const auto [as, bs, cs, tid, wm, wn, m0, n0] = wt::block_of<T>(smem);
    const int64_t n = w.n, k = w.k, row_bytes = w.kp / 2, groups = w.kp / w.group;

    wt::Acc acc[2][2];
    wt::zero(acc);

    const int wr = tid / 2, wh = (tid % 2) * 8;  // weight tile: bytes wh..wh+7 of row wr's 16-byte block
    const T zero = from_f32<T>(0.0f);
    for (int64_t k0 = 0; k0 < k; k0 += kBK) {
        wt::stage_x<T, kVecX>(as, x, ldx, m, k, m0, k0, tid);
        {
            const int64_t gn = n0 + wr;
            T* dst = bs + wr * kLds;
            if (gn < n) {  // k0 < k <= kp: the block exists; k0 / 2 is its byte offset (k0 % 32 == 0)
                const uint2 v = *reinterpret_cast<const uint2*>(w.qs + gn * row_bytes + k0 / 2 + wh);
                const GroupParams p = group_params(w, gn, k0 / w.group, groups);
                const uint32_t words[2] = {v.x, v.y};
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    const uint32_t byte = (words[e / 4] >> (8 * (e % 4))) & 0xFFu;
                    const int lo = wh + e, hi = 16 + wh + e;
                    // Columns past k are masked (x is zero there, but a huge dequantized weight could be inf).
                    dst[lo] = k0 + lo < k ? from_f32<T>(fmaf(float(byte & 15u) - p.c, p.d, p.m)) : zero;
                    dst[hi] = k0 + hi < k ? from_f32<T>(fmaf(float(byte >> 4) - p.c, p.d, p.m)) : zero;
                }
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    dst[wh + e] = zero;
                    dst[16 + wh + e] = zero;
                }
            }
        }
        __syncthreads();
        wt::mma_step(acc, as, bs, wm, wn);
        __syncthreads();  // the tiles are overwritten next step (and by cs after the loop)
    }
    wt::store_tile<OutT, false>(out, cs, acc, nullptr, m, n, m0, n0, tid, wm, wn);
}

template <typename T, typename OutT>
void run_gemm(OutT* out, const T* x, int64_t ldx, const Int4Dev& w, int64_t m, cudaStream_t stream) {
    const dim3 grid(unsigned(ceil_div(w.n, wt::kBN)), unsigned(ceil_div(m, wt::kBM)));
    const bool vec = ldx % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
    if (vec)
        w4a16_wmma_kernel<T, OutT, true><<<grid, wt::kThreads, wt::kSmem, stream>>>(out, x, ldx, w, m);
    else
        w4a16_wmma_kernel<T, OutT, false><<<grid, wt::kThreads, wt::kSmem, stream>>>(out, x, ldx, w, m);
}

void check_weights(const Int4Dev& w, const char* op) {
    const bool group_ok = w.group == 32 || w.group == 64 || w.group == 128;
    KERNEL_CHECK(group_ok && w.n >= 0 && w.k >= 0 && w.kp == (w.k + w.group - 1) / w.group * w.group && w.qs && w.d &&
                     (w.a || !w.affine) && reinterpret_cast<uintptr_t>(w.qs) % 16 == 0,
                 std::string("cuda::") + op + ": 4-bit weights [" + std::to_string(w.n) + ", " + std::to_string(w.k) +
                     "], group " + std::to_string(w.group) + ", kp " + std::to_string(w.kp) +
                     " (group 32/64/128, kp = k rounded up to it, nibbles 16-byte aligned, minimums for affine)");
}

void check_out(DType out_dtype, DType act, const char* op) {
    KERNEL_CHECK(out_dtype == act || out_dtype == DType::kF32, std::string("cuda::") + op + ": output dtype " +
                                                                   std::string(dtype_name(out_dtype)) +
                                                                   " (expected the activation dtype or f32)");
}

}  // namespace

void int4_gather_rows(void* xg, const void* x, const int32_t* perm, int64_t m, int64_t k, int64_t kp, DType act,
                      cudaStream_t stream) {
    KERNEL_CHECK(m >= 0 && k >= 0 && kp >= k, "cuda::int4_gather_rows: m " + std::to_string(m) + ", k " +
                                                  std::to_string(k) + ", kp " + std::to_string(kp));
    if (m == 0 || kp == 0) return;
    const unsigned grid = unsigned(std::min<int64_t>(ceil_div(m * kp, 256), 8192));
    LATTICE_DISPATCH_ACT(
        act, gather_kernel<T><<<grid, 256, 0, stream>>>(static_cast<T*>(xg), static_cast<const T*>(x), perm, m, k, kp));
    CUDA_CHECK_LAUNCH();
}

void gemv_w4a16(void* out, const void* x, const Int4Dev& w, int64_t m, DType act, DType out_dtype,
                cudaStream_t stream) {
    KERNEL_CHECK(m >= 1 && m <= kInt4GemvMaxRows,
                 "cuda::gemv_w4a16: m = " + std::to_string(m) + " (1.." + std::to_string(kInt4GemvMaxRows) + ")");
    check_weights(w, "gemv_w4a16");
    KERNEL_CHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0, "cuda::gemv_w4a16: x must be 16-byte aligned");
    check_out(out_dtype, act, "gemv_w4a16");
    if (w.n == 0) return;
    LATTICE_DISPATCH_ACT(act, {
        const T* xi = static_cast<const T*>(x);
        if (out_dtype == DType::kF32)
            run_gemv<T, float>(static_cast<float*>(out), xi, w, m, stream);
        else
            run_gemv<T, T>(static_cast<T*>(out), xi, w, m, stream);
    });
    CUDA_CHECK_LAUNCH();
}

void gemm_w4a16(void* out, const void* x, int64_t ldx, const Int4Dev& w, int64_t m, DType act, DType out_dtype,
                cudaStream_t stream) {
    check_weights(w, "gemm_w4a16");
    KERNEL_CHECK(m >= 0 && ldx >= w.k, "cuda::gemm_w4a16: m " + std::to_string(m) + ", ldx " + std::to_string(ldx) +
                                           " (>= k = " + std::to_string(w.k) + ")");
    KERNEL_CHECK(ceil_div(m, wt::kBM) <= 65535,
                 "cuda::gemm_w4a16: m = " + std::to_string(m) + " rows (grid too large)");
    check_out(out_dtype, act, "gemm_w4a16");
    if (m == 0 || w.n == 0) return;
    LATTICE_DISPATCH_ACT(act, {
        const T* xi = static_cast<const T*>(x);
        if (out_dtype == DType::kF32)
            run_gemm<T, float>(static_cast<float*>(out), xi, ldx, w, m, stream);
        else
            run_gemm<T, T>(static_cast<T*>(out), xi, ldx, w, m, stream);
    });
    CUDA_CHECK_LAUNCH();
}

}  // namespace lattice::cuda
