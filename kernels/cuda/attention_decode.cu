// Attention over the paged KV cache [num_blocks, block_size, nkv, hd] (activation dtype): position p
// of sequence s is row p % block_size of block tables[s * table_width + p / block_size].
//   kv_store:          writes each token's k, v into its block (before attention reads the cache).
//   attention_decode:  flash-decoding; see below.
//   attention_prefill: flash-style: a block owns a tile of <= 32 query rows of one sequence and one
//                      q head, walks the sequence's KV in 32-position tiles through shared memory, and
//                      keeps per-row (max, sum, acc) in registers; causal by each row's position.
// An INT8 cache (AttnDims::kv_int8): kv_store quantizes each token's k and v rows (one scale per row,
// the math of kernels/common/quantize.h, so the CPU op stores the same bytes for the same input);
// decode runs decode_int8_kernel (one warp per position, round robin, the row's int8 values times its
// scale in registers) into the same workspace and merge as flash-decoding; prefill converts each K/V
// tile as it is staged in shared memory. Neither makes a dequantized copy of the cache.
// A sliding window W (AttnDims::window, Mistral) limits the query at p to keys p - W < j <= p: decode
// splits cover only that span (its first position lo = max(0, p + 1 - W)); prefill starts at the KV
// tile of the tile's first row's lo and masks each row's keys before its own lo.
// A soft-cap c (AttnDims::softcap, Gemma 2) turns each score s = q . k * scale into c * tanh(s / c) after
// the scale and before the mask and the softmax, as the CPU op does (decode: q is pre-scaled, so the cap
// applies to the reduced dot; the INT8 decode kernel and prefill alike).
// GQA: q head h reads kv head h / (nh / nkv). Scores, softmax and accumulation are fp32; the
// exp/max bookkeeping is the OnlineSoftmax of kernels/common/llama_math.h (decode tiles use its
// tile form: one max per tile, one rescale of the accumulator per tile).
//
// Decode design (one query token per row, batch 1 and up; the target is 70B per rank on an H200:
// 64 q heads, 8 kv heads, hd 128, a few thousand positions):
// - Grid (split, kv head x head chunk, token). A block serves ALL query heads of its kv head (up to
//   kDecMaxHeads = 8; larger groups take several head chunks), so every K/V row is read from HBM once
//   per step, not once per query head (the point of GQA).
// - Splits: token with len = pos + 1 positions uses splits of decode_chunk(len, S) positions (a
//   multiple of kDecodeChunk), S = decode_splits(m, d) from (m, shapes, max_seq) only: the grid
//   never depends on positions, so a captured decode graph stays valid as sequences grow, yet the
//   split length follows the current length, so short and long contexts alike fill the GPU (about
//   kDecTargetBlocks blocks) and the workspace stays m * nh * S * (hd + 2) floats.
// - Inside a block each warp owns whole tiles of kTw positions (round robin) and its own online
//   softmax, so the position loop has no block barrier. A tile's K and V rows arrive by cp.async
//   (16-byte copies, coalesced, bypassing L1) into a two-stage per-warp ring: the next tile is in
//   flight while this one is computed, without holding registers. Unreadable rows (table entry
//   out of range) and rows past the split are zero-filled and masked; the cache is never read out
//   of bounds.
// - Scores: lanes split a row in 8-element (16-byte) segments and take HPL <= 4 of the heads (q in
//   registers, fp32, pre-scaled; 8 heads = two lane groups per row sharing each staged row, so q and
//   acc stay at 32 + 32 registers); the NSP segment lanes reduce their HPL partial dots with a
//   butterfly that halves the values per step (a reduce-scatter; lane registers permuted by `hsel`
//   so no selects are needed): HPL - 1 + log2(NSP / HPL) shuffles per row, not HPL log2 NSP.
// - P.V: the same lanes accumulate acc[HPL][8] in fp32 from V segments and the tile's weights.
// - Registers <= 128 (4 blocks per SM; hd 256: <= 255), no local memory; smem 64 KiB ring + 3.4 KiB
//   at hd 128, so 3 blocks (12 warps) per H200 SM.
// - A block merges its warps (log-sum-exp) and writes (m, l, acc[hd]) per q head and split; a merge
//   kernel combines a token's splits (max first, then independent weighted sums) into the output.
// - head_dim % 8 != 0 or unaligned pointers: the same kernels with scalar loads and plain smem
//   stores in place of cp.async (slower, same numerics). Instantiated for 1, 4, 8 heads per block and
//   8, 16, 32 segment lanes (a group of 2-3 runs masked as 4, head_dim <= 64 as 64): 18 kernels.
// Bytes-moved floor: one step reads sum over tokens of len * nkv * hd * 2 (K and V) * 2 bytes; 70B,
// 4096 positions: 16 MiB per layer, 3.5 us at 4.8 TB/s. The workspace (2 MiB at S = 64) and q/out
// stay in L2. At G = 8 the fp32 CUDA-core math is 4 FMA per cache byte against ~7 issue slots per
// HBM byte on an H200, so the kernel sits near the compute limit too; tensor-core mma is the next step.
// Files: attention_common.cuh lists them; this one holds the flash-decoding kernel, the merge and attention_decode.
#include <algorithm>
#include <cstring>

#include "kernels/common/quantize.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/kernels.h"

namespace lattice::cuda {
namespace {

using namespace attn;

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
    const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// 8 packed 16-bit values -> fp32.
template <typename T>
__device__ __forceinline__ void unpack8(const uint4& u, float (&f)[8]);
template <>
__device__ __forceinline__ void unpack8<__half>(const uint4& u, float (&f)[8]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        __half2 h;
        memcpy(&h, &w[i], 4);
        const float2 t = __half22float2(h);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}
template <>
__device__ __forceinline__ void unpack8<__nv_bfloat16>(const uint4& u, float (&f)[8]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // bf16 is the top half of an fp32: exact by bit moves
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

// Scalar gather of up to 8 elements (`avail` of them exist), zero padded: the fallback path.
template <typename T>
__device__ __forceinline__ uint4 load8_scalar(const T* p, int64_t avail) {
    T v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = e < avail ? p[e] : from_f32<T>(0.0f);
    uint4 u;
    memcpy(&u, v, 16);
    return u;
}

// Reduce-scatter + all-reduce of N partial sums over the NSP = 2 * O0 segment lanes of a row. On
// entry v[i] holds this lane's partial of head (i ^ hsel); each halving step keeps v[0, C/2) and adds
// the partner's v[C/2 + i], which is the same head because the partner's hsel differs exactly in the
// bit C/2. Once one value is left (or the lanes run out) the remaining offsets all-reduce it. On exit
// v[i], i < (N >> min(log2 N, log2 NSP)), is the full dot of head hsel + i.
template <int C, int O, int N>
__device__ __forceinline__ void seg_reduce(float (&v)[N]) {
    if constexpr (O > 0) {
        if constexpr (C > 1) {
#pragma unroll
            for (int i = 0; i < C / 2; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[C / 2 + i], O);
            seg_reduce<C / 2, O / 2, N>(v);
        } else {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], O);
            seg_reduce<1, O / 2, N>(v);
        }
    }
}

// Element offset of the K/V row of position p (< the token's length <= max_seq, so the table index
// is in range) for kv head kvh; -1 when the table entry is not a block of the cache.
__device__ __forceinline__ int64_t dec_row_offset(const DecodeArgs& a, int32_t seq, uint32_t p, int kvh) {
    const uint32_t bi = fast_div(a.bs_div, p);
    const uint32_t r = p - bi * a.bs_div.d;
    const int32_t block = a.kv.tables[int64_t(seq) * a.d.table_width + bi];
    if (block < 0 || block >= a.d.num_blocks) return -1;
    return ((int64_t(block) * a.d.block_size + r) * a.d.n_kv_heads + kvh) * a.d.head_dim;
}

// One block per (split, kv head x head chunk, token): writes (m, l, unnormalized acc) of every q
// head it serves for this split. Tokens outside the context or the tables, and splits past the
// token's length, write nothing (the merge kernel does not read them).
template <typename T, int KH, int NSP>
__global__ void __launch_bounds__(kDecThreads, DecCfg<KH, NSP>::kMinBlocks)
    decode_split_kernel(const T* __restrict__ qkv, const T* __restrict__ kc, const T* __restrict__ vc, DecodeArgs a) {
    using C = DecCfg<KH, NSP>;
    constexpr int HPL = C::kHPL, HG = C::kHG, LPR = C::kLPR, RSW = C::kRSW, TW = C::kTw, RPL = C::kRPL;
    constexpr int LPH = C::kLPH, VPL = C::kVPL, NCP = C::kCopies;
    constexpr int HS = ilog2(NSP) < ilog2(HPL) ? ilog2(NSP) : ilog2(HPL);  // halving steps
    constexpr int KEEP = HPL >> HS;                                         // dots a lane ends with
    constexpr int ALLMASK = (NSP >> HS) - 1;  // segment bits of the all-reduce steps (lanes alike)

    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ int64_t roff_sm[kDecWarps][2][TW];         // row offsets per stage (-1: masked row)
    __shared__ __align__(16) float sc_sm[kDecWarps][TW][KH];  // scores, then weights, of a tile
    __shared__ float rs_sm[kDecWarps][KH];                // the tile's accumulator rescale per head
    __shared__ float ml_sm[kDecWarps][KH][2];             // per-warp (m, l) for the block merge

    const AttnDims& d = a.d;
    const int split = int(blockIdx.x);
    const int64_t token = blockIdx.z;
    const int kvh = int(blockIdx.y) / a.hchunks, hc = int(blockIdx.y) % a.hchunks;
    const int32_t pos = a.positions[token], seq = a.seqs[token];
    if (pos < 0 || pos >= d.max_seq || seq < 0 || seq >= a.kv.num_seqs) return;  // block-uniform
    const int64_t len = int64_t(pos) + 1;
    const int64_t lo = window_start(len, d.window);  // positions [lo, len) are attended
    const int64_t chunk = decode_chunk(len - lo, a.splits);
    const int64_t start = lo + int64_t(split) * chunk;
    if (start >= len) return;  // block-uniform: an unused split
    const int64_t end = min(start + chunk, len);
    const int64_t hd = d.head_dim;
    const int h0 = kvh * a.group + hc * kDecMaxHeads;  // first q head of this block
    const int ng = min(kDecMaxHeads, a.group - hc * kDecMaxHeads);

    const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
    const int seg = lane % NSP, hg = (lane / NSP) % HG, slot = lane / LPR;
    int hsel = 0;
#pragma unroll
    for (int k = 0; k < HS; ++k)
        if (seg & (NSP >> (k + 1))) hsel |= HPL >> (k + 1);

    // q of this lane's heads (i ^ hsel within its head group) and segment, fp32, pre-scaled.
    float qr[HPL][8];
    {
        const T* qrow = qkv + token * (d.n_heads + 2 * d.n_kv_heads) * hd;
#pragma unroll
        for (int i = 0; i < HPL; ++i) {
            const int gl = hg * HPL + (i ^ hsel);
            const bool ok = gl < ng && seg < a.nseg;
            const T* q = qrow + (ok ? (h0 + gl) * hd + seg * 8 : 0);
            const uint4 u = !ok ? make_uint4(0, 0, 0, 0)
                            : a.vec ? *reinterpret_cast<const uint4*>(q)
                                    : load8_scalar(q, hd - seg * 8);
            unpack8<T>(u, qr[i]);
#pragma unroll
            for (int e = 0; e < 8; ++e) qr[i][e] *= d.scale;
        }
    }

    uint4* ring = reinterpret_cast<uint4*>(smem_raw) + warp * C::kRingPerWarp;
    // Stage `stage` <- the K and V rows of the warp tile starting at position tile0.
    auto issue = [&](int stage, int64_t tile0) {
        for (int r = lane; r < TW; r += 32) {
            const int64_t p = tile0 + r;
            roff_sm[warp][stage][r] = p < end ? dec_row_offset(a, seq, uint32_t(p), kvh) : -1;
        }
        __syncwarp();
        // Copy i of this lane: K copies, then V copies; a warp's 32 copies cover contiguous rows.
        auto copy_at = [&](int i, int64_t& off, int& cseg, uint4*& dst, const T*& base) {
            const int kind = i < NCP / 2 ? 0 : 1;
            const int c = lane + 32 * (i - kind * (NCP / 2));
            const int row = c / NSP;
            cseg = c % NSP;
            off = roff_sm[warp][stage][row];
            dst = ring + ((stage * 2 + kind) * TW + row) * NSP + cseg;
            base = kind ? vc : kc;
        };
        if (a.vec) {
#pragma unroll
            for (int i = 0; i < NCP; ++i) {
                int64_t off;
                int cseg;
                uint4* dst;
                const T* base;
                copy_at(i, off, cseg, dst, base);
                const bool ok = off >= 0 && cseg < a.nseg;
                cp_async16(dst, ok ? base + off + cseg * 8 : base, ok ? 16 : 0);  // 0 bytes: zero fill
            }
        } else {
#pragma unroll 1
            for (int i = 0; i < NCP; ++i) {
                int64_t off;
                int cseg;
                uint4* dst;
                const T* base;
                copy_at(i, off, cseg, dst, base);
                const bool ok = off >= 0 && cseg < a.nseg;
                *dst = ok ? load8_scalar(base + off + cseg * 8, hd - cseg * 8) : make_uint4(0, 0, 0, 0);
            }
        }
    };

    const int n = int(end - start);
    const int ntiles = (n + TW - 1) / TW;
    const int my_tiles = warp < ntiles ? (ntiles - 1 - warp) / kDecWarps + 1 : 0;  // warp-uniform
    const int shead = lane / LPH, jl = lane % LPH;  // softmax: head shead, positions jl + LPH * i

    float acc[HPL][8];
#pragma unroll
    for (int i = 0; i < HPL; ++i)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[i][e] = 0.0f;
    float m_run = kNegInf, l_run = 0.0f;  // OnlineSoftmax state of head shead

    if (my_tiles > 0) issue(0, start + int64_t(warp) * TW);
    cp_async_commit();
    for (int it = 0; it < my_tiles; ++it) {
        const int stage = it & 1;
        if (it + 1 < my_tiles) issue(stage ^ 1, start + int64_t(warp + (it + 1) * kDecWarps) * TW);
        cp_async_commit();
        cp_async_wait<1>();  // this lane's copies of tile `it` have landed
        __syncwarp();        // ... and every lane's
        const uint4* kr = ring + (stage * 2) * TW * NSP;
        const uint4* vr = kr + TW * NSP;

        // Scores of the tile: sc[row][head] (kNegInf on masked rows).
#pragma unroll 4
        for (int rr = 0; rr < RPL; ++rr) {
            const int row = slot + RSW * rr;
            float kf[8];
            unpack8<T>(kr[row * NSP + seg], kf);
            float part[HPL];
#pragma unroll
            for (int i = 0; i < HPL; ++i) {
                float s = qr[i][0] * kf[0];
#pragma unroll
                for (int e = 1; e < 8; ++e) s = fmaf(qr[i][e], kf[e], s);
                part[i] = s;
            }
            seg_reduce<HPL, NSP / 2, HPL>(part);
            if ((seg & ALLMASK) == 0) {
                const bool valid = roff_sm[warp][stage][row] >= 0;
#pragma unroll
                for (int i = 0; i < KEEP; ++i)
                    sc_sm[warp][row][hg * HPL + hsel + i] = valid ? cap_score(part[i], d.softcap) : kNegInf;
            }
        }
        __syncwarp();

        // Online softmax over the tile, per head: one max, one rescale; weights replace the scores.
        {
            float sv[VPL];
            float mt = kNegInf;
#pragma unroll
            for (int i = 0; i < VPL; ++i) {
                const int j = jl + LPH * i;
                sv[i] = j < TW ? sc_sm[warp][j][shead] : kNegInf;
                mt = fmaxf(mt, sv[i]);
            }
#pragma unroll
            for (int o = LPH / 2; o > 0; o >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, o));
            const float m_new = fmaxf(m_run, mt);
            const float rescale = math::exp_f32(m_run - m_new);
            float psum = 0.0f;
#pragma unroll
            for (int i = 0; i < VPL; ++i) {
                const int j = jl + LPH * i;
                const float p = sv[i] > kNegInf ? math::exp_f32(sv[i] - m_new) : 0.0f;
                psum += p;
                if (j < TW) sc_sm[warp][j][shead] = p;
            }
#pragma unroll
            for (int o = LPH / 2; o > 0; o >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
            l_run = l_run * rescale + psum;
            m_run = m_new;
            if (jl == 0) rs_sm[warp][shead] = rescale;
        }
        __syncwarp();

        // acc = acc * rescale + sum_rows p * V.
#pragma unroll
        for (int i = 0; i < HPL; ++i) {
            const float r = rs_sm[warp][hg * HPL + i];
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[i][e] *= r;
        }
#pragma unroll 4
        for (int rr = 0; rr < RPL; ++rr) {
            const int row = slot + RSW * rr;
            float vf[8];
            unpack8<T>(vr[row * NSP + seg], vf);
            float p[HPL];
            if constexpr (HPL % 4 == 0) {
#pragma unroll
                for (int i = 0; i < HPL; i += 4) {
                    const float4 p4 = *reinterpret_cast<const float4*>(&sc_sm[warp][row][hg * HPL + i]);
                    p[i] = p4.x, p[i + 1] = p4.y, p[i + 2] = p4.z, p[i + 3] = p4.w;
                }
            } else {
#pragma unroll
                for (int i = 0; i < HPL; ++i) p[i] = sc_sm[warp][row][hg * HPL + i];
            }
#pragma unroll
            for (int i = 0; i < HPL; ++i)
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[i][e] = fmaf(p[i], vf[e], acc[i][e]);
        }
        __syncwarp();  // the next issue / scores overwrite this stage, sc and rs
    }
    cp_async_wait<0>();

    // Rows of one warp share its softmax state: sum the row slots' accumulators.
#pragma unroll
    for (int o = LPR; o < 32; o <<= 1)
#pragma unroll
        for (int i = 0; i < HPL; ++i)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[i][e] += __shfl_xor_sync(0xffffffffu, acc[i][e], o);

    // Block merge (log-sum-exp over warps) through the ring's memory, then the split's partials.
    __syncthreads();  // every warp is done with its ring (all its copies waited for)
    float* accb = reinterpret_cast<float*>(smem_raw);  // [warp][KH][NSP * 8]
    if (slot == 0) {
#pragma unroll
        for (int i = 0; i < HPL; ++i) {
            float4* dst = reinterpret_cast<float4*>(accb + (warp * KH + hg * HPL + i) * (NSP * 8) + seg * 8);
            dst[0] = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
            dst[1] = make_float4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]);
        }
    }
    if (jl == 0) {
        ml_sm[warp][shead][0] = m_run;
        ml_sm[warp][shead][1] = l_run;
    }
    __syncthreads();
    write_split<KH>(a, ml_sm, accb, NSP * 8, token, h0, ng, split);
}

// One block per (q head, token): out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s over the
// token's used splits, M = max_s m_s (max first, so the weighted sums are independent loads rather
// than a chain of merges). Tokens outside the context or the tables, and rows whose every position
// was masked (l = 0), get zeros.
template <typename T>
__global__ void __launch_bounds__(kMergeThreads)
    decode_merge_kernel(T* out, const int32_t* positions, const int32_t* seqs, KvTables kv, AttnDims d, int splits,
                        const float* ws_acc, const float* ws_ml) {
    __shared__ float w_sm[kDecMaxSplits];
    __shared__ float part[kMergeThreads];
    __shared__ float red[32];
    const int64_t h = blockIdx.x, token = blockIdx.y, hd = d.head_dim;
    const int tid = int(threadIdx.x);
    const int32_t pos = positions[token], seq = seqs[token];
    const bool valid = pos >= 0 && pos < d.max_seq && seq >= 0 && seq < kv.num_seqs;
    const int64_t len = int64_t(pos) + 1, span = len - window_start(len, d.window);
    const int n = valid ? int(uint32_t(span - 1) / uint32_t(decode_chunk(span, splits))) + 1 : 0;  // used splits
    const int64_t base = (token * d.n_heads + h) * splits;

    float mx = kNegInf;
    for (int s = tid; s < n; s += kMergeThreads) mx = fmaxf(mx, ws_ml[(base + s) * 2]);
    mx = block_max(mx, red);
    float l = 0.0f;
    for (int s = tid; s < n; s += kMergeThreads) {
        const float w = math::exp_f32(ws_ml[(base + s) * 2] - mx);
        w_sm[s] = w;
        l += w * ws_ml[(base + s) * 2 + 1];
    }
    l = block_sum(l, red);  // its barriers also publish w_sm

    // Thread (ph, dd): dims dd, every phases-th split from ph; hd <= kMergeThreads.
    const int phases = kMergeThreads / int(hd);
    const int dd = tid % int(hd), ph = tid / int(hd);
    float acc = 0.0f;
    if (ph < phases) {
#pragma unroll 4
        for (int s = ph; s < n; s += phases) acc = fmaf(w_sm[s], ws_acc[(base + s) * hd + dd], acc);
    }
    part[tid] = acc;
    __syncthreads();
    if (tid < hd) {
        float v = 0.0f;
        for (int p = 0; p < phases; ++p) v += part[p * hd + tid];
        out[(token * d.n_heads + h) * hd + tid] = from_f32<T>(l > 0.0f ? v / l : 0.0f);
    }
}

template <typename T, int KH, int NSP>
void launch_decode_split(dim3 grid, const DecodeArgs& a, const void* qkv, const void* kc, const void* vc,
                         cudaStream_t stream) {
    constexpr size_t smem = DecCfg<KH, NSP>::kRingBytes;
    // Up to 64 KiB of ring: above the 48 KiB default (not a stream operation: fine while capturing).
    CUDA_CHECK(cudaFuncSetAttribute(decode_split_kernel<T, KH, NSP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(smem)));
    decode_split_kernel<T, KH, NSP><<<grid, kDecThreads, smem, stream>>>(
        static_cast<const T*>(qkv), static_cast<const T*>(kc), static_cast<const T*>(vc), a);
}

template <typename T, int KH>
void launch_decode_nsp(int nsp, dim3 grid, const DecodeArgs& a, const void* qkv, const void* kc, const void* vc,
                       cudaStream_t stream) {
    switch (nsp) {
        case 8: launch_decode_split<T, KH, 8>(grid, a, qkv, kc, vc, stream); break;
        case 16: launch_decode_split<T, KH, 16>(grid, a, qkv, kc, vc, stream); break;
        default: launch_decode_split<T, KH, 32>(grid, a, qkv, kc, vc, stream); break;
    }
}

template <typename T>
void launch_decode(int kh, int nsp, dim3 grid, const DecodeArgs& a, const void* qkv, const void* kc, const void* vc,
                   cudaStream_t stream) {
    switch (kh) {
        case 1: launch_decode_nsp<T, 1>(nsp, grid, a, qkv, kc, vc, stream); break;
        case 4: launch_decode_nsp<T, 4>(nsp, grid, a, qkv, kc, vc, stream); break;
        default: launch_decode_nsp<T, 8>(nsp, grid, a, qkv, kc, vc, stream); break;
    }
}

bool aligned16(const void* p) {
    return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

}  // namespace

int decode_splits(int64_t m, const AttnDims& d) {
    const int64_t nkv = std::max<int64_t>(1, d.n_kv_heads);
    const int64_t group = std::max<int64_t>(1, d.n_heads / nkv);
    const int64_t blocks_per_split = std::max<int64_t>(1, m) * nkv * ceil_div(group, kDecMaxHeads);
    int64_t s = ceil_div(kDecTargetBlocks, blocks_per_split);
    const int64_t span = d.window > 0 ? std::min(d.max_seq, d.window) : d.max_seq;  // positions a token attends
    s = std::min(s, ceil_div(std::max<int64_t>(1, span), kDecodeChunk));  // no split below kDecodeChunk
    return int(std::clamp<int64_t>(s, 1, kDecMaxSplits));
}

int64_t decode_workspace_floats(int64_t m, const AttnDims& d) {
    return m * d.n_heads * decode_splits(m, d) * (d.head_dim + 2);
}

void attention_decode(void* out, const void* qkv, const void* k_cache, const void* v_cache, const int32_t* positions,
                      const int32_t* seqs, const KvTables& kv, int64_t m, const AttnDims& d, float* workspace,
                      DType act, cudaStream_t stream) {
    check_dims(d, "attention_decode");
    KERNEL_CHECK(m <= 65535 && d.n_heads <= 65535 && d.block_size <= 0x7fffffff,
                 "cuda::attention_decode: grid too large");
    if (m == 0) return;
    const int splits = decode_splits(m, d);
    const int64_t group = d.n_heads / d.n_kv_heads, hchunks = ceil_div(group, kDecMaxHeads);
    const int64_t nseg = ceil_div(d.head_dim, 8);
    DecodeArgs a;
    a.positions = positions;
    a.seqs = seqs;
    a.kv = kv;
    a.d = d;
    a.bs_div = make_fast_div(uint32_t(d.block_size));
    a.splits = splits;
    a.hchunks = int(hchunks);
    a.group = int(group);
    a.nseg = int(nseg);
    a.vec = d.head_dim % 8 == 0 && aligned16(qkv) && aligned16(k_cache) && aligned16(v_cache);
    a.ws_acc = workspace;
    a.ws_ml = workspace + m * d.n_heads * splits * d.head_dim;
    const dim3 grid(unsigned(splits), unsigned(d.n_kv_heads * hchunks), unsigned(m));
    // Instantiated shapes (compile time): 1, 4 or 8 heads per block (groups of 2-3 run as 4 with
    // the rest masked), 8, 16 or 32 segment lanes (head_dim <= 64 runs as 64 with idle lanes).
    const int kh = group == 1 ? 1 : group <= 4 ? 4 : 8;
    const int nsp = pow2_ceil(std::max<int64_t>(8, nseg));
    LATTICE_DISPATCH_ACT(act, {
        if (d.kv_int8) {
            launch_decode_int8<T>(grid, a, qkv, k_cache, v_cache, stream);
        } else {
            launch_decode<T>(kh, nsp, grid, a, qkv, k_cache, v_cache, stream);
        }
        CUDA_CHECK_LAUNCH();
        decode_merge_kernel<T><<<dim3(unsigned(d.n_heads), unsigned(m)), kMergeThreads, 0, stream>>>(
            static_cast<T*>(out), positions, seqs, kv, d, splits, a.ws_acc, a.ws_ml);
    });
    CUDA_CHECK_LAUNCH();
}

}  // namespace lattice::cuda
