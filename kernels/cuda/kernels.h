// Host-callable launchers of the lattice CUDA kernels (kernels/cuda/*.cu). Plain C++: callers need
// only cuda_runtime_api.h. Every launcher enqueues on `stream` and never synchronizes, so a
// sequence of them can be captured into a CUDA graph. All pointers are device pointers.
//
// Layouts (row-major, rows = tokens of the flattened batch):
//   activations  [m, n] in `act` = DType::kF16 or DType::kBF16; norms/softmax/accumulation in fp32
//   qkv          [m, (nh + 2 nkv) * hd]: q heads, then k heads, then v heads
//   k/v cache    paged: [num_blocks, block_size, nkv, hd] in `act`; position p of sequence s is row
//                p % block_size of block tables[s * table_width + p / block_size]
//   int8 GEMM    weights [n_pad, k_pad] int8 (row = output channel, zero padded), activations
//                [m, k_pad] int8 (zero padded), int32 accumulators [m, n_pad]
// Token metadata (ids, positions, sequence of each token, block tables) is int32 on the device.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/dtype.h"

namespace lattice::cuda {

// Decode attention (flash-decoding) cuts a token's positions 0..pos into splits of
// decode_chunk(pos + 1, S) positions, S = decode_splits(m, d), one block per split (and kv head):
// the grid depends on (m, shapes, max_seq) only, never on positions, so a captured graph stays valid
// as sequences grow, while the split length follows each token's current length.
constexpr int kDecodeChunk = 64;  // split lengths are multiples of this many positions
constexpr int kMaxHeadDim = 256;
// The tile of query rows one prefill block handles (all of one sequence, increasing positions).
constexpr int kPrefillRows = 32;

struct AttnDims {
    int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0, max_seq = 0;
    int64_t block_size = 0, num_blocks = 0, table_width = 0;  // the paged cache
    float scale = 1.0f;
    int64_t window = 0;  // sliding window W (Mistral): the query at p attends keys p - W < j <= p; 0: all
    float softcap = 0.0f;  // soft-cap c > 0 (Gemma 2): each score s = q . k * scale becomes c * tanh(s / c)
                           // before the mask and the softmax; 0: none
    // INT8 cache (--kv-cache-dtype int8): a block holds [block_size, nkv, hd] int8 values, then their
    // [block_size, nkv] f32 scales (runtime/backend/backend.h); false: the activation dtype.
    bool kv_int8 = false;
};

// The paged cache's block tables on the device: [num_seqs, width] block ids.
struct KvTables {
    const int32_t* tables = nullptr;
    int64_t num_seqs = 0;
};

// A run of <= kPrefillRows consecutive tokens of one sequence: rows [start, start + count).
struct PrefillTile {
    int32_t start, count, seq, kv_len;  // kv_len = last row's position + 1
};

// ---- elementwise / norms (elementwise.cu; the row norms, quantize and silu_mul: norm_quant.cu) ----
void embed(void* out, DType act, const void* table, DType table_dtype, int64_t table_rows, int64_t hidden,
           const int32_t* ids, int64_t m, int64_t row_offset, cudaStream_t stream);
void rmsnorm(void* out, const void* x, const float* w, int64_t m, int64_t n, float eps, DType act, cudaStream_t stream);
// residual += x; out = rmsnorm(residual) * w.
void add_rmsnorm(void* residual, const void* x, void* out, const float* w, int64_t m, int64_t n, float eps, DType act,
                 cudaStream_t stream);
// residual += x (x may be null: no add); y = rmsnorm(residual) * w; out = y (if out != null);
// q[i, :] = quantize(y[i, :]) (ldq >= n, columns [n, ldq) zeroed), scales[i] its scale.
void add_rmsnorm_quant(void* residual, const void* x, void* out, int8_t* q, int64_t ldq, float* scales, const float* w,
                       int64_t m, int64_t n, float eps, DType act, cudaStream_t stream);
// Per-token symmetric int8 quantization of x [m, k] into q [m, ldq] (zero padded) and scales [m].
void quantize_rows(int8_t* q, int64_t ldq, float* scales, const void* x, int64_t m, int64_t k, DType act,
                   cudaStream_t stream);
void rope(void* qkv, const int32_t* positions, int64_t m, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
          const float* inv_freq, DType act, cudaStream_t stream);
void silu_mul(void* out, const void* gate_up, int64_t m, int64_t f, DType act, cudaStream_t stream);
// out = silu(gate) * up, and q[i, :] = quantize(out[i, :]) (ldq >= f, padding zeroed), scales[i]
// its scale when q is set: silu_mul followed by quantize_rows, in one pass for f % 8 == 0.
void silu_mul_quant(void* out, int8_t* q, int64_t ldq, float* scales, const void* gate_up, int64_t m, int64_t f,
                    DType act, cudaStream_t stream);
void add(void* out, const void* a, const void* b, int64_t n, DType act, cudaStream_t stream);
// out[i, j] = acc[i, j] * sx[i] * sw[j] (sx null: 1), converted to out_dtype (act or f32). acc is [m, ld_acc].
void dequant_i32(void* out, const int32_t* acc, int64_t ld_acc, const float* sx, const float* sw, int64_t m, int64_t n,
                 DType act, DType out_dtype, cudaStream_t stream);
// out[n, k] (act) = w[n, :k] * sw[n]: int8 weights back to float (W8A16 with m > 8 runs a float GEMM).
void dequant_weights(void* out, const int8_t* w, int64_t ldw, const float* sw, int64_t n, int64_t k, DType act,
                     cudaStream_t stream);
// Fills n elements with counter-based random values from `seed` (same on every device/run):
// i8 uniform in [-127, 127]; f32/f16/bf16 uniform in [-scale, scale]. For --random-weights.
void fill_random(void* out, DType dtype, int64_t n, uint64_t seed, float scale, cudaStream_t stream);
// Converts f32/f16/bf16 -> act elementwise (n elements).
void convert(void* out, DType out_dtype, const void* in, DType in_dtype, int64_t n, cudaStream_t stream);

// ---- row moves and row-vector ops of the model families (rows.cu) ----
// x[i, :] += bias (f32 [n]) for every row of x [m, n], in fp32 (q/k/v biases, Qwen2).
void add_bias(void* x, const float* bias, int64_t m, int64_t n, DType act, cudaStream_t stream);
// dst[i, :] = src[rows[i], :] for i < n; rows (device i32 [n]) outside [0, src_rows) give zero rows.
void gather_rows(void* dst, const void* src, const int32_t* rows, int64_t n, int64_t src_rows, int64_t cols, DType act,
                 cudaStream_t stream);
// dst[rows[i], :] += w[i] * src[i, :] in fp32, rounded once into act (rows distinct within a call;
// rows outside [0, dst_rows) are skipped): a MoE expert's weighted outputs back to their tokens.
void scatter_add_rows(void* dst, const void* src, const int32_t* rows, const float* w, int64_t n, int64_t dst_rows,
                      int64_t cols, DType act, cudaStream_t stream);

// ---- the blocks beyond Llama's skeleton (family_ops.cu) ----
// out[r, j] = gelu_tanh(gu[r, j]) * gu[r, f + j] (GeGLU), gu [m, 2f].
void gelu_tanh_mul(void* out, const void* gate_up, int64_t m, int64_t f, DType act, cudaStream_t stream);
// QK-norm: the first nq + nkv heads (hd each) of every row (row_len elements) of qkv become rmsnorm(head) * w
// (q_w for q heads, k_w for k heads; f32 [hd] on the device).
void head_rmsnorm(void* qkv, int64_t m, int64_t row_len, int64_t nq, int64_t nkv, int64_t hd, const float* q_w,
                  const float* k_w, float eps, DType act, cudaStream_t stream);
// x *= s and x = cap * tanh(x / cap) over n elements of dtype (f32 or the activation dtype).
void scale(void* x, int64_t n, float s, DType dtype, cudaStream_t stream);
void softcap(void* x, int64_t n, float cap, DType dtype, cudaStream_t stream);

// ---- attention (attention_kv_store.cu, attention_decode.cu, attention_decode_int8.cu, attention_prefill.cu) ----
// Writes k, v of every token into its sequence's block at positions[i].
void kv_store(void* k_cache, void* v_cache, const void* qkv, const int32_t* positions, const int32_t* seqs,
              const KvTables& kv, int64_t m,
              const AttnDims& d, DType act, cudaStream_t stream);
// One query token per row, any slots: a block per (split, kv head) serves all of the kv head's query
// heads and writes per-split (max, sum, acc) to the workspace, then a merge kernel writes out. Tokens
// outside the context or the tables get zero rows. With a window the splits cover the token's last
// min(pos + 1, window) positions only. workspace: decode_workspace_floats(m, d) floats
// ([m, nh, S, hd] accumulators, then [m, nh, S, 2] (max, sum)), S = decode_splits(m, d).
int decode_splits(int64_t m, const AttnDims& d);
// Positions per split for a token attending to `len` positions: ceil(len / splits) rounded up to a
// multiple of kDecodeChunk; the token uses ceil(len / decode_chunk) <= splits splits. 32-bit math
// (1 <= len <= 2^31, 1 <= splits <= 256): the kernels call it too.
LATTICE_HD int64_t decode_chunk(int64_t len, int64_t splits) {
    const uint32_t per = (uint32_t(len - 1) / uint32_t(splits)) + 1;
    return int64_t((per + kDecodeChunk - 1) / kDecodeChunk * kDecodeChunk);
}
int64_t decode_workspace_floats(int64_t m, const AttnDims& d);
void attention_decode(void* out, const void* qkv, const void* k_cache, const void* v_cache, const int32_t* positions,
                      const int32_t* seqs, const KvTables& kv, int64_t m, const AttnDims& d, float* workspace, DType act,
                      cudaStream_t stream);
// Tiled (flash-style) prefill over tiles built by build_prefill_tiles (host).
void attention_prefill(void* out, const void* qkv, const void* k_cache, const void* v_cache, const int32_t* positions,
                       const PrefillTile* tiles, int64_t n_tiles, const KvTables& kv, const AttnDims& d, DType act,
                       cudaStream_t stream);
// Host: splits a batch into tiles (runs of one sequence, <= kPrefillRows rows). Returns the count
// written to `tiles` (capacity >= m). Throws if a sequence's positions are not increasing.
int64_t build_prefill_tiles(PrefillTile* tiles, const int32_t* positions, const int32_t* seqs, int64_t m);

// ---- GEMV for decode (gemv.cu), m <= kGemvMaxRows ----
// Decode batches up to 16 tokens run these instead of cuBLASLt (IMMA tiles are mostly padding at
// small m); each weight byte is read once per call for all m rows.
constexpr int kGemvMaxRows = 16;
// out[m, n] = x[m, k] . (w[n, :k] * sw[n])^T ; w row stride ldw (multiple of 16, >= k; w 16-byte
// aligned), x [m, k] contiguous (k % 4 == 0 and x 8-byte aligned: fast path). out_dtype: act or f32.
void gemv_w8a16(void* out, const void* x, const int8_t* w, int64_t ldw, const float* sw, int64_t m, int64_t n,
                int64_t k, DType act, DType out_dtype, cudaStream_t stream);
// out[m, n] = (xq[m, :k] . w[n, :k]) * sx[m] * sw[n], int32 dot (exact), k multiple of 16, ldx/ldw
// multiples of 16 >= k, xq and w 16-byte aligned.
void gemv_w8a8(void* out, const int8_t* xq, int64_t ldx, const float* sx, const int8_t* w, int64_t ldw, const float* sw,
               int64_t m, int64_t n, int64_t k, DType act, DType out_dtype, cudaStream_t stream);

// ---- W8A16 GEMM for m > kGemvMaxRows (gemm_w8a16.cu) ----
// out[m, n] = (x[m, k] . w[n, :k]^T) * sw[n]: int8 weights converted to the activation dtype tile by
// tile in shared memory (tensor cores, WMMA, fp32 accumulate; no dequantized copy of the weight), x
// [m, k] contiguous (any k; 16-byte loads when k % 8 == 0 and x is 16-byte aligned), w 16-byte
// aligned with ldw a multiple of 16 >= k and zero columns past k. out_dtype: act or f32.
void gemm_w8a16(void* out, const void* x, const int8_t* w, int64_t ldw, const float* sw, int64_t m, int64_t n,
                int64_t k, DType act, DType out_dtype, cudaStream_t stream);

// ---- sampling (sampling.cu) ----
// out[i] = argmax_j logits[i, j] (lowest index on ties). logits dtype f32/f16/bf16.
void argmax(int32_t* out, const void* logits, DType dtype, int64_t m, int64_t vocab, cudaStream_t stream);
struct SampleParams {
    float temperature;  // > 0
    int32_t top_k;      // <= 0: no top-k
    float top_p;        // (0, 1]; 1: no top-p
    float u;            // uniform [0, 1) draw that picks the token (the caller owns the RNG)
};
// Samples one id per row from softmax(logits / T) restricted to the top-k and then to the
// smallest top-p mass (elements tied with a threshold are kept). params: device array [m].
void sample(int32_t* out, const void* logits, DType dtype, int64_t m, int64_t vocab, const SampleParams* params,
            cudaStream_t stream);
struct SelectParams {
    float temperature;  // 0: greedy (argmax, lowest index on ties); > 0: sample as `sample` does
    int32_t top_k;      // <= 0: no top-k
    float top_p;        // (0, 1]
    float min_p;        // [0, 1]: keep p >= min_p * p_max (0: off)
    float u;            // uniform [0, 1) draw
    int32_t ban_begin, ban_end;  // this row's banned ids: bans[ban_begin, ban_end)
    float repeat_penalty = 1.0f;     // for this row's edits with repeat set
    int32_t pen_begin = 0, pen_end = 0;  // this row's penalty edits: edits[pen_begin, pen_end)
};
// A penalty on one id of a row (the sampler's repetition / presence / frequency penalties): l = repeat
// ? (l > 0 ? l / repeat_penalty : l * repeat_penalty) : l, then l -= sub. Each id at most once per
// row. `raw` is written by select_tokens: the id's logit before the edit.
struct PenaltyEdit {
    int32_t id;
    int32_t repeat;
    float sub;
    float raw;
};
// One token per row of f32 logits [m, vocab] (modified: penalized ids edited, then banned ids set to
// -inf): ids[i] and logprobs[i] = log softmax(raw row i)[ids[i]] (raw: before the edits and bans).
// params: device [m]; bans: device ids; edits: device, writable (null when no row has any).
void select_tokens(int32_t* ids, float* logprobs, float* logits, int64_t m, int64_t vocab, const SelectParams* params,
                   const int32_t* bans, PenaltyEdit* edits, cudaStream_t stream);

}  // namespace lattice::cuda
