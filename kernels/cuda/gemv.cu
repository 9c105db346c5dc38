// Decode GEMVs (m <= kGemvMaxRows = 16 tokens) over int8 weights [n, ldw] with per-channel scales.
// Decode is weight-bandwidth bound: every weight byte is read from memory once per call and applied
// to all m rows, which live in registers.
//   w8a16: x stays fp16/bf16 (converted to fp32 as it is used), the int8 weight is converted to
//          fp32 exactly (magic-number trick, no I2F), FMA'd in fp32, scaled by sw[c] at the end.
//   w8a8:  x is pre-quantized per token; __dp4a accumulates in int32 (exact, identical to the
//          IMMA GEMM and the CPU reference), dequantized as float(acc) * (sx[i] * sw[c]).
// Work split: a block of 8 warps. Each warp owns kChannels = 4 consecutive output channels (one
// 16-byte weight load per channel and step, reused for the m rows, and each x load reused for
// the 4 channels) and one of `ks` k-slices: lane l of slice s reads the 16 bytes at
// k = (s * 32 + l) * 16 + t * ks * 512, t = 0, 1, ... The block's 8 / ks channel groups x ks slices
// are reduced in two stages: a butterfly across the warp that leaves each lane whole sums of a
// few (channel, row) pairs (about V shuffles for V = 4 m values instead of 5 V), then the ks
// slices through 2 KB of shared memory. ks (1, 2, 4, 8) is picked per call so that small n
// still fills the GPU (>= 16 warps per SM when k allows at least 2 steps per slice).
// Weights bypass L1 (ld.global.nc.L1::no_allocate, read once); x is read through L1 (__ldg), where
// the 8 warps of a block and the other blocks of the SM share it.
// Invariants. Checked: w 16-byte aligned (cudaMalloc), ldw % 16 == 0 and ldw >= k, so every
// 16-byte weight load at kb < k (kb % 16 == 0) ends inside its row; w8a8 also k, ldx multiples of
// 16 and xq 16-byte aligned. Assumed: w has n rows (warps clamp the rows of channels >= n and
// never store them); w8a8's xq and w are zero in [k_real, k) when k is the padded k (make_linear,
// quantize_rows). w8a16: x [m, k] contiguous; the fast kernel needs k % 4 == 0 and x 8-byte
// aligned (8-byte loads of 4 elements; a 4-group is wholly inside [0, k) or skipped, so the weight
// padding is never used), else a simple per-element kernel runs (any k; slow, never hot).
#include <type_traits>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/gemv_common.cuh"
#include "kernels/cuda/kernels.h"

namespace lattice::cuda {
namespace {

using namespace gemv_common;
constexpr int kStep = 32 * 16;  // k elements one warp covers per step (16 bytes of weights per lane)

// 4 int8 (one 32-bit word, little endian) -> 4 exact floats without I2F (a quarter-rate unit):
// byte b + 128 becomes the low mantissa byte of 2^23, so the float is 2^23 + 128 + b exactly.
__device__ __forceinline__ void i8x4_to_f32(uint32_t q, float (&f)[4]) {
    const uint32_t u = q ^ 0x80808080u;
    f[0] = __uint_as_float(__byte_perm(u, 0x4b000000u, 0x7440)) - 8388736.0f;
    f[1] = __uint_as_float(__byte_perm(u, 0x4b000000u, 0x7441)) - 8388736.0f;
    f[2] = __uint_as_float(__byte_perm(u, 0x4b000000u, 0x7442)) - 8388736.0f;
    f[3] = __uint_as_float(__byte_perm(u, 0x4b000000u, 0x7443)) - 8388736.0f;
}

// Warp reduction of V per-lane values v[0..V) into whole sums spread over the lanes.
// kHalvings butterfly steps (offsets 16, 8, ...) each send half of the live values to the partner
// and keep the other half; then the remaining offsets sum the kKeep values left in full. After
// it, v[j] of lane L holds the total of index(L, j); lanes with writer(L) hold distinct indices
// and together all V of them.
template <int V>
struct WarpSplitSum {
    static constexpr int halvings() {
        int h = 0;
        while (h < 5 && V % (2 << h) == 0) ++h;
        return h;
    }
    static constexpr int kHalvings = halvings();
    static constexpr int kKeep = V >> kHalvings;

    template <int Step, typename A>
    static __device__ __forceinline__ void halve(A (&v)[V], int lane) {
        if constexpr (Step < kHalvings) {
            constexpr int h = (V >> Step) / 2;
            constexpr int o = 16 >> Step;
            const bool up = (lane & o) != 0;
#pragma unroll
            for (int j = 0; j < h; ++j) {
                const A send = up ? v[j] : v[j + h];
                const A keep = up ? v[j + h] : v[j];
                v[j] = keep + __shfl_xor_sync(0xffffffffu, send, o);
            }
            halve<Step + 1>(v, lane);
        }
    }
    template <typename A>
    static __device__ __forceinline__ void run(A (&v)[V], int lane) {
        halve<0>(v, lane);
#pragma unroll
        for (int o = 16 >> kHalvings; o > 0; o >>= 1)
#pragma unroll
            for (int j = 0; j < kKeep; ++j) v[j] += __shfl_xor_sync(0xffffffffu, v[j], o);
    }
    static __device__ __forceinline__ bool writer(int lane) {
        return (lane & ((32 >> kHalvings) - 1)) == 0;
    }
    static __device__ __forceinline__ int index(int lane, int j) {
        int idx = j;
#pragma unroll
        for (int t = 0; t < kHalvings; ++t)
            if (lane & (16 >> t)) idx += V >> (t + 1);
        return idx;
    }
};

// Warp -> (channel group g, k-slice s) of the block, for ks = 1 << ks_log slices (powers of two:
// shifts, no integer division). c0: the group's first channel.
struct WarpRole {
    int lane, warp, g, s, ks_log, groups_log;
    int64_t c0;
};
__device__ __forceinline__ WarpRole warp_role(int ks_log) {
    WarpRole r;
    r.lane = threadIdx.x & 31;
    r.warp = threadIdx.x >> 5;
    r.ks_log = ks_log;
    r.groups_log = 3 - ks_log;  // kWarps = 8 = groups * ks
    r.g = r.warp & ((1 << r.groups_log) - 1);
    r.s = r.warp >> r.groups_log;
    r.c0 = ((int64_t(blockIdx.x) << r.groups_log) + r.g) * kChannels;
    return r;
}

// Reduces acc[c * M + i] (channel c, row i) over the warp and then over the block's ks slices;
// calls emit(i, channel, total) once per (row, channel < n) of the block. Every thread of the
// block must call it (it synchronizes).
template <int M, typename A, typename Emit>
__device__ __forceinline__ void block_reduce(A (&acc)[kChannels * M], A (&part)[kWarps][kChannels * M],
                                             const WarpRole& r, int64_t n, Emit&& emit) {
    constexpr int V = kChannels * M;
    using R = WarpSplitSum<V>;
    R::run(acc, r.lane);
    if (R::writer(r.lane)) {
#pragma unroll
        for (int j = 0; j < R::kKeep; ++j) part[r.warp][R::index(r.lane, j)] = acc[j];
    }
    __syncthreads();
    const int chs_log = r.groups_log + 2;  // kChannels = 4 channels per group
    const int chs = 1 << chs_log;          // channels of this block; consecutive threads -> channels
    for (int e = threadIdx.x; e < M * chs; e += kThreads) {
        const int i = e >> chs_log, cb = e & (chs - 1), g = cb / kChannels, c = cb % kChannels;
        const int64_t ch = (int64_t(blockIdx.x) << chs_log) + cb;
        if (ch >= n) continue;
        A sum = part[g][c * M + i];  // slice 0 is warp g
        for (int s = 1; s < (1 << r.ks_log); ++s) sum += part[(s << r.groups_log) + g][c * M + i];
        emit(i, ch, sum);
    }
}

// Blocks per SM the register budget must allow (ptxas caps registers to fit, and without the
// hint it picks its own cap and spills a few bytes): 2 (<= 128 registers) where that fits
// without spilling on sm_80/sm_90; the w8a16 kernels with 64+ fp32 accumulators (M >= 11) need
// up to ~175, so one block of 8 warps per SM (the FMAs, not the loads, bound them there).
constexpr int w8a16_min_blocks(int m) {
    return m <= 10 ? 2 : 1;
}
constexpr int kW8A8MinBlocks = 2;

template <typename T, typename O, int M>
__global__ void __launch_bounds__(kThreads, w8a16_min_blocks(M))
    gemv_w8a16_kernel(O* __restrict__ out, const T* __restrict__ x, const int8_t* __restrict__ w, int64_t ldw,
                      const float* __restrict__ sw, int64_t n, int64_t k, int ks_log) {
    constexpr int V = kChannels * M;
    __shared__ float part[kWarps][V];
    const WarpRole r = warp_role(ks_log);
    const int8_t* wr[kChannels];
#pragma unroll
    for (int c = 0; c < kChannels; ++c)
        wr[c] = w + (r.c0 + c < n ? r.c0 + c : n - 1) * ldw;  // rows past n: never stored
    float acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = 0.0f;
    if (r.c0 < n) {
        const int64_t stride = int64_t(kStep) << ks_log;
#pragma unroll 1  // 4 independent 16-byte loads per lane and step already; unrolling made ptxas spill
        for (int64_t kb = (int64_t(r.s) * 32 + r.lane) * 16; kb < k; kb += stride) {
            uint32_t wq[kChannels][4];
#pragma unroll
            for (int c = 0; c < kChannels; ++c) {
                const int4 v = load_weights(wr[c] + kb);
                wq[c][0] = uint32_t(v.x);
                wq[c][1] = uint32_t(v.y);
                wq[c][2] = uint32_t(v.z);
                wq[c][3] = uint32_t(v.w);
            }
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                if (q > 0 && kb + 4 * q >= k) break;  // k % 4 == 0: a 4-group is wholly in or out
                float wf[kChannels][4];
#pragma unroll
                for (int c = 0; c < kChannels; ++c) i8x4_to_f32(wq[c][q], wf[c]);
#pragma unroll
                for (int i = 0; i < M; ++i) {
                    float xf[4];
                    act4_to_f32<T>(__ldg(reinterpret_cast<const uint2*>(x + int64_t(i) * k + kb + 4 * q)), xf);
#pragma unroll
                    for (int c = 0; c < kChannels; ++c)
#pragma unroll
                        for (int e = 0; e < 4; ++e) acc[c * M + i] = fmaf(wf[c][e], xf[e], acc[c * M + i]);
                }
            }
        }
    }
    block_reduce<M>(acc, part, r, n,
                    [&](int i, int64_t ch, float v) { out[int64_t(i) * n + ch] = from_f32<O>(v * sw[ch]); });
}

// Any k, any x alignment: one warp per channel, one element per lane and step (correctness path).
template <typename T, typename O>
__global__ void __launch_bounds__(kThreads, 2)
    gemv_w8a16_any_kernel(O* __restrict__ out, const T* __restrict__ x, const int8_t* __restrict__ w, int64_t ldw,
                          const float* __restrict__ sw, int m, int64_t n, int64_t k) {
    const int lane = threadIdx.x & 31;
    const int64_t c = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
    if (c >= n) return;  // whole warps only
    float acc[kGemvMaxRows];
#pragma unroll
    for (int i = 0; i < kGemvMaxRows; ++i) acc[i] = 0.0f;
    for (int64_t j = lane; j < k; j += 32) {
        const float wf = float(w[c * ldw + j]);
#pragma unroll
        for (int i = 0; i < kGemvMaxRows; ++i)
            if (i < m) acc[i] = fmaf(wf, to_f32(x[int64_t(i) * k + j]), acc[i]);
    }
    const float s = sw[c];
#pragma unroll
    for (int i = 0; i < kGemvMaxRows; ++i) {
        if (i >= m) break;
        const float v = warp_sum(acc[i]);
        if (lane == 0) out[int64_t(i) * n + c] = from_f32<O>(v * s);
    }
}

template <typename O, int M>
__global__ void __launch_bounds__(kThreads, kW8A8MinBlocks)
    gemv_w8a8_kernel(O* __restrict__ out, const int8_t* __restrict__ xq, int64_t ldx, const float* __restrict__ sx,
                     const int8_t* __restrict__ w, int64_t ldw, const float* __restrict__ sw, int64_t n, int64_t k,
                     int ks_log) {
    constexpr int V = kChannels * M;
    __shared__ int part[kWarps][V];
    const WarpRole r = warp_role(ks_log);
    const int8_t* wr[kChannels];
#pragma unroll
    for (int c = 0; c < kChannels; ++c)
        wr[c] = w + (r.c0 + c < n ? r.c0 + c : n - 1) * ldw;  // rows past n: never stored
    int acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = 0;
    if (r.c0 < n) {
        const int64_t stride = int64_t(kStep) << ks_log;
#pragma unroll 1
        for (int64_t kb = (int64_t(r.s) * 32 + r.lane) * 16; kb < k; kb += stride) {  // k % 16 == 0: whole loads
            int4 wv[kChannels];
#pragma unroll
            for (int c = 0; c < kChannels; ++c) wv[c] = load_weights(wr[c] + kb);
#pragma unroll
            for (int i = 0; i < M; ++i) {
                const int4 xv = __ldg(reinterpret_cast<const int4*>(xq + int64_t(i) * ldx + kb));
#pragma unroll
                for (int c = 0; c < kChannels; ++c) {
                    int& a = acc[c * M + i];
                    a = __dp4a(wv[c].x, xv.x, a);
                    a = __dp4a(wv[c].y, xv.y, a);
                    a = __dp4a(wv[c].z, xv.z, a);
                    a = __dp4a(wv[c].w, xv.w, a);
                }
            }
        }
    }
    block_reduce<M>(acc, part, r, n, [&](int i, int64_t ch, int v) {
        out[int64_t(i) * n + ch] = from_f32<O>(float(v) * (sx[i] * sw[ch]));
    });
}

unsigned grid_for(int64_t n, int ks_log) {
    return unsigned(ceil_div(n, int64_t(kWarps >> ks_log) * kChannels));
}

template <typename T, typename O>
void run_w8a16(O* o, const T* x, const int8_t* w, int64_t ldw, const float* sw, int64_t m, int64_t n, int64_t k,
               cudaStream_t stream) {
    if (k % 4 != 0 || reinterpret_cast<uintptr_t>(x) % 8 != 0) {
        gemv_w8a16_any_kernel<T, O>
            <<<unsigned(ceil_div(n, kWarps)), kThreads, 0, stream>>>(o, x, w, ldw, sw, int(m), n, k);
        return;
    }
    const int ks_log = pick_slices_log(n, k, int64_t(4) * kStep);
    with_rows<kGemvMaxRows>(m, [&](auto rows) {
        gemv_w8a16_kernel<T, O, decltype(rows)::value>
            <<<grid_for(n, ks_log), kThreads, 0, stream>>>(o, x, w, ldw, sw, n, k, ks_log);
    });
}

template <typename O>
void run_w8a8(O* o, const int8_t* xq, int64_t ldx, const float* sx, const int8_t* w, int64_t ldw, const float* sw,
              int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
    const int ks_log = pick_slices_log(n, k, int64_t(4) * kStep);
    with_rows<kGemvMaxRows>(m, [&](auto rows) {
        gemv_w8a8_kernel<O, decltype(rows)::value>
            <<<grid_for(n, ks_log), kThreads, 0, stream>>>(o, xq, ldx, sx, w, ldw, sw, n, k, ks_log);
    });
}

void check_out(DType out_dtype, DType act, const char* op) {
    KERNEL_CHECK(out_dtype == act || out_dtype == DType::kF32, std::string("cuda::") + op + ": output dtype " +
                                                                   std::string(dtype_name(out_dtype)) +
                                                                   " (expected the activation dtype or f32)");
}

bool aligned16(const void* p) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

std::string rows_msg(const char* op, int64_t m) {
    return std::string("cuda::") + op + ": m = " + std::to_string(m) + " (1.." + std::to_string(kGemvMaxRows) + ")";
}

}  // namespace

void gemv_w8a16(void* out, const void* x, const int8_t* w, int64_t ldw, const float* sw, int64_t m, int64_t n,
                int64_t k, DType act, DType out_dtype, cudaStream_t stream) {
    KERNEL_CHECK(m >= 1 && m <= kGemvMaxRows, rows_msg("gemv_w8a16", m));
    KERNEL_CHECK(k >= 0 && ldw % 16 == 0 && ldw >= k && aligned16(w), "cuda::gemv_w8a16: k " + std::to_string(k) +
                                                                          ", ldw " + std::to_string(ldw) +
                                                                          " (multiple of 16 >= k), w 16-byte aligned");
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
    KERNEL_CHECK(m >= 1 && m <= kGemvMaxRows, rows_msg("gemv_w8a8", m));
    KERNEL_CHECK(k >= 0 && k % 16 == 0 && ldx % 16 == 0 && ldw % 16 == 0 && ldx >= k && ldw >= k && aligned16(xq) &&
                     aligned16(w),
                 "cuda::gemv_w8a8: k " + std::to_string(k) + ", ldx " + std::to_string(ldx) + ", ldw " +
                     std::to_string(ldw) + " must be multiples of 16 with ld >= k, xq and w 16-byte aligned");
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
