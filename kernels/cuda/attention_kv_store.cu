// kv_store of the CUDA attention (layouts and the INT8 cache: attention_decode.cu's header): one block per
// token writes its k and v rows into their blocks; an INT8 cache quantizes each row on the way (one scale per
// row, kernels/common/quantize.h's math, so the CPU op stores the same bytes for the same input).
#include <algorithm>
#include <cstring>

#include "kernels/common/quantize.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/kernels.h"

namespace lattice::cuda {
namespace {

using namespace attn;

template <typename T>
__global__ void kv_store_kernel(T* kc, T* vc, const T* qkv, const int32_t* positions, const int32_t* seqs,
                                KvTables kv, AttnDims d) {
    const int64_t i = blockIdx.x;
    const int64_t base = kv_offset(kv, d, seqs[i], positions[i], 0);
    if (base < 0) return;
    const int64_t row_len = (d.n_heads + 2 * d.n_kv_heads) * d.head_dim;
    const T* k = qkv + i * row_len + d.n_heads * d.head_dim;
    const T* v = k + d.n_kv_heads * d.head_dim;
    const int64_t kvw = d.n_kv_heads * d.head_dim;
    for (int64_t t = threadIdx.x; t < kvw; t += blockDim.x) {
        kc[base + t] = k[t];
        vc[base + t] = v[t];
    }
}

// One block per token; each warp quantizes whole rows ((kv head, k or v) pairs round robin): the
// row's absmax by a warp reduction (order-independent: the same scale as the CPU's), then each value.
template <typename T>
__global__ void kv_store_int8_kernel(int8_t* kc, int8_t* vc, const T* qkv, const int32_t* positions,
                                     const int32_t* seqs, KvTables kv, AttnDims d) {
    const int64_t i = blockIdx.x, hd = d.head_dim;
    const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5, warps = int(blockDim.x) >> 5;
    const int64_t row_len = (d.n_heads + 2 * d.n_kv_heads) * hd;
    for (int64_t job = warp; job < 2 * d.n_kv_heads; job += warps) {
        const int64_t g = job >> 1;
        const bool is_v = (job & 1) != 0;
        const Int8Row at = int8_row(kv, d, seqs[i], positions[i], g);
        if (at.values < 0) continue;  // warp-uniform
        const T* x = qkv + i * row_len + (d.n_heads + (is_v ? d.n_kv_heads : 0) + g) * hd;
        float amax = 0.0f;
        for (int64_t c = lane; c < hd; c += 32) amax = fmaxf(amax, fabsf(to_f32(x[c])));
        amax = warp_max(amax);
        const float s = int8_scale_from_absmax(amax);
        int8_t* cache = is_v ? vc : kc;
        for (int64_t c = lane; c < hd; c += 32) cache[at.values + c] = quantize_int8_value(to_f32(x[c]), s);
        if (lane == 0) memcpy(cache + at.scale, &s, 4);
    }
}

}  // namespace

void kv_store(void* k_cache, void* v_cache, const void* qkv, const int32_t* positions, const int32_t* seqs,
              const KvTables& kv, int64_t m, const AttnDims& d, DType act, cudaStream_t stream) {
    check_dims(d, "kv_store");
    if (m == 0) return;
    if (d.kv_int8) {
        LATTICE_DISPATCH_ACT(act, kv_store_int8_kernel<T><<<unsigned(m), 128, 0, stream>>>(
                                      static_cast<int8_t*>(k_cache), static_cast<int8_t*>(v_cache),
                                      static_cast<const T*>(qkv), positions, seqs, kv, d));
        CUDA_CHECK_LAUNCH();
        return;
    }
    LATTICE_DISPATCH_ACT(
        act, kv_store_kernel<T><<<unsigned(m), 256, 0, stream>>>(static_cast<T*>(k_cache), static_cast<T*>(v_cache),
                                                                 static_cast<const T*>(qkv), positions, seqs, kv, d));
    CUDA_CHECK_LAUNCH();
}

}  // namespace lattice::cuda
