// The forward's blocks (model.h): a layer is
//   normed = norm(hidden)                                    [the previous layer's residual_norm]
//   proj = attention_block(normed)   q|k|v = project(normed) (+ bias) -> QK-norm -> RoPE (local base in
//                                    windowed layers) -> attention (window per layer, scale, soft-cap)
//                                    -> project(o) -> all-reduce -> post-norm (sandwich families)
//   hidden += proj; normed = norm(hidden)                    residual_norm (fused add + norm)
//   proj = mlp_block(normed)         project(gate|up) -> act(gate) * up -> project(down), or the MoE block
//                                    -> all-reduce -> post-norm (sandwich families)
//   hidden += proj; normed = next layer's norm(hidden)       residual_norm (the last layer: add only)
// Which options a layer runs is the family's entry (runtime/arch/architecture.h) and its config; the
// Llama-shaped families run exactly the ops they always did (the same calls in the same order), so their
// outputs are bit-identical to the skeleton's. Every projection is project(): the one place a linear runs.
// A LoRA adapter (model_lora.cpp) adds its product right after each of the four projections it may target
// (add_lora: qkv, o, gate/up, down), before any bias, norm or all-reduce.
#include "base/convert.h"
#include "runtime/arch/architecture.h"
#include "runtime/model/model.h"

namespace lattice {

Model::Acts Model::acts(int64_t T) const {
    return {normed_.view().row_range(0, T), qkv_.view().row_range(0, T), attn_out_.view().row_range(0, T),
            proj_.view().row_range(0, T), gate_up_.view().row_range(0, T)};
}

void Model::project(const View& out, const View& in, const Linear& w, const QuantActs* qa) {
    if (qa)
        be_.linear_quant(out, *qa, w);
    else
        be_.linear(out, in, w);
}

void Model::residual_norm(const View& hidden, const View& x, const Buffer& w, const Acts& a) {
    const float eps = float(cfg_.rms_eps);
    if (fused_quant_)
        be_.add_rmsnorm_quant(hidden, x, a.normed, qa_hidden_, w.view(), eps);
    else if (x.data)
        be_.add_rmsnorm(hidden, x, a.normed, w.view(), eps);
    else
        be_.rmsnorm(a.normed, hidden, w.view(), eps);
}

void Model::run_layers(const TokenBatch& batch, const View& hidden) {
    const int64_t T = batch.count;
    LATTICE_CHECK(T >= 1 && T <= opt_.max_batch_tokens && hidden.rows() == T, "run_layers: {} tokens, hidden {}", T,
                  hidden.shape_str());
    LATTICE_CHECK(attn_.num_blocks > 0 || layers_.empty(), "run_layers before allocate_kv");
    for (int64_t i = 0; i < T; ++i)
        LATTICE_CHECK(batch.positions[i] >= 0 && batch.positions[i] < opt_.max_seq && batch.seqs[i] >= 0 &&
                          batch.seqs[i] < batch.num_seqs,
                      "token {} at position {} of sequence {} is outside the context ({} positions) or the batch's "
                      "{} block tables",
                      i, batch.positions[i], batch.seqs[i], opt_.max_seq, batch.num_seqs);
    prepare_lora(batch);
    const Acts a = acts(T);
    for (size_t li = 0; li < layers_.size(); ++li) {
        LayerWeights& L = layers_[li];
        const int64_t layer = opt_.layer_begin + int64_t(li);
        if (li == 0) residual_norm(hidden, View{}, L.attn_norm, a);
        if (observer_) observer_(layer, 0, a.normed);
        attention_block(batch, L, layer, a);
        residual_norm(hidden, a.proj, L.ffn_norm, a);
        if (observer_) observer_(layer, 1, a.normed);
        mlp_block(L, li, a);
        if (li + 1 < layers_.size())
            residual_norm(hidden, a.proj, layers_[li + 1].attn_norm, a);
        else
            be_.add(hidden, hidden, a.proj);
    }
    if (opt_.tp > 1) tp_comm_->wait_idle();  // bounded: a dead peer is an Error here, never a hang
}

void Model::attention_block(const TokenBatch& batch, LayerWeights& L, int64_t layer, const Acts& a) {
    const float eps = float(cfg_.rms_eps);
    const size_t li = size_t(layer - opt_.layer_begin);  // the layer's index in this stage
    project(a.qkv, a.normed, L.wqkv, fused_quant_ ? &qa_hidden_ : nullptr);
    add_lora(a.qkv, a.normed, li, LoraSite::kQkv);
    if (!L.qkv_bias.empty()) be_.add_bias(a.qkv, L.qkv_bias.view());
    if (!L.q_norm.empty()) be_.head_rmsnorm(a.qkv, attn_, L.q_norm.view(), L.k_norm.view(), eps);
    const bool local = cfg_.layer_windowed(layer);
    be_.rope(a.qkv, batch, attn_, (local && !inv_freq_local_.empty() ? inv_freq_local_ : inv_freq_).view());
    AttentionShape shape = attn_;
    if (!local) shape.window = 0;  // a global layer (or one below the windowed layers)
    be_.attention(a.attn, a.qkv, L.k_cache.view(), L.v_cache.view(), batch, shape);
    project(a.proj, a.attn, L.wo);
    add_lora(a.proj, a.attn, li, LoraSite::kO);  // (before the all-reduce: row-parallel, A split by input)
    if (opt_.tp > 1) tp_all_reduce(a.proj);
    if (!L.post_attn_norm.empty()) be_.rmsnorm(a.proj, a.proj, L.post_attn_norm.view(), eps);
}

void Model::mlp_block(LayerWeights& L, size_t li, const Acts& a) {
    if (L.expert_down.empty()) {
        project(a.gu, a.normed, L.w_gate_up, fused_quant_ ? &qa_hidden_ : nullptr);
        add_lora(a.gu, a.normed, li, LoraSite::kGateUp);
        gated_down(a.gu, a.proj, L.w_down);
        add_lora(a.proj, act_.view().row_range(0, a.gu.rows()), li, LoraSite::kDown);
    } else {
        moe_block(L, a.normed, a.proj);
    }
    if (opt_.tp > 1) tp_all_reduce(a.proj);
    if (!L.post_ffn_norm.empty()) be_.rmsnorm(a.proj, a.proj, L.post_ffn_norm.view(), float(cfg_.rms_eps));
}

void Model::gated_down(const View& gu, const View& out, const Linear& down) {
    const View act = act_.view().row_range(0, gu.rows());
    if (fused_quant_) {
        be_.silu_mul_quant(act, qa_ffn_, gu);
        project(out, act, down, &qa_ffn_);
    } else {
        be_.gated_act(act, gu, act_kind_);
        project(out, act, down);
    }
}

void Model::moe_block(LayerWeights& L, const View& normed, const View& out) {
    const int64_t T = normed.rows(), E = cfg_.n_experts;
    const View logits = router_logits_.view().row_range(0, T);
    be_.linear(logits, normed, L.router);
    router_host_.resize(size_t(T * E));
    if (logits.dtype == DType::kF32) {
        be_.download(router_host_.data(), logits);
    } else {
        std::vector<uint8_t> raw(size_t(logits.bytes()));
        be_.download(raw.data(), logits);
        convert_elements(raw.data(), logits.dtype, router_host_.data(), DType::kF32, T * E);
    }
    route_tokens(router_host_.data(), T, E, cfg_.n_experts_used, cfg_.moe_renormalize, &routes_);
    // The layer's routes reach the device in one copy each; every expert reads its slice of them.
    const int64_t slots = T * cfg_.n_experts_used;
    be_.upload(View::contiguous(route_rows_.data(), DType::kI32, {slots}, be_.device()), routes_.tokens.data());
    be_.upload(View::contiguous(route_weights_.data(), DType::kF32, {slots}, be_.device()), routes_.weights.data());
    be_.fill_zero(out);
    for (int64_t e = 0; e < E; ++e) {
        const int64_t n = routes_.count(e);
        if (n == 0) continue;  // an expert no token chose: its weights are not read
        const int64_t b = routes_.begin[size_t(e)];
        const View rows = View::contiguous(route_rows_.ptr<int32_t>() + b, DType::kI32, {n}, be_.device()),
                   weights = View::contiguous(route_weights_.ptr<float>() + b, DType::kF32, {n}, be_.device());
        const View in = moe_in_.view().row_range(0, n), gu = gate_up_.view().row_range(0, n),
                   y = moe_out_.view().row_range(0, n);
        be_.gather_rows(in, normed, rows);
        project(gu, in, L.expert_gate_up[size_t(e)]);
        gated_down(gu, y, L.expert_down[size_t(e)]);
        be_.scatter_add_rows(out, y, rows, weights);
        moe_counters_.expert_runs += 1;
        moe_counters_.expert_rows += n;
    }
}

}  // namespace lattice
