// The CUDA decode attention over an INT8 cache (attention_decode.cu's header: the design it shares; this
// kernel writes the same split workspace, merged by the same kernel).
#include <algorithm>
#include <cstring>

#include "kernels/common/quantize.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/kernels.h"

namespace lattice::cuda {
namespace {

using namespace attn;

// One block per (split, kv head x head chunk, token), as decode_split_kernel, writing the same
// workspace (m, l, unnormalized acc per q head and split) for decode_merge_kernel. Each warp takes the
// split's positions round robin: the K row's int8 values times its scale in registers (lane c holds
// dims c, c + 32, ...), a warp sum per q head for the scores, an online softmax per head, then the V
// row the same way into acc. The block's warps merge by log-sum-exp through shared memory
// ([kDecMaxHeads][hd] pre-scaled q, then [warps][kDecMaxHeads][hd] accumulators).
template <typename T>
__global__ void __launch_bounds__(kI8Warps * 32)
    decode_int8_kernel(const T* __restrict__ qkv, const int8_t* __restrict__ kc, const int8_t* __restrict__ vc,
                       DecodeArgs a) {
    extern __shared__ __align__(16) float i8_smem[];
    __shared__ float ml_sm[kI8Warps][kDecMaxHeads][2];
    const AttnDims& d = a.d;
    const int split = int(blockIdx.x);
    const int64_t token = blockIdx.z;
    const int kvh = int(blockIdx.y) / a.hchunks, hc = int(blockIdx.y) % a.hchunks;
    const int32_t pos = a.positions[token], seq = a.seqs[token];
    if (pos < 0 || pos >= d.max_seq || seq < 0 || seq >= a.kv.num_seqs) return;  // block-uniform
    const int64_t len = int64_t(pos) + 1;
    const int64_t lo = window_start(len, d.window);
    const int64_t chunk = decode_chunk(len - lo, a.splits);
    const int64_t start = lo + int64_t(split) * chunk;
    if (start >= len) return;  // block-uniform: an unused split
    const int64_t end = min(start + chunk, len);
    const int64_t hd = d.head_dim;
    const int h0 = kvh * a.group + hc * kDecMaxHeads;
    const int ng = min(kDecMaxHeads, a.group - hc * kDecMaxHeads);
    const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;

    float* qs = i8_smem;  // [kDecMaxHeads][hd], times the softmax scale
    const T* qrow = qkv + token * (d.n_heads + 2 * d.n_kv_heads) * hd;
    for (int64_t t = threadIdx.x; t < int64_t(ng) * hd; t += blockDim.x)
        qs[t] = to_f32(qrow[(h0 + t / hd) * hd + t % hd]) * d.scale;
    __syncthreads();

    float m_run[kDecMaxHeads], l_run[kDecMaxHeads], acc[kDecMaxHeads][kI8R];
#pragma unroll
    for (int g = 0; g < kDecMaxHeads; ++g) {
        m_run[g] = kNegInf;
        l_run[g] = 0.0f;
#pragma unroll
        for (int r = 0; r < kI8R; ++r) acc[g][r] = 0.0f;
    }
    for (int64_t p = start + warp; p < end; p += kI8Warps) {
        const Int8Row at = int8_row(a.kv, d, seq, p, kvh);
        if (at.values < 0) continue;  // warp-uniform: a table entry outside the cache
        const float ks = int8_scale_at(kc, at.scale), vs = int8_scale_at(vc, at.scale);
        float kr[kI8R], vr[kI8R];
#pragma unroll
        for (int r = 0; r < kI8R; ++r) {
            const int64_t c = lane + 32 * r;
            kr[r] = c < hd ? float(kc[at.values + c]) * ks : 0.0f;
            vr[r] = c < hd ? float(vc[at.values + c]) * vs : 0.0f;
        }
#pragma unroll
        for (int g = 0; g < kDecMaxHeads; ++g) {
            if (g >= ng) break;
            float part = 0.0f;
#pragma unroll
            for (int r = 0; r < kI8R; ++r) {
                const int64_t c = lane + 32 * r;
                if (c < hd) part = fmaf(qs[g * hd + c], kr[r], part);
            }
            const float sc = cap_score(warp_sum(part), d.softcap);  // q was pre-scaled
            const float m_new = fmaxf(m_run[g], sc);
            const float rescale = math::exp_f32(m_run[g] - m_new);
            const float w = math::exp_f32(sc - m_new);
            l_run[g] = l_run[g] * rescale + w;
            m_run[g] = m_new;
#pragma unroll
            for (int r = 0; r < kI8R; ++r) acc[g][r] = fmaf(w, vr[r], acc[g][r] * rescale);
        }
    }
    float* accs = i8_smem + kDecMaxHeads * hd;  // [warp][kDecMaxHeads][hd]
    __syncthreads();
#pragma unroll
    for (int g = 0; g < kDecMaxHeads; ++g) {
        if (g >= ng) break;
#pragma unroll
        for (int r = 0; r < kI8R; ++r) {
            const int64_t c = lane + 32 * r;
            if (c < hd) accs[(warp * kDecMaxHeads + g) * hd + c] = acc[g][r];
        }
        if (lane == 0) {
            ml_sm[warp][g][0] = m_run[g];
            ml_sm[warp][g][1] = l_run[g];
        }
    }
    __syncthreads();
    write_split<kDecMaxHeads>(a, ml_sm, accs, hd, token, h0, ng, split);
}

}  // namespace

namespace attn {

template <typename T>
void launch_decode_int8(dim3 grid, const DecodeArgs& a, const void* qkv, const void* k_cache, const void* v_cache,
                        cudaStream_t stream) {
    const size_t smem = size_t(1 + kI8Warps) * kDecMaxHeads * size_t(a.d.head_dim) * 4;  // <= 40 KiB
    decode_int8_kernel<T><<<grid, kI8Warps * 32, smem, stream>>>(
        static_cast<const T*>(qkv), static_cast<const int8_t*>(k_cache), static_cast<const int8_t*>(v_cache), a);
}
template void launch_decode_int8<__half>(dim3, const DecodeArgs&, const void*, const void*, const void*, cudaStream_t);
template void launch_decode_int8<__nv_bfloat16>(dim3, const DecodeArgs&, const void*, const void*, const void*,
                                                cudaStream_t);

}  // namespace attn

}  // namespace lattice::cuda
