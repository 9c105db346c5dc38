// The Gemma families (text): Gemma 2 and Gemma 3. Their forward differs from Llama's in its blocks, not in
// its tensors' splits: RMSNorm weights applied as (1 + w), embeddings times sqrt(hidden), GeGLU (tanh
// GELU) MLP, sandwich norms (each block's output normed before the residual add: post_attention_layernorm,
// post_feedforward_layernorm; the MLP's input norm is pre_feedforward_layernorm), attention scaled by
// query_pre_attn_scalar^-0.5 and interleaved local (sliding window) / global layers; tied embeddings.
//   Gemma 2 (transformers' modeling_gemma2.py): every other layer local (layer l global when (l + 1) % 2
//   == 0), attention scores soft-capped (attn_logit_softcapping, 50) and final logits too
//   (final_logit_softcapping, 30).
//   Gemma 3 text (modeling_gemma3.py, Gemma3ForCausalLM, model_type gemma3_text): 5 local layers per
//   global one (sliding_window_pattern 6), QK-norm (a (1 + w) RMSNorm per q and k head), local layers
//   with their own unscaled rope base (rope_local_base_freq); no soft-caps unless the config sets them.
// A Gemma 3 checkpoint with its vision tower (Gemma3ForConditionalGeneration, model_type gemma3) is
// refused by name (architecture.cpp unsupported_reason).
// GGUF (llama.cpp's gemma2 / gemma3): every norm weight stored as 1 + w (gguf_norm_shift), no output.weight
// (tied), the window in <arch>.attention.sliding_window and Gemma 2's soft-caps in <arch>.attn_logit_softcapping
// / final_logit_softcapping; llama.cpp fixes the rest by architecture (pattern 2 / 6, Gemma 3's local rope base
// 10000, unscaled) and by size (the attention scale, read_gguf_common).
#include "runtime/arch/config_json.h"
#include "runtime/arch/families.h"

namespace lattice::families {

namespace {

using R = TensorRole;
using S = TpSplit;
using G = TensorGate;

// A soft-cap key: absent gives transformers' default, null none (0).
double softcap_of(const nlohmann::json& j, const char* key, double fallback, const std::string& src) {
    if (!j.contains(key)) return fallback;
    return j[key].is_null() ? 0.0 : config_json::get_value<double>(j, key, src);
}

void check_common(const ModelConfig& c) {
    LATTICE_CHECK(c.query_pre_attn_scalar > 0 && c.attn_softcap >= 0 && c.final_softcap >= 0,
                  "{}: query_pre_attn_scalar {} must be > 0, soft-caps {} and {} >= 0", c.source,
                  c.query_pre_attn_scalar, c.attn_softcap, c.final_softcap);
}

void read_common(const nlohmann::json& j, ModelConfig& c, double attn_cap, double final_cap) {
    const std::string& src = c.source;
    c.query_pre_attn_scalar = config_json::get_optional<double>(j, "query_pre_attn_scalar", 256.0, src);
    c.attn_softcap = softcap_of(j, "attn_logit_softcapping", attn_cap, src);
    c.final_softcap = softcap_of(j, "final_logit_softcapping", final_cap, src);
    check_common(c);
}

void read_gemma2(const nlohmann::json& j, ModelConfig& c) {
    read_common(j, c, 50.0, 30.0);
    c.window_pattern = 2;
}

void read_gemma3(const nlohmann::json& j, ModelConfig& c) {
    read_common(j, c, 0.0, 0.0);
    c.window_pattern = config_json::get_optional<int64_t>(j, "sliding_window_pattern", 6, c.source);
    LATTICE_CHECK(c.window_pattern >= 1, "{}: sliding_window_pattern {} must be >= 1", c.source, c.window_pattern);
    c.rope_local_theta = config_json::get_optional<double>(j, "rope_local_base_freq", 10000.0, c.source);
}

// What llama.cpp reads for both: the window (absent or 0: none) and the final soft-cap (absent: `final_cap`). A
// GGUF has no query_pre_attn_scalar: llama.cpp scales by head_dim^-0.5, or by (hidden / heads)^-0.5 for the 27B
// models, which it knows by their layer count (gemma_pytorch's configs; their query_pre_attn_scalar is that).
void read_gguf_common(const GgufMetadata& m, ModelConfig& c, int64_t layers_27b, double final_cap) {
    c.sliding_window = m.int_value(m.prefix + "attention.sliding_window").value_or(0);
    c.final_softcap = m.float_value(m.prefix + "final_logit_softcapping").value_or(final_cap);
    c.query_pre_attn_scalar = double(c.n_layers == layers_27b ? c.hidden / c.n_heads : c.head_dim);
}

void read_gguf_gemma2(const GgufMetadata& m, ModelConfig& c) {
    read_gguf_common(m, c, 46, 30.0);
    c.attn_softcap = m.float_value(m.prefix + "attn_logit_softcapping").value_or(50.0);
    c.window_pattern = 2;
    check_common(c);
}

// Gemma 3: no attention soft-cap (llama.cpp's gemma3 graph has none).
void read_gguf_gemma3(const GgufMetadata& m, ModelConfig& c) {
    read_gguf_common(m, c, 62, 0.0);
    c.window_pattern = 6;
    c.rope_local_theta = 10000.0;
    check_common(c);
}

void write_gemma(const ModelConfig& c, nlohmann::json& j) {
    j["hidden_activation"] = "gelu_pytorch_tanh";
    j["hidden_act"] = "gelu_pytorch_tanh";
    j["query_pre_attn_scalar"] = c.query_pre_attn_scalar;
    j["attn_logit_softcapping"] = c.attn_softcap > 0 ? nlohmann::json(c.attn_softcap) : nlohmann::json(nullptr);
    j["final_logit_softcapping"] = c.final_softcap > 0 ? nlohmann::json(c.final_softcap) : nlohmann::json(nullptr);
    if (c.rope_local_theta > 0) j["rope_local_base_freq"] = c.rope_local_theta;
    if (c.window_pattern > 0) j["sliding_window_pattern"] = c.window_pattern;
    j.erase("use_sliding_window");
    j.erase("max_window_layers");
}

// Llama's tensors with Gemma's norm names (the MLP's input norm is pre_feedforward_layernorm;
// post_attention_layernorm is the attention output's norm), plus the sandwich norms.
std::vector<TensorSpec> gemma_tensors(bool qk_norm) {
    std::vector<TensorSpec> t = dense_tensors(false);
    for (TensorSpec& s : t)
        if (s.role == R::kFfnNorm) s.hf = "pre_feedforward_layernorm.weight";
    t.push_back({R::kPostAttnNorm, true, "post_attention_layernorm.weight", "post_attention_norm.weight",
                 S::kReplicated, G::kAlways});
    t.push_back({R::kPostFfnNorm, true, "post_feedforward_layernorm.weight", "post_ffw_norm.weight", S::kReplicated,
                 G::kAlways});
    if (qk_norm)
        for (const TensorSpec& s : qk_norm_tensors()) t.push_back(s);
    return t;
}

Architecture gemma_base(const char* name, const char* model_type, const char* hf_class) {
    Architecture a = named(name, model_type, hf_class, name);
    a.gguf_norm_shift = 1.0f;
    a.sliding_window = true;
    a.sliding_window_honoured = true;
    a.norm_one_plus = true;
    a.sandwich_norms = true;
    a.embed_scale = true;
    a.hidden_act = HiddenAct::kGeluTanh;
    a.write_config = write_gemma;
    return a;
}

}  // namespace

void add_gemma(std::vector<Architecture>& t) {
    Architecture gemma2 = gemma_base("gemma2", "gemma2", "Gemma2ForCausalLM");
    gemma2.read_config = read_gemma2;
    gemma2.read_gguf = read_gguf_gemma2;
    gemma2.tensors = gemma_tensors(false);
    t.push_back(gemma2);

    Architecture gemma3 = gemma_base("gemma3", "gemma3_text", "Gemma3ForCausalLM");
    gemma3.qk_norm = true;
    gemma3.rope_scaling = {"linear"};  // the global layers' (transformers' rotary_emb); local ones unscaled
    gemma3.read_config = read_gemma3;
    gemma3.read_gguf = read_gguf_gemma3;
    gemma3.tensors = gemma_tensors(true);
    t.push_back(gemma3);
}

}  // namespace lattice::families
