// Phi-3 (transformers' modeling_phi3.py, Phi3ForCausalLM): Llama's blocks (RMSNorm, SwiGLU, pre-norm
// residuals) and a sliding window in every layer, over a checkpoint that fuses q|k|v into
// self_attn.qkv_proj and gate|up into mlp.gate_up_proj. The table names each part "<fused>:<part>"
// (runtime/weights/hf_source.cpp shows the fused tensor as its parts, row ranges in table order), so a
// TP rank reads only its own heads' and channels' rows of each. LongRoPE (rope_scaling longrope / su, the
// 128k models): short / long factors on the frequencies, the long ones when the context exceeds
// original_max_position_embeddings, and its attention factor (config.cpp). A partial rotary factor
// (Phi-3.5, Phi-4-mini) is refused when the config is parsed.
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

void write_phi3(const ModelConfig& c, nlohmann::json& j) {
    const RopeScaling& r = c.rope_scaling;
    if (r.type != "longrope") return;
    j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", r.short_factor}, {"long_factor", r.long_factor}};
    if (r.attention_factor > 0) j["rope_scaling"]["attention_factor"] = r.attention_factor;
    j["original_max_position_embeddings"] = r.original_max_position;
}

}  // namespace

void add_phi(std::vector<Architecture>& t) {
    Architecture phi3;
    phi3.name = "phi3";
    phi3.hf_model_types = {"phi3"};
    phi3.hf_classes = {"Phi3ForCausalLM"};
    phi3.hf_model_type = "phi3";
    phi3.sliding_window = true;
    phi3.sliding_window_honoured = true;
    phi3.read_config = read_phi3;
    phi3.write_config = write_phi3;
    phi3.rope_scaling = {"longrope"};
    phi3.tensors = dense_tensors(false);
    for (TensorSpec& s : phi3.tensors) {
        if (s.role == R::kWq) s.hf = "self_attn.qkv_proj.weight:q";
        if (s.role == R::kWk) s.hf = "self_attn.qkv_proj.weight:k";
        if (s.role == R::kWv) s.hf = "self_attn.qkv_proj.weight:v";
        if (s.role == R::kWGate) s.hf = "mlp.gate_up_proj.weight:gate";
        if (s.role == R::kWUp) s.hf = "mlp.gate_up_proj.weight:up";
    }
    t.push_back(phi3);
}

}  // namespace lattice::families
