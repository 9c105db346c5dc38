// CPU kernels for the non-GEMM ops of the forward (every family's blocks), fp32 activations.
// Layouts: activations [m, cols] row-major; qkv rows are [q heads | k heads | v heads], each head
// head_dim contiguous; KV caches are paged: num_blocks blocks of block_size * n_kv * kv_row_bytes, position p
// of sequence s in block block_tables[s * table_width + p / block_size]; inside a block V is rows
// [n_kv, block_size, head_dim] and K is transposed, [n_kv, head_dim, block_size] (attention.cpp says why).
// Hot loops are compiled for several ISAs (isa_variants.h) and picked per call by the one ISA decision (isa.h).
#pragma once

#include "kernels/cpu/thread_pool.h"
#include "base/dtype.h"

#include <cstdint>

namespace lattice::cpu {

void rmsnorm(float* out, const float* x, const float* w, int64_t m, int64_t n, float eps, ThreadPool& pool);
// residual += x; out = rmsnorm(residual) * w
void add_rmsnorm(float* residual, const float* x, float* out, const float* w, int64_t m, int64_t n, float eps,
                 ThreadPool& pool);
// out[i, :] = table[ids[i] - row_offset, :] (table dtype f32/f16/bf16) or zeros when not local.
void embed(float* out, const void* table, DType table_dtype, int64_t table_rows, int64_t n, const int32_t* ids,
           int64_t m, int64_t row_offset);
// In-place half-split RoPE of the first n_heads + n_kv heads of every qkv row.
void rope(float* qkv, int64_t m, int64_t row_stride, const int32_t* positions, int64_t n_rot_heads, int64_t head_dim,
          const float* inv_freq, ThreadPool& pool);
struct AttentionArgs {
    int64_t n_heads, n_kv, head_dim;
    int64_t block_size, num_blocks;  // the paged cache
    const int32_t* block_tables;     // [num_seqs, table_width]
    int64_t num_seqs, table_width;
    float scale;
    int64_t window = 0;  // sliding window W: keys positions[i] - W < j <= positions[i]; 0: all
    DType kv_dtype = DType::kF32;  // the cache's rows: f32, f16, bf16 or i8 (kv_row_bytes)
    float softcap = 0.0f;  // scores (q . k * scale) become softcap * tanh(score / softcap); 0: none (last, so
                           // that the positional initializers of the fields above stay valid)
};
// Bytes of one cache row (a token's k or v of one kv head): head_dim elements, and for i8 the row's
// f32 scale (x ~= q * scale, symmetric per token and kv head, kernels/common/quantize.h). An i8 block
// holds its values (K transposed, as above), then their [block_size, n_kv] scales.
int64_t kv_row_bytes(DType kv, int64_t head_dim);
// Stores k/v of token i (sequence seqs[i], position positions[i]) in its block (converted or
// quantized to kv_dtype), then causal GQA attention over positions 0..positions[i] of its sequence (the
// last `window` of them when window > 0); out [m, n_heads * head_dim].
void attention(float* out, const float* qkv, void* k_cache, void* v_cache, const int32_t* positions,
               const int32_t* seqs, int64_t m, const AttentionArgs& a, ThreadPool& pool);
void silu_mul(float* out, const float* gate_up, int64_t m, int64_t f, ThreadPool& pool);
// out[r, j] = gelu_tanh(gu[r, j]) * gu[r, f + j]: GELU's tanh approximation 0.5 x (1 + tanh(sqrt(2/pi)
// (x + 0.044715 x^3))) (GeGLU).
void gelu_tanh_mul(float* out, const float* gate_up, int64_t m, int64_t f, ThreadPool& pool);
// QK-norm: each of the first nq + nkv heads (of head_dim each) of every qkv row (row_stride floats)
// becomes rmsnorm(head) * w, w = q_w for the nq q heads and k_w for the nkv k heads.
void head_rmsnorm(float* qkv, int64_t m, int64_t row_stride, int64_t nq, int64_t nkv, int64_t head_dim,
                  const float* q_w, const float* k_w, float eps, ThreadPool& pool);
// x[i] *= s; x[i] = cap * tanh(x[i] / cap).
void scale(float* x, int64_t n, float s);
void softcap(float* x, int64_t n, float cap);
void add(float* out, const float* a, const float* b, int64_t n);
// x[r, c] += bias[c] for rows x cols row-major x.
void add_bias_rows(float* x, const float* bias, int64_t rows, int64_t cols);

// The device token selection (kernels/cuda select_tokens) on the host, for one row of logits
// (modified: banned ids become -inf): temperature 0 is the argmax (lowest id on ties); otherwise
// softmax(x / T) over the top-k (ties with the k-th kept), then p >= min_p * p_max, then the
// smallest probability threshold whose mass reaches top_p (ties kept), then the inverse CDF in id
// order at u * mass. Returns the id; *logprob = log softmax(raw row)[id].
int32_t select_token(float* row, int64_t vocab, float temperature, int64_t top_k, float top_p, float min_p, float u,
                     const int32_t* bans, int64_t n_bans, float* logprob);

// log(sum_j exp(x[j])) over a row, in double (NaN entries count as -inf; -inf when every entry
// is): the log-softmax denominator of select_token and of the engine's host sampling path.
double log_sum_exp(const float* x, int64_t n);
// The lowest index of the largest entry of a row (n < 2^31; NaN never chosen; 0 when no entry exceeds -inf).
int64_t argmax(const float* x, int64_t n);

// Vector primitives (exposed for tests).
float dot(const float* a, const float* b, int64_t n);
void axpy(float* y, float a, const float* x, int64_t n);  // y += a * x
float sum_squares(const float* x, int64_t n);

}  // namespace lattice::cpu
