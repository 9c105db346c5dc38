// Phi-3 (transformers' modeling_phi3.py, Phi3ForCausalLM): Llama's blocks (RMSNorm, SwiGLU, pre-norm
// residuals) and a sliding window in every layer, over a checkpoint that fuses q|k|v into
// self_attn.qkv_proj and gate|up into mlp.gate_up_proj. The table names each part "<fused>:<part>"
// (runtime/weights/hf_source.cpp shows the fused tensor as its parts, row ranges in table order), so a
// TP rank reads only its own heads' and channels' rows of each. LongRoPE (rope_scaling longrope / su, the
// 128k models) and a partial rotary factor are refused when the config is parsed.
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
