// Attention over the paged KV cache [num_blocks, block_size, nkv, hd] (activation dtype): position p
// of sequence s is row p % block_size of block tables[s * table_width + p / block_size].
//   kv_store:          writes each token's k, v into its block (before attention reads the cache).
//   attention_decode:  one block per (KV chunk of kDecodeChunk positions, q head, token); each warp
//                      streams positions with an online softmax, the block merges its warps, and a
//                      reduce kernel merges the chunks. The grid depends only on max_seq, so a
//                      captured decode graph stays valid while sequences grow.
//   attention_prefill: flash-style: a block owns a tile of <= 32 query rows of one sequence and one
//                      q head, walks the sequence's KV in 32-position tiles through shared memory, and
//                      keeps per-row (max, sum, acc) in registers; causal by each row's position.
// GQA: q head h reads kv head h / (nh / nkv). Scores, softmax and accumulation are fp32; the
// exp/max bookkeeping is the OnlineSoftmax of kernels/common/llama_math.h.
#include <algorithm>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/kernels.h"

namespace lattice::cuda {
namespace {

constexpr int kMaxR = kMaxHeadDim / 32;  // head dims per lane
constexpr float kNegInf = -3.402823466e38f;

// Offset (in elements) of position `pos` of batch sequence `seq`, kv head `kvh`; -1 when the table
// has no block there (the host validated tables; never read or write out of bounds).
__device__ __forceinline__ int64_t kv_offset(const KvTables& kv, const AttnDims& d, int32_t seq, int64_t pos,
                                             int64_t kvh) {
    if (seq < 0 || seq >= kv.num_seqs || pos < 0 || pos >= d.max_seq) return -1;
    const int32_t block = kv.tables[int64_t(seq) * d.table_width + pos / d.block_size];
    if (block < 0 || block >= d.num_blocks) return -1;
    return ((int64_t(block) * d.block_size + pos % d.block_size) * d.n_kv_heads + kvh) * d.head_dim;
}

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

// ---- decode ----
constexpr int kDecodeWarps = 4;

template <typename T>
__global__ void __launch_bounds__(kDecodeWarps * 32)
    decode_kernel(const T* qkv, const T* kc, const T* vc, const int32_t* positions, const int32_t* seqs, KvTables kv,
                  AttnDims d, int splits, float* ws_acc, float* ws_ml) {
    const int64_t token = blockIdx.z;
    const int64_t h = blockIdx.y;
    const int split = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int32_t pos = positions[token], seq = seqs[token];
    const int64_t len = int64_t(pos) + 1;
    const int64_t start = int64_t(split) * kDecodeChunk;
    if (start >= len || seq < 0 || seq >= kv.num_seqs || pos >= d.max_seq) return;
    const int64_t end = min(start + kDecodeChunk, len);
    const int64_t hd = d.head_dim, nkv = d.n_kv_heads;
    const int64_t kvh = h / (d.n_heads / nkv);
    const T* q = qkv + token * (d.n_heads + 2 * nkv) * hd + h * hd;

    float qr[kMaxR], acc[kMaxR];
#pragma unroll
    for (int r = 0; r < kMaxR; ++r) {
        const int64_t dd = lane + 32 * r;
        qr[r] = dd < hd ? to_f32(q[dd]) * d.scale : 0.0f;
        acc[r] = 0.0f;
    }
    math::OnlineSoftmax st;
    for (int64_t t = start + warp; t < end; t += kDecodeWarps) {
        const int64_t off = kv_offset(kv, d, seq, t, kvh);
        if (off < 0) continue;  // uniform across the warp
        const T* kr = kc + off;
        const T* vr = vc + off;
        float s = 0.0f;
#pragma unroll
        for (int r = 0; r < kMaxR; ++r) {
            const int64_t dd = lane + 32 * r;
            if (dd < hd) s += qr[r] * to_f32(kr[dd]);
        }
        s = warp_sum(s);
        float rescale, p;
        st.add(s, rescale, p);
#pragma unroll
        for (int r = 0; r < kMaxR; ++r) {
            const int64_t dd = lane + 32 * r;
            if (dd < hd) acc[r] = acc[r] * rescale + p * to_f32(vr[dd]);
        }
    }
    // Merge the warps of the block: warp w publishes (m, l, acc); warp 0 combines.
    __shared__ float sm_ml[kDecodeWarps][2];
    __shared__ float sm_acc[kDecodeWarps][kMaxHeadDim];
    if (lane == 0) {
        sm_ml[warp][0] = st.m;
        sm_ml[warp][1] = st.l;
    }
#pragma unroll
    for (int r = 0; r < kMaxR; ++r) {
        const int64_t dd = lane + 32 * r;
        if (dd < hd) sm_acc[warp][dd] = acc[r];
    }
    __syncthreads();
    if (warp != 0) return;
    math::OnlineSoftmax tot;
    float out[kMaxR];
#pragma unroll
    for (int r = 0; r < kMaxR; ++r) out[r] = 0.0f;
    for (int w = 0; w < kDecodeWarps; ++w) {
        if (sm_ml[w][1] == 0.0f) continue;  // warp saw no position
        float r1, r2;
        tot.merge(sm_ml[w][0], sm_ml[w][1], r1, r2);
#pragma unroll
        for (int r = 0; r < kMaxR; ++r) {
            const int64_t dd = lane + 32 * r;
            if (dd < hd) out[r] = out[r] * r1 + sm_acc[w][dd] * r2;
        }
    }
    const int64_t idx = (token * d.n_heads + h) * splits + split;
    if (lane == 0) {
        ws_ml[idx * 2] = tot.m;
        ws_ml[idx * 2 + 1] = tot.l;
    }
#pragma unroll
    for (int r = 0; r < kMaxR; ++r) {
        const int64_t dd = lane + 32 * r;
        if (dd < hd) ws_acc[idx * hd + dd] = out[r];
    }
}

template <typename T>
__global__ void decode_reduce_kernel(T* out, const int32_t* positions, const int32_t* seqs, KvTables kv, AttnDims d,
                                     int splits, const float* ws_acc, const float* ws_ml) {
    const int64_t token = blockIdx.y, h = blockIdx.x, hd = d.head_dim;
    const int32_t pos = positions[token], seq = seqs[token];
    T* o = out + token * d.n_heads * hd + h * hd;
    const bool valid = pos >= 0 && pos < d.max_seq && seq >= 0 && seq < kv.num_seqs;
    const int n = valid ? int((int64_t(pos) + kDecodeChunk) / kDecodeChunk) : 0;
    const int64_t base = (token * d.n_heads + h) * splits;
    for (int64_t dd = threadIdx.x; dd < hd; dd += blockDim.x) {
        math::OnlineSoftmax tot;
        float acc = 0.0f;
        for (int s = 0; s < n; ++s) {
            float r1, r2;
            tot.merge(ws_ml[(base + s) * 2], ws_ml[(base + s) * 2 + 1], r1, r2);
            acc = acc * r1 + ws_acc[(base + s) * hd + dd] * r2;
        }
        o[dd] = from_f32<T>(tot.l > 0.0f ? acc / tot.l : 0.0f);
    }
}

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
    prefill_kernel(T* out, const T* qkv, const T* kc, const T* vc, const int32_t* positions, const PrefillTile* tiles,
                   KvTables kv, AttnDims d) {
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
    for (int64_t kt = 0; kt < tile.kv_len; kt += kKvTile) {
        __syncthreads();
        for (int64_t t = threadIdx.x; t < kKvTile * hd; t += blockDim.x) {
            const int64_t j = t / hd, c = t % hd, p = kt + j;
            const int64_t off = p < tile.kv_len ? kv_offset(kv, d, tile.seq, p, kvh) : -1;
            ks[j * ld + c] = off >= 0 ? kc[off + c] : from_f32<T>(0.0f);
            vs[j * ld + c] = off >= 0 ? vc[off + c] : from_f32<T>(0.0f);
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < kRowsPerWarp; ++rr) {
            const int row = warp + kPrefillWarps * rr;
            if (row_pos[rr] < kt) continue;  // row absent, or the whole KV tile is in its future
            const bool valid = kt + lane <= row_pos[rr];
            float s = valid ? dot_smem(qs + row * ld, ks + lane * ld, hd) * d.scale : kNegInf;
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

void check_dims(const AttnDims& d, const char* op) {
    KERNEL_CHECK(d.head_dim > 0 && d.head_dim <= kMaxHeadDim && d.head_dim % 2 == 0 && d.n_kv_heads > 0 &&
                     d.n_heads % d.n_kv_heads == 0 && d.max_seq > 0 && d.block_size > 0 && d.num_blocks > 0 &&
                     d.table_width * d.block_size >= d.max_seq,
                 std::string("cuda::") + op + ": unsupported shape heads " + std::to_string(d.n_heads) + "/" +
                     std::to_string(d.n_kv_heads) + ", head_dim " + std::to_string(d.head_dim) +
                     " (even, <= " + std::to_string(kMaxHeadDim) + ")");
}

int decode_splits(const AttnDims& d) {
    return int(ceil_div(d.max_seq, kDecodeChunk));
}

}  // namespace

void kv_store(void* k_cache, void* v_cache, const void* qkv, const int32_t* positions, const int32_t* seqs,
              const KvTables& kv, int64_t m, const AttnDims& d, DType act, cudaStream_t stream) {
    check_dims(d, "kv_store");
    if (m == 0) return;
    LATTICE_DISPATCH_ACT(
        act, kv_store_kernel<T><<<unsigned(m), 256, 0, stream>>>(static_cast<T*>(k_cache), static_cast<T*>(v_cache),
                                                                 static_cast<const T*>(qkv), positions, seqs, kv, d));
    CUDA_CHECK_LAUNCH();
}

int64_t decode_workspace_floats(int64_t m, const AttnDims& d) {
    return m * d.n_heads * decode_splits(d) * (d.head_dim + 2);
}

void attention_decode(void* out, const void* qkv, const void* k_cache, const void* v_cache, const int32_t* positions,
                      const int32_t* seqs, const KvTables& kv, int64_t m, const AttnDims& d, float* workspace,
                      DType act, cudaStream_t stream) {
    check_dims(d, "attention_decode");
    KERNEL_CHECK(m <= 65535 && d.n_heads <= 65535, "cuda::attention_decode: grid too large");
    if (m == 0) return;
    const int splits = decode_splits(d);
    float* ws_acc = workspace;
    float* ws_ml = workspace + m * d.n_heads * splits * d.head_dim;
    const dim3 grid(unsigned(splits), unsigned(d.n_heads), unsigned(m));
    const unsigned red_threads = unsigned(std::min<int64_t>(256, ceil_div(d.head_dim, 32) * 32));
    LATTICE_DISPATCH_ACT(act, {
        decode_kernel<T><<<grid, kDecodeWarps * 32, 0, stream>>>(
            static_cast<const T*>(qkv), static_cast<const T*>(k_cache), static_cast<const T*>(v_cache), positions,
            seqs, kv, d, splits, ws_acc, ws_ml);
        CUDA_CHECK_LAUNCH();
        decode_reduce_kernel<T><<<dim3(unsigned(d.n_heads), unsigned(m)), red_threads, 0, stream>>>(
            static_cast<T*>(out), positions, seqs, kv, d, splits, ws_acc, ws_ml);
    });
    CUDA_CHECK_LAUNCH();
}

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
        prefill_kernel<T><<<grid, kPrefillWarps * 32, smem, stream>>>(
            static_cast<T*>(out), static_cast<const T*>(qkv), static_cast<const T*>(k_cache),
            static_cast<const T*>(v_cache), positions, tiles, kv, d);
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
