// The model (see model.h for the sharding rules): loading (only this rank's slices), memory, the embedding
// and the LM head; the layers' blocks are blocks.cpp.
#include "runtime/model/model.h"

#include "base/clock.h"
#include "base/log.h"
#include "base/convert.h"
#include "runtime/arch/architecture.h"
#include "runtime/model/moe_routing.h"
#include "runtime/model/rank_weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <string>

namespace lattice {

namespace {
// Whether a float head holds the table's rows as the checkpoint has them: the same dtype and [rows, cols],
// contiguous, nothing packed beside (then the embedding may read it: Model::embed_rows).
bool head_holds_rows(const Linear& head, const View& table) {
    const View& w = head.weight.view();
    return head.mode == QuantMode::kNone && !head.prepared && head.scales.empty() && head.aux.empty() &&
           w.dtype == table.dtype && w.ndim == 2 && w.shape[0] == table.shape[0] && w.shape[1] == table.shape[1] &&
           w.is_contiguous();
}
}  // namespace

Model::Model(const TensorSource& src, Backend& backend, const ModelOptions& opt, Communicator* tp_comm)
    : cfg_(src.config()), be_(backend), opt_(opt), tp_comm_(tp_comm ? tp_comm : &local_comm_) {
    LATTICE_CHECK(tp_comm_->size() == opt_.tp, "Model: tp {} but the TP communicator has {} ranks", opt_.tp,
                  tp_comm_->size());
    if (opt_.layer_end < 0) opt_.layer_end = cfg_.n_layers;
    LATTICE_CHECK(0 <= opt_.layer_begin && opt_.layer_begin < opt_.layer_end && opt_.layer_end <= cfg_.n_layers,
                  "Model: layer range [{}, {}) invalid for {} layers", opt_.layer_begin, opt_.layer_end, cfg_.n_layers);
    opt_.max_seq = resolve_max_seq(opt_.max_seq, cfg_.max_position);
    LATTICE_CHECK(opt_.max_seq <= cfg_.max_position, "max sequence {} exceeds max_position_embeddings {}", opt_.max_seq,
                  cfg_.max_position);
    constexpr int64_t kMaxBlockSize = 4096;  // KV positions per block
    LATTICE_CHECK(opt_.block_size >= 1 && opt_.block_size <= kMaxBlockSize && opt_.max_batch_tokens >= 1,
                  "Model: block size {} (1 .. {}) and max_batch_tokens {} (>= 1)", opt_.block_size, kMaxBlockSize,
                  opt_.max_batch_tokens);
    shard_ = shard_shape(cfg_.dims(), opt_.tp, opt_.tp_rank);
    attn_.n_heads = shard_.n_heads;
    attn_.n_kv_heads = shard_.n_kv;
    attn_.head_dim = cfg_.head_dim;
    attn_.block_size = opt_.block_size;
    attn_.num_blocks = 0;  // allocate_kv
    attn_.table_width = (opt_.max_seq + opt_.block_size - 1) / opt_.block_size;
    attn_.max_seq = opt_.max_seq;
    // longrope's factor on cos and sin scales q and k alike: the scores by its square.
    const double af = cfg_.rope_attention_factor();
    attn_.scale = float(af == 1.0 ? cfg_.attention_scale() : cfg_.attention_scale() * af * af);
    attn_.softcap = float(cfg_.attn_softcap);
    // A window as long as the context never bites: full attention (any backend); nor does one no layer
    // has (Qwen2's max_window_layers past the last layer). attention_block drops it in the global layers.
    bool windowed = false;
    for (int64_t l = 0; l < cfg_.n_layers; ++l) windowed = windowed || cfg_.layer_windowed(l);
    attn_.window = windowed && cfg_.sliding_window < opt_.max_seq ? cfg_.sliding_window : 0;
    act_kind_ = cfg_.hidden_act == HiddenAct::kGeluTanh ? Activation::kGeluTanh : Activation::kSilu;
    kv_dtype_ = resolve_kv_dtype(opt_.kv_dtype, be_.kv_auto_dtype());
    if (opt_.shape_only) return;
    LATTICE_CHECK(be_.supports(Op::kKvCache, kv_dtype_), "backend {} does not support --kv-cache-dtype {} ({})",
                  be_.name(), kv_dtype_name(opt_.kv_dtype), dtype_name(kv_dtype_));
    check_ops();
    if (opt_.quant != QuantMode::kNone)
        LATTICE_CHECK(be_.supports(Op::kGemmInt8, DType::kI8), "backend {} does not support quantization {}",
                      be_.name(), quant_mode_name(opt_.quant));
    if (is_int4(opt_.quant))  // (a 4-bit run's LM head may be int8: rank_weights.h)
        LATTICE_CHECK(be_.supports(Op::kGemmInt4, DType::kU8),
                      "backend {} has no 4-bit kernels for quantization {} (run it on the CPU backend, or use w8a8)",
                      be_.name(), quant_mode_name(opt_.quant));
    // Every tensor needed is there with its shape, and nothing is left unused; a converted checkpoint
    // holds rank-local names instead, which RankWeights checks against the rank's plan.
    if (!src.prepared()) check_tensor_set(src);
    load(src);
    const int64_t T = opt_.max_batch_tokens, H = cfg_.hidden;
    const DType act = be_.activation_dtype();
    hidden_ = be_.alloc(act, {T, H});
    normed_ = be_.alloc(act, {T, H});
    qkv_ = be_.alloc(act, {T, (shard_.n_heads + 2 * shard_.n_kv) * cfg_.head_dim});
    attn_out_ = be_.alloc(act, {T, shard_.n_heads * cfg_.head_dim});
    proj_ = be_.alloc(act, {T, H});
    gate_up_ = be_.alloc(act, {T, 2 * shard_.ffn});
    act_ = be_.alloc(act, {T, shard_.ffn});
    if (cfg_.is_moe() && !layers_.empty()) {
        router_logits_ = be_.alloc(act, {T, cfg_.n_experts});
        moe_in_ = be_.alloc(act, {T, H});
        moe_out_ = be_.alloc(act, {T, H});
        route_rows_ = be_.alloc(DType::kI32, {T * cfg_.n_experts_used});
        route_weights_ = be_.alloc(DType::kF32, {T * cfg_.n_experts_used});
    }
    if (opt_.last_stage) {
        head_in_ = be_.alloc(act, {T, H});
        // T rows of logits, of which a step fills one per sampled sequence: lazily materialized.
        logits_ = be_.alloc_lazy(DType::kF32, {int64_t(opt_.tp) * T * shard_.vocab_per_rank});
        if (opt_.tp > 1) logits_full_ = be_.alloc_lazy(DType::kF32, {T * cfg_.vocab});
    }
    const auto w8a8 = [](const Linear& w) { return w.mode == QuantMode::kW8A8; };
    // (GeGLU has no fused quantizing kernel: its w_down quantizes its input itself.)
    fused_quant_ = be_.fuses_quant() && !layers_.empty() && act_kind_ == Activation::kSilu &&
                   std::all_of(layers_.begin(), layers_.end(), [&](const LayerWeights& L) {
                       const bool ffn = L.expert_down.empty() ? w8a8(L.w_gate_up) && w8a8(L.w_down)
                                                              : std::all_of(L.expert_gate_up.begin(),
                                                                            L.expert_gate_up.end(), w8a8) &&
                                                                    std::all_of(L.expert_down.begin(),
                                                                                L.expert_down.end(), w8a8);
                       return w8a8(L.wqkv) && ffn;
                   });
    if (fused_quant_) {
        qa_hidden_ = be_.alloc_quant_acts(T, H);
        qa_ffn_ = be_.alloc_quant_acts(T, shard_.ffn);
    }
}

Model::~Model() = default;

void Model::check_ops() const {
    const Architecture& arch = architecture_of(cfg_);
    const DType act = be_.activation_dtype();
    const Op ops[] = {Op::kEmbed, Op::kRmsNorm, Op::kAddRmsNorm, Op::kRope, Op::kAttention, Op::kSiluMul, Op::kAdd};
    for (Op op : ops)
        LATTICE_CHECK(be_.supports(op, act), "backend {} does not support {} in {}", be_.name(), op_name(op),
                      dtype_name(act));
    // The options of the family's blocks, each an op the backend must have.
    const struct {
        bool needed;
        Op op;
        std::string why;
    } options[] = {
        {arch.qkv_bias, Op::kAddBias, "needs its q/k/v biases"},
        {attn_.window > 0, Op::kSlidingWindow,
         fmt::format("has sliding_window {} < {} positions", attn_.window, opt_.max_seq)},
        {cfg_.is_moe(), Op::kMoe, fmt::format("routes tokens to {} experts", cfg_.n_experts)},
        {act_kind_ == Activation::kGeluTanh, Op::kGeluTanhMul, "has a GeGLU MLP"},
        {arch.qk_norm, Op::kHeadNorm, "norms q and k per head"},
        {arch.embed_scale, Op::kScale, "scales its embeddings"},
        {cfg_.final_softcap > 0, Op::kSoftCap, "soft-caps its logits"},
        {cfg_.attn_softcap > 0, Op::kAttnSoftCap, "soft-caps its attention scores"},
    };
    for (const auto& o : options)
        LATTICE_CHECK(!o.needed || be_.supports(o.op, act),
                      "backend {} does not support {} in {}: architecture '{}' {} (run it on the CPU backend)",
                      be_.name(), op_name(o.op), dtype_name(act), arch.name, o.why);
    LATTICE_CHECK(!arch.norm_one_plus || opt_.smooth_path.empty(),
                  "SmoothQuant (--smooth) is not supported for architecture '{}' (its norms are applied as 1 + w)",
                  arch.name);
}

Linear Model::make_linear(HostTensor& w, QuantMode mode, bool tied_head) {
    if (w.int4()) return be_.make_linear_int4(w.q4.matrix(), mode);
    if (w.dtype == DType::kI8) return be_.make_linear_int8(w.view(), w.scales_view(), mode);
    return tied_head ? be_.make_tied_head(w.view(), mode) : be_.make_linear(w.view(), mode);
}

void Model::load(const TensorSource& src) {
    const ModelConfig& c = cfg_;
    const int64_t hd = c.head_dim;
    std::vector<float> inv = c.rope_inv_freq(false, opt_.max_seq);
    std::vector<float> factors = src.rope_freq_factors();
    if (!factors.empty()) {
        // GGUF carries llama3 scaling as per-pair divisors of the unscaled frequencies.
        LATTICE_CHECK(int64_t(factors.size()) == hd / 2, "rope_freqs has {} entries, expected {}", factors.size(),
                      hd / 2);
        for (int64_t i = 0; i < hd / 2; ++i)
            inv[size_t(i)] = float(1.0 / std::pow(c.rope_theta, double(2 * i) / double(hd)) / factors[size_t(i)]);
    }
    inv_freq_ = be_.make_f32(View::contiguous(inv.data(), DType::kF32, {int64_t(inv.size())}));
    if (c.rope_local_theta > 0) {
        std::vector<float> local = c.rope_inv_freq(true);
        inv_freq_local_ = be_.make_f32(View::contiguous(local.data(), DType::kF32, {int64_t(local.size())}));
    }
    const bool one_plus = architecture_of(c).norm_one_plus;
    // A norm weight as the backend applies it: w, or 1 + w (in f32, as transformers' Gemma RMSNorm adds it).
    const auto norm = [&](HostTensor& h) {
        if (one_plus)
            for (float& w : std::span(reinterpret_cast<float*>(h.data.data()), size_t(h.cols))) w += 1.0f;
        return be_.make_f32(h.view());
    };

    RankWeights weights(src, opt_);
    layers_.resize(size_t(opt_.layer_end - opt_.layer_begin));
    for (LayerWeights& L : layers_) {
        L.expert_gate_up.resize(size_t(c.n_experts));
        L.expert_down.resize(size_t(c.n_experts));
    }
    LoadProgress progress;
    progress.tensors_total = int64_t(weights.tensors().size());
    for (const RankTensor& t : weights.tensors()) progress.elements_total += t.rows * t.cols;
    for (const RankTensor& t : weights.tensors()) {
        if (opt_.on_progress) {  // before the read too: the first line appears while the first weight loads
            progress.bytes_read = weights.bytes_read();
            opt_.on_progress(progress);
        }
        progress.tensors_done += 1;
        progress.elements_done += t.rows * t.cols;
        HostTensor h = weights.read(t, be_.packs_kquant());
        LayerWeights* L = t.layer >= 0 ? &layers_[size_t(t.layer - opt_.layer_begin)] : nullptr;
        switch (t.role) {
            case WeightRole::kEmbed:
                if (t.tied_head) lm_head_ = make_linear(h, t.mode, true);
                if (t.table && !(t.tied_head && head_holds_rows(lm_head_, h.view())))
                    embed_table_ = be_.make_table(h.view());
                break;
            case WeightRole::kLmHead:
                lm_head_ = make_linear(h, t.mode);
                break;
            case WeightRole::kFinalNorm: final_norm_ = norm(h); break;
            case WeightRole::kAttnNorm: L->attn_norm = norm(h); break;
            case WeightRole::kFfnNorm: L->ffn_norm = norm(h); break;
            case WeightRole::kQNorm: L->q_norm = norm(h); break;
            case WeightRole::kKNorm: L->k_norm = norm(h); break;
            case WeightRole::kPostAttnNorm: L->post_attn_norm = norm(h); break;
            case WeightRole::kPostFfnNorm: L->post_ffn_norm = norm(h); break;
            case WeightRole::kWqkv: L->wqkv = make_linear(h, t.mode); break;
            case WeightRole::kBqkv: L->qkv_bias = be_.make_f32(h.view()); break;
            case WeightRole::kWo: L->wo = make_linear(h, t.mode); break;
            case WeightRole::kWGateUp: L->w_gate_up = make_linear(h, t.mode); break;
            case WeightRole::kWDown: L->w_down = make_linear(h, t.mode); break;
            case WeightRole::kRouter: L->router = make_linear(h, t.mode); break;
            case WeightRole::kExpGateUp: L->expert_gate_up[size_t(t.expert)] = make_linear(h, t.mode); break;
            case WeightRole::kExpDown: L->expert_down[size_t(t.expert)] = make_linear(h, t.mode); break;
        }
        weights.recycle(std::move(h));  // every backend has copied what it keeps
    }
    checkpoint_bytes_read_ = weights.bytes_read();
    if (opt_.on_progress) {
        progress.bytes_read = checkpoint_bytes_read_;
        opt_.on_progress(progress);
    }
}

int64_t Model::kv_bytes_per_block() const {
    return int64_t(layers_.size()) * 2 * opt_.block_size * shard_.n_kv * kv_row_elems(kv_dtype_, cfg_.head_dim) *
           dtype_size(kv_dtype_);
}

void Model::allocate_kv(int64_t num_blocks) {
    LATTICE_CHECK(num_blocks >= 1, "KV cache: {} blocks (need >= 1)", num_blocks);
    if (opt_.shape_only) {  // (no layers_ exist to hold them)
        attn_.num_blocks = num_blocks;
        return;
    }
    const int64_t row = kv_row_elems(kv_dtype_, cfg_.head_dim);
    for (LayerWeights& L : layers_) {
        L.k_cache = Buffer{};
        L.v_cache = Buffer{};
        L.k_cache = be_.alloc_lazy(kv_dtype_, {num_blocks, opt_.block_size, shard_.n_kv, row});
        L.v_cache = be_.alloc_lazy(kv_dtype_, {num_blocks, opt_.block_size, shard_.n_kv, row});
    }
    attn_.num_blocks = num_blocks;
}

int64_t Model::tensor_bytes(bool streamed) const {
    const auto of = [streamed](const Linear& l) { return streamed ? l.streamed_bytes() : l.weight_bytes(); };
    int64_t b = of(lm_head_) + final_norm_.bytes();
    for (const auto& L : layers_) {
        b += L.q_norm.bytes() + L.k_norm.bytes() + L.post_attn_norm.bytes() + L.post_ffn_norm.bytes();
        b += L.attn_norm.bytes() + L.ffn_norm.bytes() + of(L.wqkv) + L.qkv_bias.bytes() + of(L.wo) + of(L.w_gate_up) +
             of(L.w_down) + of(L.router);
        int64_t experts = 0;
        for (size_t e = 0; e < L.expert_down.size(); ++e) experts += of(L.expert_gate_up[e]) + of(L.expert_down[e]);
        // Experts of one layer have equal shapes: a token reads k of the E.
        b += streamed && experts > 0 ? experts / cfg_.n_experts * cfg_.n_experts_used : experts;
    }
    return b;
}

int64_t Model::weight_bytes() const {
    return embed_table_.bytes() + tensor_bytes(false);
}

int64_t Model::streamed_weight_bytes() const {
    return tensor_bytes(true);
}

View Model::hidden_scratch(int64_t count) {
    LATTICE_CHECK(count >= 1 && count <= opt_.max_batch_tokens, "batch of {} tokens exceeds max_batch_tokens {}",
                  count, opt_.max_batch_tokens);
    return hidden_.view().row_range(0, count);
}

void Model::tp_all_reduce(const View& x) {
    const auto t0 = SteadyClock::now();
    tp_comm_->all_reduce_sum(x);
    if (observer_) tp_comm_->wait_idle();  // the observer reads x on the host
    comm_seconds_ += seconds_since(t0);
}

void Model::embed(const TokenBatch& batch, const View& hidden) {
    LATTICE_CHECK(opt_.first_stage, "Model::embed on a stage without the embedding");
    for (int64_t i = 0; i < batch.count; ++i)
        LATTICE_CHECK(batch.ids[i] >= 0 && batch.ids[i] < cfg_.vocab, "token id {} at position {} is outside the vocab "
                      "(size {})", batch.ids[i], i, cfg_.vocab);
    be_.embed(hidden, embed_rows(), batch, shard_.vocab0);
    // Gemma: times sqrt(hidden) in the activations' precision (exact on every rank: the other ranks' rows are 0).
    if (architecture_of(cfg_).embed_scale) be_.scale(hidden, float(std::sqrt(double(cfg_.hidden))));
    if (opt_.tp > 1) tp_all_reduce(hidden);
}

View Model::head_logits(const View& hidden, const std::vector<int64_t>& rows) {
    LATTICE_CHECK(opt_.last_stage, "Model::head on a stage without the LM head");
    const int64_t R = int64_t(rows.size());
    const int64_t Vp = shard_.vocab_per_rank, V = cfg_.vocab;
    if (R == 0) return View::contiguous(logits_.data(), DType::kF32, {0, V}, be_.device());
    LATTICE_CHECK(R <= opt_.max_batch_tokens, "head: {} rows exceed max_batch_tokens", R);
    View in = head_in_.view().row_range(0, R);
    for (int64_t i = 0; i < R; ++i) {
        LATTICE_CHECK(rows[size_t(i)] >= 0 && rows[size_t(i)] < hidden.rows(), "head: row {} of {}", rows[size_t(i)],
                      hidden.rows());
        be_.copy(in.row_range(i, i + 1), hidden.row_range(rows[size_t(i)], rows[size_t(i)] + 1));
    }
    be_.rmsnorm(in, in, final_norm_.view(), float(cfg_.rms_eps));
    LATTICE_CHECK(be_.activation_dtype() == DType::kF32 || be_.device() != Device::kCpu,
                  "head: CPU backend expects f32 activations");
    // logits_ holds tp blocks of R * Vp floats; this rank computes [R, vocab_rows] into its own
    // block, and an in-place all-gather fills the others (no allocation per step); the blocks are
    // then laid side by side in vocabulary order, on the backend.
    const int64_t block = R * Vp;
    float* mine = logits_.ptr<float>() + int64_t(opt_.tp_rank) * block;
    be_.linear(View::contiguous(mine, DType::kF32, {R, shard_.vocab_rows}, be_.device()), in, lm_head_);
    const float cap = float(cfg_.final_softcap);
    if (opt_.tp == 1) {
        const View out = View::contiguous(mine, DType::kF32, {R, V}, be_.device());
        if (cap > 0) be_.softcap(out, cap);
        return out;
    }
    View all = View::contiguous(logits_.data(), DType::kF32, {int64_t(opt_.tp) * block}, be_.device());
    const auto t0 = SteadyClock::now();
    tp_comm_->all_gather(all, View::contiguous(mine, DType::kF32, {block}, be_.device()));
    comm_seconds_ += seconds_since(t0);
    View full = View::contiguous(logits_full_.data(), DType::kF32, {R, V}, be_.device());
    for (int r = 0; r < opt_.tp; ++r) {
        const ShardShape sr = shard_shape(cfg_.dims(), opt_.tp, r);
        be_.copy_columns(full, sr.vocab0,
                         View::contiguous(logits_.ptr<float>() + r * block, DType::kF32, {R, sr.vocab_rows},
                                          be_.device()));
    }
    tp_comm_->wait_idle();
    if (cap > 0) be_.softcap(full, cap);
    return full;
}

void Model::head(const View& hidden, const std::vector<int64_t>& rows, float* logits) {
    const View v = head_logits(hidden, rows);
    if (v.numel() > 0) be_.download(logits, v);
}

void Model::forward(const TokenBatch& batch, const std::vector<int64_t>& logit_rows, float* logits) {
    LATTICE_CHECK(opt_.first_stage && opt_.last_stage, "Model::forward needs a single-stage model");
    const StepScope step(be_, batch);
    View hidden = hidden_scratch(batch.count);
    embed(batch, hidden);
    run_layers(batch, hidden);
    head(hidden, logit_rows, logits);
}

}  // namespace lattice
