// Phi-3 (transformers' modeling_phi3.py, Phi3ForCausalLM): Llama's blocks (RMSNorm, SwiGLU, pre-norm
// residuals) and a sliding window in every layer, over a checkpoint that fuses q|k|v into
// self_attn.qkv_proj and gate|up into mlp.gate_up_proj. The table names each part "<fused>:<part>"
// (runtime/weights/hf_source.cpp shows the fused tensor as its parts, row ranges in table order), so a
// TP rank reads only its own heads' and channels' rows of each. LongRoPE (rope_scaling longrope / su, the
// 128k models): short / long factors on the frequencies, the long ones when the context exceeds
// original_max_position_embeddings, and its attention factor (config.cpp). A partial rotary factor
// (Phi-3.5, Phi-4-mini) is refused when the config is parsed.
// GGUF (llama.cpp's phi3): the same fusions as attn_qkv and ffn_up (gate rows, then up rows), named
// "<fused>:<part>" here too; LongRoPE as the rope_factors_long / rope_factors_short tensors with
// <arch>.rope.scaling.original_context_length and .attn_factor; the window in <arch>.attention.sliding_window,
// which lattice applies as transformers does (llama.cpp reads it but runs Phi-3 without a window).
#include <cmath>

#include "runtime/arch/config_json.h"
#include "runtime/arch/families.h"

namespace lattice::families {

namespace {

using R = TensorRole;

void read_phi3(const nlohmann::json& j, ModelConfig& c) {
    const double partial = config_json::get_optional<double>(j, "partial_rotary_factor", 1.0, c.source);
    LATTICE_CHECK(partial == 1.0, "{}: partial_rotary_factor {} unsupported (RoPE over the whole head: 1)", c.source,
                  partial);
}

void read_gguf_phi3(const GgufMetadata& m, ModelConfig& c) {
    c.sliding_window = m.int_value(m.prefix + "attention.sliding_window").value_or(0);
    const auto lf = m.f32_vector(kGgufRopeFactorsLong), sf = m.f32_vector(kGgufRopeFactorsShort);
    LATTICE_CHECK(lf.has_value() == sf.has_value(), "{}: LongRoPE needs both {} and {}, the file has only {}", m.source,
                  kGgufRopeFactorsLong, kGgufRopeFactorsShort, lf ? kGgufRopeFactorsLong : kGgufRopeFactorsShort);
    if (!lf) return;
    RopeScaling& r = c.rope_scaling;
    r.type = "longrope";
    r.long_factor.assign(lf->begin(), lf->end());
    r.short_factor.assign(sf->begin(), sf->end());
    r.original_max_position = m.required_int("rope.scaling.original_context_length");
    LATTICE_CHECK(r.original_max_position > 0, "{}: {}rope.scaling.original_context_length {} must be positive",
                  m.source, m.prefix, r.original_max_position);
    r.factor = double(c.max_position) / double(r.original_max_position);
    r.attention_factor = m.float_value(m.prefix + "rope.scaling.attn_factor").value_or(0.0);
    LATTICE_CHECK(std::isfinite(r.attention_factor) && r.attention_factor >= 0,
                  "{}: {}rope.scaling.attn_factor {} must be positive and finite", m.source, m.prefix,
                  r.attention_factor);
}

void write_phi3(const ModelConfig& c, nlohmann::json& j) {
    const RopeScaling& r = c.rope_scaling;
    if (r.type != "longrope") return;
    j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", r.short_factor}, {"long_factor", r.long_factor}};
    if (r.attention_factor > 0) j["rope_scaling"]["attention_factor"] = r.attention_factor;
    j["original_max_position_embeddings"] = r.original_max_position;
}

}  // namespace

void add_phi(std::vector<Architecture>& t) {
    Architecture phi3 = named("phi3", "phi3", "Phi3ForCausalLM", "phi3");
    phi3.sliding_window = true;
    phi3.sliding_window_honoured = true;
    phi3.read_config = read_phi3;
    phi3.write_config = write_phi3;
    phi3.read_gguf = read_gguf_phi3;
    phi3.rope_scaling = {"longrope"};
    phi3.tensors = dense_tensors(false);
    static const struct {
        R role;
        const char* hf;
        const char* gguf;
    } kFused[] = {
        {R::kWq, "self_attn.qkv_proj.weight:q", "attn_qkv.weight:q"},
        {R::kWk, "self_attn.qkv_proj.weight:k", "attn_qkv.weight:k"},
        {R::kWv, "self_attn.qkv_proj.weight:v", "attn_qkv.weight:v"},
        {R::kWGate, "mlp.gate_up_proj.weight:gate", "ffn_up.weight:gate"},
        {R::kWUp, "mlp.gate_up_proj.weight:up", "ffn_up.weight:up"},
    };
    for (TensorSpec& s : phi3.tensors)
        for (const auto& f : kFused)
            if (s.role == f.role) s.hf = f.hf, s.gguf = f.gguf;
    t.push_back(phi3);
}

}  // namespace lattice::families
