// attention_prefill of the CUDA attention: a block owns a tile of <= 32 query rows of one sequence and one q
// head, walks the sequence's KV in 32-position tiles through shared memory (an INT8 cache's tiles converted as
// they are staged), and keeps per-row (max, sum, acc) in registers; causal by each row's position, a sliding
// window masking each row's keys before its own start, each score soft-capped after its scale where
// AttnDims::softcap is set (attention_decode.cu's header has the cache layout).
#include <algorithm>
#include <cstring>

#include "kernels/common/quantize.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/kernels.h"

namespace lattice::cuda {
namespace {

using namespace attn;

// ---- prefill ----
constexpr int kPrefillWarps = 4;
constexpr int kKvTile = 32;
constexpr int kRowsPerWarp = kPrefillRows / kPrefillWarps;

template <typename T>
__device__ __forceinline__ float dot_smem(const T* a, const T* b, int64_t hd) {
    float s = 0.0f;
    for (int64_t k = 0; k < hd; ++k) s += to_f32(a[k]) * to_f32(b[k]);
    return s;
}

template <typename T>
__global__ void __launch_bounds__(kPrefillWarps * 32)
    prefill_kernel(T* out, const T* qkv, const void* kcache, const void* vcache, const int32_t* positions,
                   const PrefillTile* tiles, KvTables kv, AttnDims d) {
    const T* kc = static_cast<const T*>(kcache);
    const T* vc = static_cast<const T*>(vcache);
    const int8_t* kc8 = static_cast<const int8_t*>(kcache);
    const int8_t* vc8 = static_cast<const int8_t*>(vcache);
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const PrefillTile tile = tiles[blockIdx.x];
    const int64_t h = blockIdx.y, hd = d.head_dim, nkv = d.n_kv_heads, ld = hd + 2;  // +2: no bank conflicts
    const int64_t kvh = h / (d.n_heads / nkv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    T* qs = reinterpret_cast<T*>(smem_raw);
    T* ks = qs + kPrefillRows * ld;
    T* vs = ks + kKvTile * ld;
    const int64_t row_len = (d.n_heads + 2 * nkv) * hd;

    for (int64_t t = threadIdx.x; t < kPrefillRows * hd; t += blockDim.x) {
        const int64_t r = t / hd, c = t % hd;
        qs[r * ld + c] = r < tile.count ? qkv[(tile.start + r) * row_len + h * hd + c] : from_f32<T>(0.0f);
    }
    int32_t row_pos[kRowsPerWarp];
    float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kMaxR];
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const int row = warp + kPrefillWarps * rr;
        row_pos[rr] = row < tile.count ? positions[tile.start + row] : -1;
        m[rr] = kNegInf;
        l[rr] = 0.0f;
#pragma unroll
        for (int r = 0; r < kMaxR; ++r) acc[rr][r] = 0.0f;
    }
    // Rows' positions increase along the tile: the first row's window start bounds every row's.
    const int64_t first = window_start(int64_t(positions[tile.start]) + 1, d.window);
    for (int64_t kt = first / kKvTile * kKvTile; kt < tile.kv_len; kt += kKvTile) {
        __syncthreads();
        for (int64_t t = threadIdx.x; t < kKvTile * hd; t += blockDim.x) {
            const int64_t j = t / hd, c = t % hd, p = kt + j;
            if (d.kv_int8) {  // the tile's rows as the activation type, each value times its row's scale
                const Int8Row at = p < tile.kv_len ? int8_row(kv, d, tile.seq, p, kvh) : Int8Row{};
                ks[j * ld + c] = at.values >= 0 ? from_f32<T>(float(kc8[at.values + c]) * int8_scale_at(kc8, at.scale))
                                                : from_f32<T>(0.0f);
                vs[j * ld + c] = at.values >= 0 ? from_f32<T>(float(vc8[at.values + c]) * int8_scale_at(vc8, at.scale))
                                                : from_f32<T>(0.0f);
                continue;
            }
            const int64_t off = p < tile.kv_len ? kv_offset(kv, d, tile.seq, p, kvh) : -1;
            ks[j * ld + c] = off >= 0 ? kc[off + c] : from_f32<T>(0.0f);
            vs[j * ld + c] = off >= 0 ? vc[off + c] : from_f32<T>(0.0f);
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < kRowsPerWarp; ++rr) {
            const int row = warp + kPrefillWarps * rr;
            if (row_pos[rr] < kt) continue;  // row absent, or the whole KV tile is in its future
            const int64_t lo = window_start(int64_t(row_pos[rr]) + 1, d.window);
            if (kt + kKvTile <= lo) continue;  // the whole KV tile is before the row's window
            const bool valid = kt + lane <= row_pos[rr] && kt + lane >= lo;
            float s = valid ? cap_score(dot_smem(qs + row * ld, ks + lane * ld, hd) * d.scale, d.softcap) : kNegInf;
            const float m_new = fmaxf(m[rr], warp_max(s));
            const float rescale = math::exp_f32(m[rr] - m_new);
            const float p = valid ? math::exp_f32(s - m_new) : 0.0f;
            l[rr] = l[rr] * rescale + warp_sum(p);
            m[rr] = m_new;
#pragma unroll
            for (int r = 0; r < kMaxR; ++r) acc[rr][r] *= rescale;
            for (int j = 0; j < kKvTile; ++j) {
                const float pj = __shfl_sync(0xffffffffu, p, j);
                if (pj == 0.0f) continue;  // uniform across the warp
#pragma unroll
                for (int r = 0; r < kMaxR; ++r) {
                    const int64_t dd = lane + 32 * r;
                    if (dd < hd) acc[rr][r] += pj * to_f32(vs[j * ld + dd]);
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const int row = warp + kPrefillWarps * rr;
        if (row >= tile.count) continue;
        T* o = out + (tile.start + row) * d.n_heads * hd + h * hd;
        const float inv = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
#pragma unroll
        for (int r = 0; r < kMaxR; ++r) {
            const int64_t dd = lane + 32 * r;
            if (dd < hd) o[dd] = from_f32<T>(acc[rr][r] * inv);
        }
    }
}

}  // namespace

void attention_prefill(void* out, const void* qkv, const void* k_cache, const void* v_cache, const int32_t* positions,
                       const PrefillTile* tiles, int64_t n_tiles, const KvTables& kv, const AttnDims& d, DType act,
                       cudaStream_t stream) {
    check_dims(d, "attention_prefill");
    KERNEL_CHECK(n_tiles <= 0x7fffffff && d.n_heads <= 65535, "cuda::attention_prefill: grid too large");
    if (n_tiles == 0) return;
    const size_t smem = size_t(kPrefillRows + 2 * kKvTile) * size_t(d.head_dim + 2) * 2;
    const dim3 grid(unsigned(n_tiles), unsigned(d.n_heads));
    LATTICE_DISPATCH_ACT(act, {
        if (smem > 48 * 1024)
            CUDA_CHECK(cudaFuncSetAttribute(prefill_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        prefill_kernel<T><<<grid, kPrefillWarps * 32, smem, stream>>>(static_cast<T*>(out), static_cast<const T*>(qkv),
                                                                        k_cache, v_cache, positions, tiles, kv, d);
    });
    CUDA_CHECK_LAUNCH();
}

int64_t build_prefill_tiles(PrefillTile* tiles, const int32_t* positions, const int32_t* seqs, int64_t m) {
    int64_t n = 0;
    for (int64_t i = 0; i < m; ++i) {
        PrefillTile* cur = n > 0 ? &tiles[n - 1] : nullptr;
        const bool extend = cur && cur->seq == seqs[i] && cur->start + cur->count == i && cur->count < kPrefillRows;
        if (extend) {
            KERNEL_CHECK(positions[i] > positions[i - 1],
                         "attention: token " + std::to_string(i) + " of sequence " + std::to_string(seqs[i]) +
                             " has position " + std::to_string(positions[i]) + " after " +
                             std::to_string(positions[i - 1]) + " (positions must increase within a sequence)");
            ++cur->count;
            cur->kv_len = positions[i] + 1;
        } else {
            tiles[n++] = PrefillTile{int32_t(i), 1, seqs[i], positions[i] + 1};
        }
    }
    return n;
}

}  // namespace lattice::cuda
