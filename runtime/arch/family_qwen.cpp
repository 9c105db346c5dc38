// The Qwen families: Qwen2 / Qwen2.5 (q/k/v biases), Qwen3 (QK-norm, no biases) and Qwen3-MoE (Qwen3's
// attention with a sparse mixture of experts: softmax router, top num_experts_per_tok, renormalized when
// norm_topk_prob; no shared expert). Their windows apply only with use_sliding_window, and then to the
// layers i >= max_window_layers (transformers' layer_types; default 28); the released models ship it off.
#include "runtime/arch/config_json.h"
#include "runtime/arch/families.h"

namespace lattice::families {

namespace {

using R = TensorRole;
using S = TpSplit;
using G = TensorGate;

// Qwen3-MoE's expert tensors (transformers' Qwen3MoeSparseMoeBlock: mlp.gate the router, mlp.experts.E.*
// SwiGLU experts of moe_intermediate_size channels); llama.cpp's names for GGUF.
const std::vector<TensorSpec> kQwenMoeTensors = {
    {R::kRouter, true, "mlp.gate.weight", "ffn_gate_inp.weight", S::kReplicated, G::kAlways},
    {R::kExpGate, true, "mlp.experts.*.gate_proj.weight", "ffn_gate.*.weight", S::kFfnRows, G::kAlways, true,
     "ffn_gate_exps.weight"},
    {R::kExpUp, true, "mlp.experts.*.up_proj.weight", "ffn_up.*.weight", S::kFfnRows, G::kAlways, true,
     "ffn_up_exps.weight"},
    {R::kExpDown, true, "mlp.experts.*.down_proj.weight", "ffn_down.*.weight", S::kFfnCols, G::kAlways, true,
     "ffn_down_exps.weight"},
};

// Qwen3-MoE: every layer sparse (decoder_sparse_step 1, no mlp_only_layers: the released models), experts
// of moe_intermediate_size channels.
void read_qwen3_moe(const nlohmann::json& j, ModelConfig& c) {
    using config_json::get_optional;
    using config_json::get_required;
    const std::string& src = c.source;
    read_expert_counts(j, "num_experts", c);
    c.intermediate = get_required<int64_t>(j, "moe_intermediate_size", src);
    c.moe_renormalize = get_optional<bool>(j, "norm_topk_prob", false, src);
    const int64_t step = get_optional<int64_t>(j, "decoder_sparse_step", 1, src);
    LATTICE_CHECK(step == 1, "{}: decoder_sparse_step {} unsupported (every layer sparse: 1)", src, step);
    LATTICE_CHECK(!j.contains("mlp_only_layers") || j["mlp_only_layers"].is_null() ||
                      (j["mlp_only_layers"].is_array() && j["mlp_only_layers"].empty()),
                  "{}: mlp_only_layers {} unsupported (dense layers among sparse ones)", src,
                  j.contains("mlp_only_layers") ? j["mlp_only_layers"].dump().substr(0, 64) : "");
}

// llama.cpp's qwen3moe: the experts' channels in <arch>.expert_feed_forward_length (feed_forward_length holds
// the config's dense intermediate_size), the top-k weights always renormalized (its graph does; the released
// models set norm_topk_prob).
void read_gguf_qwen3_moe(const GgufMetadata& m, ModelConfig& c) {
    c.intermediate = m.required_int("expert_feed_forward_length");
    c.moe_renormalize = true;
}

void write_qwen3_moe(const ModelConfig& c, nlohmann::json& j) {
    j["num_experts"] = c.n_experts;
    j["moe_intermediate_size"] = c.intermediate;
    j["norm_topk_prob"] = c.moe_renormalize;
}

Architecture qwen_base(const char* name, const char* hf_class, const char* gguf_name) {
    Architecture a = named(name, name, hf_class, gguf_name);
    a.sliding_window = true;
    a.sliding_window_honoured = true;
    a.sliding_window_flag = "use_sliding_window";
    a.sliding_window_layers = "max_window_layers";
    a.sliding_window_layers_default = 28;
    a.rope_scaling = {"linear"};
    return a;
}

}  // namespace

void add_qwen(std::vector<Architecture>& t) {
    // Qwen2: q/k/v biases; llama.cpp keeps its q/k rows in HF order (NEOX-style rope).
    Architecture qwen2 = qwen_base("qwen2", "Qwen2ForCausalLM", "qwen2");
    qwen2.qkv_bias = true;
    qwen2.tensors = dense_tensors(true);
    t.push_back(qwen2);

    // Qwen3: no biases; q and k normed per head (RMSNorm over head_dim, one weight for every head) after
    // their projections and before RoPE (transformers' Qwen3Attention q_norm / k_norm).
    // llama.cpp's "qwen3" keeps q/k rows in HF order (NEOX rope) and names the norms attn_{q,k}_norm.
    Architecture qwen3 = qwen_base("qwen3", "Qwen3ForCausalLM", "qwen3");
    qwen3.qk_norm = true;
    qwen3.tensors = dense_tensors(false);
    for (const TensorSpec& s : qk_norm_tensors()) qwen3.tensors.push_back(s);
    t.push_back(qwen3);

    // Qwen3-MoE: Qwen3's attention, experts split over TP as Mixtral's are; llama.cpp's "qwen3moe" with its
    // experts merged per layer (ffn_{gate,up,down}_exps) and q/k rows in HF order.
    Architecture moe = qwen_base("qwen3_moe", "Qwen3MoeForCausalLM", "qwen3moe");
    moe.qk_norm = true;
    moe.moe = true;
    moe.moe_renormalize = false;
    moe.read_config = read_qwen3_moe;
    moe.write_config = write_qwen3_moe;
    moe.read_gguf = read_gguf_qwen3_moe;
    moe.tensors = without_mlp(dense_tensors(false));
    for (const TensorSpec& s : qk_norm_tensors()) moe.tensors.push_back(s);
    moe.tensors.insert(moe.tensors.end(), kQwenMoeTensors.begin(), kQwenMoeTensors.end());
    t.push_back(moe);
}

}  // namespace lattice::families
