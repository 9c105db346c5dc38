// Internal pieces of the CUDA attention shared by its files (the op's layout, design and invariants:
// attention_decode.cu's header; the entry points: kernels.h):
//   attention_kv_store.cu     kv_store: each token's k and v into its block (int8: quantized per row)
//   attention_decode.cu       attention_decode: flash-decoding over f16/bf16 caches, the split merge
//   attention_decode_int8.cu  the decode kernel over an INT8 cache (same workspace and merge)
//   attention_prefill.cu      attention_prefill: flash-style tiles of query rows
// Here: cache addressing (f16/bf16 rows, int8 rows and their scales), the decode launch shape and workspace
// arguments, the warps' log-sum-exp merge into the workspace, and the shape check every entry point runs.
#pragma once

#include <cstring>
#include <string>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/kernels.h"

namespace lattice::cuda::attn {

constexpr int kMaxR = kMaxHeadDim / 32;  // head dims per lane
constexpr float kNegInf = -3.402823466e38f;

// First position a query with `len` positions (0..len-1) attends under a window (0: none).
__host__ __device__ __forceinline__ int64_t window_start(int64_t len, int64_t window) {
    return window > 0 && len > window ? len - window : 0;
}

// A score after its scale, soft-capped when cap > 0 (AttnDims::softcap; the CPU op's math::softcap).
__device__ __forceinline__ float cap_score(float s, float cap) {
    return cap > 0.0f ? math::softcap(s, cap) : s;
}

// Offset (in elements) of position `pos` of batch sequence `seq`, kv head `kvh`; -1 when the table
// has no block there (the host validated tables; never read or write out of bounds).
__device__ __forceinline__ int64_t kv_offset(const KvTables& kv, const AttnDims& d, int32_t seq, int64_t pos,
                                             int64_t kvh) {
    if (seq < 0 || seq >= kv.num_seqs || pos < 0 || pos >= d.max_seq) return -1;
    const int32_t block = kv.tables[int64_t(seq) * d.table_width + pos / d.block_size];
    if (block < 0 || block >= d.num_blocks) return -1;
    return ((int64_t(block) * d.block_size + pos % d.block_size) * d.n_kv_heads + kvh) * d.head_dim;
}

// ---- INT8 cache rows ----
struct Int8Row {
    int64_t values = -1, scale = -1;  // byte offsets in the cache; -1: no block there
};

// Where the int8 row of position `pos` of `seq`, kv head `kvh` lies: its block's values first, then the
// block's scales (runtime/backend/backend.h).
__device__ __forceinline__ Int8Row int8_row(const KvTables& kv, const AttnDims& d, int32_t seq, int64_t pos,
                                            int64_t kvh) {
    Int8Row r;
    if (seq < 0 || seq >= kv.num_seqs || pos < 0 || pos >= d.max_seq) return r;
    const int32_t block = kv.tables[int64_t(seq) * d.table_width + pos / d.block_size];
    if (block < 0 || block >= d.num_blocks) return r;
    const int64_t rows = d.block_size * d.n_kv_heads;
    const int64_t base = int64_t(block) * rows * (d.head_dim + 4), i = (pos % d.block_size) * d.n_kv_heads + kvh;
    r.values = base + i * d.head_dim;
    r.scale = base + rows * d.head_dim + i * 4;
    return r;
}

__device__ __forceinline__ float int8_scale_at(const int8_t* cache, int64_t off) {
    float s;
    memcpy(&s, cache + off, 4);  // (4-byte aligned only when block_size * nkv * (hd + 4) is)
    return s;
}

inline void check_dims(const AttnDims& d, const char* op) {
    KERNEL_CHECK(d.head_dim > 0 && d.head_dim <= kMaxHeadDim && d.head_dim % 2 == 0 && d.n_kv_heads > 0 &&
                     d.n_heads % d.n_kv_heads == 0 && d.max_seq > 0 && d.block_size > 0 && d.num_blocks > 0 &&
                     d.table_width * d.block_size >= d.max_seq && d.window >= 0 &&
                     d.softcap >= 0.0f && d.softcap < 3.0e38f,
                 std::string("cuda::") + op + ": unsupported shape heads " + std::to_string(d.n_heads) + "/" +
                     std::to_string(d.n_kv_heads) + ", head_dim " + std::to_string(d.head_dim) +
                     " (even, <= " + std::to_string(kMaxHeadDim) + "), softcap " + std::to_string(d.softcap));
}

// ---- decode (flash-decoding) ----
constexpr int kDecWarps = 4;
constexpr int kDecThreads = kDecWarps * 32;
constexpr int kDecMaxHeads = 8;         // query heads per block; larger GQA groups take head chunks
constexpr int kDecTargetBlocks = 512;   // H200: 132 SMs x 3 resident blocks (hd 128) = 396 slots
constexpr int kDecMaxSplits = 256;
constexpr int kMergeThreads = 256;      // >= kMaxHeadDim

constexpr int ilog2(int x) {
    return x <= 1 ? 0 : 1 + ilog2(x / 2);
}
inline int pow2_ceil(int64_t x) {
    int p = 1;
    while (p < x) p *= 2;
    return p;
}

// n / d for 0 <= n < 2^31 by a multiply-high (Granlund-Montgomery, round-up multiplier): the
// decode kernel maps every row's position to its block without a 64-bit division.
// mul = ceil(2^(31 + p) / d), p = ceil(log2 d): n * mul / 2^(31 + p) = n / d + n e / (d 2^(31 + p))
// with e < d <= 2^p, so the error term is < 1 / d and the floor is exact for all n < 2^31.
struct FastDiv {
    uint32_t d = 1, mul = 0, shift = 0;
};

inline FastDiv make_fast_div(uint32_t d) {
    FastDiv f;
    f.d = d;
    if (d <= 1) return f;
    uint32_t p = 0;
    while ((uint64_t(1) << p) < d) ++p;
    f.mul = uint32_t(((uint64_t(1) << (31 + p)) + d - 1) / d);
    f.shift = p - 1;
    return f;
}

__device__ __forceinline__ uint32_t fast_div(const FastDiv& f, uint32_t n) {
    return f.d == 1 ? n : __umulhi(n, f.mul) >> f.shift;
}

// Per-instantiation shape of the decode block: KH heads per block (a power of two >= the heads
// it serves), NSP lanes per row of 8-element segments (power of two >= head_dim / 8).
template <int KH, int NSP>
struct DecCfg {
    static constexpr int kHPL = (KH == 8 && NSP <= 16) ? 4 : KH;  // heads per lane (q, acc registers)
    static constexpr int kHG = KH / kHPL;                          // head groups in a row's lanes
    static constexpr int kLPR = NSP * kHG;                         // lanes per row
    static constexpr int kRSW = 32 / kLPR;                         // rows a warp computes at once
    static constexpr int kTw = NSP == 32 ? 8 : 16;                 // positions per warp tile
    static constexpr int kRPL = kTw / kRSW;                        // rows per lane per tile
    static constexpr int kLPH = 32 / KH;                           // softmax lanes per head
    static constexpr int kVPL = (kTw + kLPH - 1) / kLPH;           // softmax scores per lane
    static constexpr int kCopies = 2 * kTw * NSP / 32;             // 16-byte copies per lane per tile
    // Ring: [warp][stage 2][K, V][kTw][NSP] uint4; reused by the block merge ([warp][KH][NSP * 8] f32).
    static constexpr int kRingPerWarp = 2 * 2 * kTw * NSP;         // uint4
    static constexpr size_t kRingBytes = size_t(kDecWarps) * kRingPerWarp * 16;
    // Register budget: 4 blocks per SM (<= 128 registers) except with 8 heads per lane (hd > 128).
    static constexpr int kMinBlocks = kHPL == 8 ? 2 : 4;
    static_assert(kLPR <= 32 && kRPL >= 1 && kCopies % 2 == 0 && (kTw * NSP) % 32 == 0);
    static_assert(size_t(kDecWarps) * KH * NSP * 8 * 4 <= kRingBytes);
};

struct DecodeArgs {
    const int32_t* positions;
    const int32_t* seqs;
    KvTables kv;
    AttnDims d;
    FastDiv bs_div;  // block_size
    int splits;      // S: grid.x and the workspace's splits per (token, q head)
    int hchunks;     // head chunks per kv head: grid.y = nkv * hchunks
    int group;       // nh / nkv
    int nseg;        // ceil(head_dim / 8): segment lanes that hold data
    bool vec;        // head_dim % 8 == 0 and 16-byte aligned qkv / caches: uint4 loads, cp.async
    float* ws_acc;   // [m, nh, S, hd]
    float* ws_ml;    // [m, nh, S, 2]
};

// ---- decode over an INT8 cache ----
constexpr int kI8Warps = kDecWarps;  // (write_split merges kDecWarps warps)
constexpr int kI8R = kMaxHeadDim / 32;  // head dims per lane


// A decode block's warps merged by log-sum-exp into the workspace, per q head g < ng of the block
// (heads h0 + g): ws_ml = (the warps' max m, their weighted l), ws_acc = their weighted accumulators.
// ml [warp][KH][2]; warp w's accumulator of head g is accb[(w * KH + g) * stride + dim].
template <int KH>
__device__ __forceinline__ void write_split(const DecodeArgs& a, const float (&ml)[kDecWarps][KH][2],
                                            const float* accb, int64_t stride, int64_t token, int h0, int ng,
                                            int split) {
    const int64_t hd = a.d.head_dim;
    for (int g = 0; g < ng; ++g) {
        float mx = kNegInf;
#pragma unroll
        for (int w = 0; w < kDecWarps; ++w) mx = fmaxf(mx, ml[w][g][0]);
        float wt[kDecWarps], l = 0.0f;
#pragma unroll
        for (int w = 0; w < kDecWarps; ++w) {
            wt[w] = math::exp_f32(ml[w][g][0] - mx);  // a warp without rows: m = kNegInf, l = acc = 0
            l += wt[w] * ml[w][g][1];
        }
        const int64_t idx = (token * a.d.n_heads + h0 + g) * a.splits + split;
        if (threadIdx.x == 0) {
            a.ws_ml[idx * 2] = mx;
            a.ws_ml[idx * 2 + 1] = l;
        }
        for (int64_t dd = threadIdx.x; dd < hd; dd += blockDim.x) {
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < kDecWarps; ++w) v = fmaf(wt[w], accb[(w * KH + g) * stride + dd], v);
            a.ws_acc[idx * hd + dd] = v;
        }
    }
}

// The decode kernel over an INT8 cache on grid (split, kv head x head chunk, token), writing a's workspace
// (attention_decode_int8.cu; instantiated for __half and __nv_bfloat16).
template <typename T>
void launch_decode_int8(dim3 grid, const DecodeArgs& a, const void* qkv, const void* k_cache, const void* v_cache,
                        cudaStream_t stream);

}  // namespace lattice::cuda::attn
