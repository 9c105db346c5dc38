// Model: the forward of every family of the architecture table (runtime/arch/architecture.h: Llama,
// Mistral, Qwen2/3, Mixtral, Qwen3-MoE, Gemma 2/3), assembled from shared blocks (runtime/model/blocks.cpp)
// by the family's entry: norm (RMSNorm; weights applied as (1 + w) where the family says so, folded in at
// load), attention (q/k/v bias, QK-norm, RoPE with a local base per windowed layer, sliding window per
// layer, query scale, score soft-cap), gated MLP (SiLU or tanh-GELU) or mixture of experts, and the
// residual wiring (pre-norm; sandwich norms on the blocks' outputs), plus Gemma's embedding scale and
// final-logit soft-cap. Every backend and every TP x PP layout runs it (a backend refuses at load what it
// does not run, naming the op). Every projection goes through project() (blocks.cpp).
//
// A rank holds one pipeline stage (a contiguous range of layers; the embedding on the first stage,
// the final norm and LM head on the last) and, within it, its tensor-parallel shard:
//   q/k/v and gate/up column-parallel (fused into one wqkv [q|k|v] and one w_gate_up [gate|up]; a
//   q/k/v bias is split like its rows and added in f32 to the GEMM's output, after any dequantization),
//   o and down row-parallel followed by one all-reduce each; attention heads split across TP ranks;
//   kv heads split when tp <= n_kv_heads, replicated (one per rank) when tp > n_kv_heads;
//   embedding and LM head vocab-parallel over ceil(vocab / tp) rows per rank (the last rank's
//   padding rows do not exist: their logits are never produced, so they never win sampling).
// The residual stream [tokens, hidden] is replicated across the TP group.
// A MoE layer (Mixtral) replaces gate/up/down by a replicated router [experts, hidden] and per expert
// a gate/up and a down split like the dense ones: every TP rank routes the same tokens
// (runtime/model/moe_routing.h), runs its slice of each chosen expert over that expert's gathered
// rows, adds the outputs back weighted, and the one all-reduce after the block sums the slices.
//
// Batches are flattened tokens with (sequence, position) each (runtime/backend/backend.h
// TokenBatch): prefill chunks of some sequences and decode tokens of others mix freely. K/V live in
// a paged cache per layer, [kv_blocks, block_size, local kv heads, head_dim], addressed through the
// batch's block tables (allocate_kv sizes it once the weights are in place).
#pragma once

#include "parallel/communicator.h"
#include "runtime/backend/backend.h"
#include "parallel/world_config.h"
#include "runtime/arch/config.h"
#include "runtime/model/lora.h"
#include "runtime/model/moe_routing.h"
#include "runtime/weights/tensor_source.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace lattice {

struct HostTensor;  // runtime/model/rank_weights.h

struct LoadProgress {
    int64_t tensors_done = 0, tensors_total = 0;
    int64_t elements_done = 0, elements_total = 0;
    int64_t bytes_read = 0;
};

struct ModelOptions {
    QuantMode quant = QuantMode::kNone;
    bool quant_head = false;        // also quantize the LM head (embedding stays float)
    int64_t max_seq = 0;            // positions per sequence; 0: resolve_max_seq (parallel/world_config.h)
    int64_t block_size = 16;        // KV positions per cache block
    KvDtype kv_dtype = KvDtype::kAuto;  // the KV cache's element type (auto: the activation dtype)
    int64_t max_batch_tokens = 256; // tokens per forward call (longer prompts are chunked by the caller)
    int tp = 1, tp_rank = 0;
    int64_t layer_begin = 0, layer_end = -1;  // this stage's layers; -1: all
    bool first_stage = true, last_stage = true;
    // SmoothQuant factors (runtime/model/smoothquant.h) folded into the norm and wqkv / w_gate_up weights
    // at load; empty: none.
    std::string smooth_path;
    // Called after each weight of this rank is in the backend (launch/ shows load progress from it;
    // nothing here prints). Elements are this rank's, bytes those read from the checkpoint so far.
    std::function<void(const LoadProgress&)> on_progress;
    // The simulated device (runtime/backend/sim/sim_device.h): the shape and the stage's layer range
    // only, no weights, scratch or KV memory; the engine never runs its forward.
    bool shape_only = false;
};

// Sees the activation entering a norm-preceded GEMM: which 0 = attention input (before wqkv),
// 1 = MLP input (before w_gate_up); layer is the global index; x [tokens, hidden] on the device.
using ActivationObserver = std::function<void(int64_t layer, int which, const View& x)>;

struct LayerWeights {
    Buffer attn_norm;  // [hidden] f32 (norms: (1 + w) folded in for norm_one_plus families)
    Linear wqkv;       // [(nq + 2 nkv) * head_dim, hidden], local heads
    Buffer qkv_bias;   // [(nq + 2 nkv) * head_dim] f32, local heads (qkv_bias families; empty otherwise)
    Linear wo;         // [hidden, nq * head_dim], local columns
    Buffer ffn_norm;   // [hidden] f32
    Buffer q_norm, k_norm;                 // [head_dim] f32 (QK-norm families; empty otherwise)
    Buffer post_attn_norm, post_ffn_norm;  // [hidden] f32 (sandwich-norm families; empty otherwise)
    Linear w_gate_up;  // [2 * ffn_local, hidden]: gate rows then up rows
    Linear w_down;     // [hidden, ffn_local]
    Linear router;                      // MoE: [experts, hidden] float, replicated
    std::vector<Linear> expert_gate_up;  // MoE: per expert [2 * ffn_local, hidden]
    std::vector<Linear> expert_down;     // MoE: per expert [hidden, ffn_local]
    Buffer k_cache;    // [kv_blocks, block_size, nkv_local, kv_row_elems] of kv_dtype() (backend.h)
    Buffer v_cache;
};

class Model {
public:
    // Loads this rank's shard from `src` (reads only its slices; runtime/model/rank_weights.h says which
// tensors, from an original or a converted checkpoint). `tp_comm` may be null when tp == 1.
    Model(const TensorSource& src, Backend& backend, const ModelOptions& opt, Communicator* tp_comm);
    ~Model();

    const ModelConfig& config() const { return cfg_; }
    const ModelOptions& options() const { return opt_; }
    const ShardShape& shard() const { return shard_; }
    Backend& backend() { return be_; }
    int64_t max_seq() const { return opt_.max_seq; }
    const AttentionShape& attention_shape() const { return attn_; }
    // Bytes of K/V cache one block costs on this rank (every local layer, K and V).
    int64_t kv_bytes_per_block() const;
    DType kv_dtype() const { return kv_dtype_; }  // the KV cache's elements (ModelOptions::kv_dtype resolved)
    // (Re)allocates the paged K/V cache of every local layer with `num_blocks` blocks (zeroed).
    void allocate_kv(int64_t num_blocks);
    int64_t kv_blocks() const { return attn_.num_blocks; }
    // The layers run the fused W8A8 quantization (Backend::fuses_quant and every layer linear W8A8).
    bool fused_quant() const { return fused_quant_; }
    int64_t weight_bytes() const;  // bytes of weights held by this rank
    // Bytes of checkpoint tensor data this rank read while loading (its slices, in file encoding).
    int64_t checkpoint_bytes_read() const { return checkpoint_bytes_read_; }
    // Bytes of weights one decode step of one token streams from memory: everything but the embedding
    // table, of which a step reads one row per token, the copies a linear holds beside what decode reads
    // (Linear::aside_bytes: oneDNN's for m >= 16), and in a MoE layer only the num_experts_per_tok
    // experts the token is routed to (the decode-bandwidth floor's numerator).
    int64_t streamed_weight_bytes() const;
    // MoE layers: expert FFNs run (one expert's slice over its gathered rows) and the rows they ran
    // over, since the model was made; a decode step of one token runs num_experts_per_tok per layer.
    struct MoeCounters {
        int64_t expert_runs = 0, expert_rows = 0;
    };
    const MoeCounters& moe_counters() const { return moe_counters_; }

    // First stage: embeds batch.ids into `hidden` [count, hidden].
    void embed(const TokenBatch& batch, const View& hidden);
    // Runs this stage's layers on hidden [count, hidden] in place (the residual stream).
    void run_layers(const TokenBatch& batch, const View& hidden);
    // Last stage: final norm + LM head for the given rows of hidden; logits [rows.size(), vocab]
    // on the host (gathered over the TP group, padding dropped).
    void head(const View& hidden, const std::vector<int64_t>& rows, float* logits);
    // The same logits left where the backend computed them: f32 [rows.size(), vocab] on its device
    // (model scratch, valid until the next call), for Backend::select_tokens.
    View head_logits(const View& hidden, const std::vector<int64_t>& rows);

    // Single-stage convenience: embed + layers + head for `rows` of the batch (one backend step).
    void forward(const TokenBatch& batch, const std::vector<int64_t>& logit_rows, float* logits);

    // Waits (bounded) for this rank's queued TP collectives: after replaying a captured step, whose
    // capture could not wait (run_layers and head_logits wait on their own otherwise).
    void wait_comm() {
        if (opt_.tp > 1) tp_comm_->wait_idle();
    }

    // Device buffer for `count` hidden rows (scratch owned by the model, valid until the next call).
    View hidden_scratch(int64_t count);

    // Seconds this rank has spent inside its TP communicator's calls (all-reduces, the logits'
    // all-gather) since the model was made: with a host communicator (MPI) the exchange and the wait
    // for the slowest peer; with a device one (NCCL) only the enqueue, the transfer being stream work
    // (the TP group is deferred: run_layers and head_logits wait for it once, bounded, at their end).
    double comm_seconds() const { return comm_seconds_; }

    // Whether a step's work can be captured and replayed (Backend::capture_step): not for a MoE model,
    // whose router logits come to the host every layer to pick the experts and size their GEMMs.
    bool capturable() const { return !cfg_.is_moe(); }

    // Calibration hook (runtime/model/smoothquant.h); empty (the default) costs one branch per GEMM.
    void set_observer(ActivationObserver obs) { observer_ = std::move(obs); }

    // LoRA (runtime/model/lora.h): puts this rank's shard of `ad` (which holds at least this stage's
    // layers) in `slot` >= 1, replacing what was there; null empties the slot. A batch's
    // TokenBatch::seq_loras picks a slot per sequence; an empty slot there is an Error. Refused on a
    // backend without row gather / scatter-add (Op::kMoe) and with SmoothQuant folding.
    void set_lora(int32_t slot, std::shared_ptr<const LoraAdapter> ad);
    bool has_lora(int32_t slot) const {
        return slot >= 1 && slot < int32_t(loras_.size()) && loras_[size_t(slot)].adapter != nullptr;
    }
    int64_t lora_bytes() const;  // bytes of adapter weights this rank holds

private:
    // The bytes of every tensor but the embedding table: each linear's weight_bytes, or with `streamed` its
    // streamed_bytes and of each layer's experts the share a token is routed to.
    int64_t tensor_bytes(bool streamed) const;
    void load(const TensorSource& src);
    // The one place a linear is made: int8 weights of a converted checkpoint go to the backend as
    // they are (make_linear_int8), float ones are prepared (and quantized) by make_linear.
    Linear make_linear(HostTensor& w, QuantMode mode, bool tied_head = false);
    void check_ops() const;  // every op the family's blocks need is supported (names the op otherwise)
    void tp_all_reduce(const View& x);  // timed (comm_seconds)
    // ---- the blocks (blocks.cpp) ----
    // A layer's activations for T tokens (views of the scratch buffers).
    struct Acts {
        View normed, qkv, attn, proj, gu;
    };
    Acts acts(int64_t T) const;
    // The one place a projection runs: out = in . W^T, from the fused-quantized rows qa when given.
    void project(const View& out, const View& in, const Linear& w, const QuantActs* qa = nullptr);
    // hidden += x (x empty: no add); a.normed = norm(hidden) * w, quantized too when fused.
    void residual_norm(const View& hidden, const View& x, const Buffer& w, const Acts& a);
    // a.proj = o_proj(attention(a.normed)), all-reduced and post-normed (sandwich): layer `layer`'s options.
    void attention_block(const TokenBatch& batch, LayerWeights& L, int64_t layer, const Acts& a);
    // a.proj = the MLP (gated or MoE) of a.normed, all-reduced and post-normed (sandwich).
    void mlp_block(LayerWeights& L, size_t li, const Acts& a);
    // out = the MoE block of layer L over normed [T, hidden] (this rank's slice of every expert).
    void moe_block(LayerWeights& L, const View& normed, const View& out);
    // out = down(act(gate) * up) of gu's rows: fused-quantized through qa_ffn_ when fused_quant_.
    void gated_down(const View& gu, const View& out, const Linear& down);
    // LoRA: the batch's rows grouped by adapter slot (once per run_layers), then, after projection `site`
    // of local layer li: out[rows of each slot] += s * (in A^T) B^T (model_lora.cpp). No adapter in the
    // batch: one branch.
    void prepare_lora(const TokenBatch& batch);
    void add_lora(const View& out, const View& in, size_t li, LoraSite site);

    ModelConfig cfg_;
    Backend& be_;
    DType kv_dtype_ = DType::kF32;
    ModelOptions opt_;
    Communicator* tp_comm_;
    LocalComm local_comm_;
    ShardShape shard_;
    AttentionShape attn_;

    Buffer embed_table_;  // [vocab_rows, hidden] checkpoint float dtype (first stage, and head when tied)
    Linear lm_head_;      // [vocab_rows, hidden] (last stage)
    // The embedding's rows (first stage). Tied embeddings whose float head keeps the checkpoint's rows as they
    // are (one stage holding both, the backend's float layout in the table's dtype) get no table of their own:
    // the head's weight serves, one copy instead of two (a Gemma-sized vocabulary's table is ~1.8 GB in bf16).
    View embed_rows() const { return embed_table_.empty() ? lm_head_.weight.view() : embed_table_.view(); }
    Buffer final_norm_;   // [hidden]
    Buffer inv_freq_;     // [head_dim / 2]
    Buffer inv_freq_local_;  // [head_dim / 2]: the windowed layers' (a family with a local rope base), else empty
    Activation act_kind_ = Activation::kSilu;
    std::vector<LayerWeights> layers_;
    ActivationObserver observer_;
    int64_t checkpoint_bytes_read_ = 0;
    double comm_seconds_ = 0;

    // Scratch activations for max_batch_tokens rows.
    Buffer hidden_, normed_, qkv_, attn_out_, proj_, gate_up_, act_, head_in_, logits_;
    // MoE: router logits [T, experts], an expert's gathered inputs and outputs [T, hidden].
    Buffer router_logits_, moe_in_, moe_out_;
    Buffer route_rows_, route_weights_;  // [T * k] i32 tokens and f32 weights of a layer's routes, by expert
    std::vector<float> router_host_;
    MoeRoutes routes_;
    MoeCounters moe_counters_;
    // Fused W8A8 quantization (Backend::fuses_quant, every layer linear W8A8): the norms quantize
    // the hidden-size activations into qa_hidden_ (read by wqkv and w_gate_up), SiLU * up into
    // qa_ffn_ (read by w_down).
    bool fused_quant_ = false;
    QuantActs qa_hidden_, qa_ffn_;
    Buffer logits_full_;  // [rows, vocab] f32: the gathered blocks in vocabulary order (tp > 1)
    // LoRA: shards by slot (0 unused); this batch's groups (a slot's rows are lora_rows_[begin, begin + n),
    // its scale in lora_scales_ beside them, on the device); scratch [max_batch_tokens, *] made with the
    // first adapter: gathered inputs, x A^T, one part's B product, the fused projection's delta.
    struct LoraGroup {
        int32_t slot = 0;
        int64_t begin = 0, n = 0;
    };
    std::vector<LoraShard> loras_;
    std::vector<LoraGroup> lora_groups_;
    std::vector<int32_t> lora_rows_host_;
    std::vector<float> lora_scales_host_;
    Buffer lora_rows_, lora_scales_, lora_in_, lora_t_, lora_y_, lora_d_;
    int64_t lora_scratch_rank_ = 0;
};

}  // namespace lattice
