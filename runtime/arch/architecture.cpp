// The architecture table (see architecture.h): the families' entries and the name/shape lookups.
#include "runtime/arch/architecture.h"

#include "base/error.h"
#include "runtime/arch/config_json.h"
#include "runtime/arch/families.h"

namespace lattice {

namespace {

using R = TensorRole;
using S = TpSplit;
using G = TensorGate;

std::vector<Architecture> make_table() {
    std::vector<Architecture> t;
    families::add_llama(t);
    families::add_qwen(t);
    families::add_mixtral(t);
    families::add_gemma(t);
    families::add_phi(t);
    return t;
}

bool gated_in(const ModelConfig& c, const TensorSpec& t) {
    switch (t.gate) {
        case G::kAlways:
            return true;
        case G::kUntiedHead:
            return !c.tie_embeddings;
        case G::kQkvBias:
            return architecture_of(c).qkv_bias;
    }
    return false;
}

const TensorSpec& spec_of(const Architecture& a, TensorRole role) {
    for (const TensorSpec& t : a.tensors)
        if (t.role == role) return t;
    LATTICE_FAIL("architecture '{}' has no tensor of role {}", a.name, int(role));
}

std::string layer_prefix(int64_t l) {
    return "model.layers." + std::to_string(l) + ".";
}

// "blk.N." -> N (decimal, no leading zeros, at most 6 digits) and the rest; -1 otherwise.
int64_t split_layer(const std::string& n, const std::string& prefix, std::string* rest) {
    if (n.rfind(prefix, 0) != 0) return -1;
    const size_t b = prefix.size();
    const size_t dot = n.find('.', b);
    if (dot == std::string::npos || dot == b || dot - b > 6) return -1;
    int64_t v = 0;
    for (size_t k = b; k < dot; ++k) {
        if (n[k] < '0' || n[k] > '9') return -1;
        v = v * 10 + (n[k] - '0');
    }
    if (dot - b > 1 && n[b] == '0') return -1;  // one canonical spelling per layer
    *rest = n.substr(dot + 1);
    return v;
}

// Whether `s` is `pattern` with a decimal expert number (no leading zeros, < 2^20) at kExpertMark.
bool match_expert(const std::string& s, const char* pattern, int64_t* expert) {
    const std::string p = pattern;
    const size_t at = p.find(kExpertMark);
    if (at == std::string::npos || s.size() <= p.size() - 1) return false;
    const size_t tail = p.size() - at - 1;
    if (s.compare(0, at, p, 0, at) != 0 || s.compare(s.size() - tail, tail, p, at + 1, tail) != 0) return false;
    const size_t digits = s.size() - tail - at;
    if (digits == 0 || digits > 6 || (digits > 1 && s[at] == '0')) return false;
    int64_t v = 0;
    for (size_t k = at; k < at + digits; ++k) {
        if (s[k] < '0' || s[k] > '9') return false;
        v = v * 10 + (s[k] - '0');
    }
    *expert = v;
    return true;
}

}  // namespace

namespace families {

// The Llama skeleton every dense family shares; HF names after "model.layers.N.", GGUF after "blk.N.".
namespace {
using R = TensorRole;
using S = TpSplit;
using G = TensorGate;

const std::vector<TensorSpec> kDenseTensors = {
    {R::kEmbed, false, "model.embed_tokens.weight", "token_embd.weight", S::kVocabRows, G::kAlways},
    {R::kLmHead, false, "lm_head.weight", "output.weight", S::kVocabRows, G::kUntiedHead},
    {R::kFinalNorm, false, "model.norm.weight", "output_norm.weight", S::kReplicated, G::kAlways},
    {R::kAttnNorm, true, "input_layernorm.weight", "attn_norm.weight", S::kReplicated, G::kAlways},
    {R::kWq, true, "self_attn.q_proj.weight", "attn_q.weight", S::kQHeadRows, G::kAlways},
    {R::kWk, true, "self_attn.k_proj.weight", "attn_k.weight", S::kKvHeadRows, G::kAlways},
    {R::kWv, true, "self_attn.v_proj.weight", "attn_v.weight", S::kKvHeadRows, G::kAlways},
    {R::kBq, true, "self_attn.q_proj.bias", "attn_q.bias", S::kQHeadRows, G::kQkvBias},
    {R::kBk, true, "self_attn.k_proj.bias", "attn_k.bias", S::kKvHeadRows, G::kQkvBias},
    {R::kBv, true, "self_attn.v_proj.bias", "attn_v.bias", S::kKvHeadRows, G::kQkvBias},
    {R::kWo, true, "self_attn.o_proj.weight", "attn_output.weight", S::kQHeadCols, G::kAlways},
    {R::kFfnNorm, true, "post_attention_layernorm.weight", "ffn_norm.weight", S::kReplicated, G::kAlways},
    {R::kWGate, true, "mlp.gate_proj.weight", "ffn_gate.weight", S::kFfnRows, G::kAlways},
    {R::kWUp, true, "mlp.up_proj.weight", "ffn_up.weight", S::kFfnRows, G::kAlways},
    {R::kWDown, true, "mlp.down_proj.weight", "ffn_down.weight", S::kFfnCols, G::kAlways},
};

// A sparse MoE block in place of the MLP (Mixtral's names: w1 gate, w3 up, w2 down; llama.cpp's
// ffn_*_exps hold every expert of a layer in one 3-D tensor, older GGUFs one ffn_*.E tensor each).
const std::vector<TensorSpec> kMoeTensors = {
    {R::kRouter, true, "block_sparse_moe.gate.weight", "ffn_gate_inp.weight", S::kReplicated, G::kAlways},
    {R::kExpGate, true, "block_sparse_moe.experts.*.w1.weight", "ffn_gate.*.weight", S::kFfnRows, G::kAlways, true,
     "ffn_gate_exps.weight"},
    {R::kExpUp, true, "block_sparse_moe.experts.*.w3.weight", "ffn_up.*.weight", S::kFfnRows, G::kAlways, true,
     "ffn_up_exps.weight"},
    {R::kExpDown, true, "block_sparse_moe.experts.*.w2.weight", "ffn_down.*.weight", S::kFfnCols, G::kAlways, true,
     "ffn_down_exps.weight"},
};
}  // namespace

Architecture named(const char* name, const char* model_type, const char* hf_class, const char* gguf_name) {
    Architecture a;
    a.name = name;
    a.hf_model_types = {model_type};
    a.hf_classes = {hf_class};
    a.hf_model_type = model_type;
    a.gguf_name = gguf_name;
    return a;
}

void read_expert_counts(const nlohmann::json& j, const char* count_key, ModelConfig& c) {
    c.n_experts = config_json::get_required<int64_t>(j, count_key, c.source);
    c.n_experts_used = config_json::get_required<int64_t>(j, "num_experts_per_tok", c.source);
}

std::vector<TensorSpec> dense_tensors(bool qkv_bias, bool moe) {
    std::vector<TensorSpec> out;
    for (const TensorSpec& t : kDenseTensors)
        if (t.gate != G::kQkvBias || qkv_bias) out.push_back(t);
    if (!moe) return out;
    out = without_mlp(std::move(out));
    out.insert(out.end(), kMoeTensors.begin(), kMoeTensors.end());
    return out;
}

std::vector<TensorSpec> without_mlp(std::vector<TensorSpec> tensors) {
    std::erase_if(tensors, [](const TensorSpec& t) { return t.role == R::kWGate || t.role == R::kWUp || t.role == R::kWDown; });
    return tensors;
}

std::vector<TensorSpec> qk_norm_tensors() {
    return {{R::kQNorm, true, "self_attn.q_norm.weight", "attn_q_norm.weight", S::kReplicated, G::kAlways},
            {R::kKNorm, true, "self_attn.k_norm.weight", "attn_k_norm.weight", S::kReplicated, G::kAlways}};
}

}  // namespace families

const std::vector<Architecture>& architectures() {
    static const std::vector<Architecture> table = make_table();
    return table;
}

std::string supported_architectures() {
    std::string s;
    for (const Architecture& a : architectures()) s += (s.empty() ? "" : ", ") + a.name;
    return s;
}

const Architecture& find_architecture(const std::string& name) {
    for (const Architecture& a : architectures())
        if (a.name == name) return a;
    LATTICE_FAIL("architecture '{}' is not supported; supported: {}", name, supported_architectures());
}

const Architecture* architecture_for_hf(const std::string& model_type, const std::string& hf_class) {
    for (const Architecture& a : architectures())
        for (const std::string& m : a.hf_model_types)
            if (m == model_type) return &a;
    if (!model_type.empty()) return nullptr;
    for (const Architecture& a : architectures())
        for (const std::string& k : a.hf_classes)
            if (k == hf_class) return &a;
    return nullptr;
}

std::string unsupported_reason(const std::string& model_type, const std::string& hf_class) {
    // Families whose configs parse but whose forward needs blocks lattice does not have.
    static const struct {
        const char* model_type;
        const char* hf_class;
        const char* reason;
    } kRefused[] = {
        {"deepseek_v2", "DeepseekV2ForCausalLM", "DeepSeek's multi-head latent attention (MLA) is not implemented"},
        {"deepseek_v3", "DeepseekV3ForCausalLM", "DeepSeek's multi-head latent attention (MLA) is not implemented"},
        {"gemma3", "Gemma3ForConditionalGeneration",
         "a Gemma 3 checkpoint with its vision tower is not loaded: use a text-only Gemma3ForCausalLM checkpoint "
         "(model_type gemma3_text)"},
    };
    for (const auto& r : kRefused)
        if (model_type == r.model_type || (model_type.empty() && hf_class == r.hf_class)) return r.reason;
    return "";
}

const Architecture* architecture_for_gguf(const std::string& gguf_name, bool moe) {
    for (const Architecture& a : architectures())
        if (!a.gguf_name.empty() && a.gguf_name == gguf_name && a.moe == moe) return &a;
    return nullptr;
}

std::string expert_name(const char* pattern, int64_t expert) {
    std::string s = pattern;
    const size_t at = s.find(kExpertMark);
    if (at != std::string::npos) s.replace(at, 1, std::to_string(expert));
    return s;
}

std::vector<const TensorSpec*> gguf_fused_parts(const Architecture& arch, const std::string& rest) {
    std::vector<const TensorSpec*> parts;
    for (const TensorSpec& t : arch.tensors) {
        const std::string g = t.gguf;
        if (t.per_layer && g.size() > rest.size() && g.compare(0, rest.size(), rest) == 0 && g[rest.size()] == ':')
            parts.push_back(&t);
    }
    return parts;
}

bool is_norm_role(TensorRole role) {
    switch (role) {
        case R::kFinalNorm:
        case R::kAttnNorm:
        case R::kFfnNorm:
        case R::kQNorm:
        case R::kKNorm:
        case R::kPostAttnNorm:
        case R::kPostFfnNorm:
            return true;
        default:
            return false;
    }
}

int64_t GgufMetadata::required_int(const std::string& key) const {
    const std::optional<int64_t> v = int_value(prefix + key);
    LATTICE_CHECK(v.has_value(), "{}: missing metadata key \"{}{}\"", source, prefix, key);
    return *v;
}

const TensorSpec* gguf_merged_spec(const Architecture& arch, const std::string& rest) {
    for (const TensorSpec& t : arch.tensors)
        if (t.per_expert && rest == t.gguf_merged) return &t;
    return nullptr;
}

const Architecture& architecture_of(const ModelConfig& c) {
    return find_architecture(c.family);
}

std::vector<int64_t> tensor_shape(const ModelConfig& c, TensorRole role) {
    switch (role) {
        case R::kEmbed:
        case R::kLmHead:
            return {c.vocab, c.hidden};
        case R::kFinalNorm:
        case R::kAttnNorm:
        case R::kFfnNorm:
        case R::kPostAttnNorm:
        case R::kPostFfnNorm:
            return {c.hidden};
        case R::kQNorm:
        case R::kKNorm:
            return {c.head_dim};
        case R::kWq:
            return {c.q_dim(), c.hidden};
        case R::kWk:
        case R::kWv:
            return {c.kv_dim(), c.hidden};
        case R::kBq:
            return {c.q_dim()};
        case R::kBk:
        case R::kBv:
            return {c.kv_dim()};
        case R::kWo:
            return {c.hidden, c.q_dim()};
        case R::kWGate:
        case R::kWUp:
            return {c.intermediate, c.hidden};
        case R::kWDown:
        case R::kExpDown:
            return {c.hidden, c.intermediate};
        case R::kRouter:
            return {c.n_experts, c.hidden};
        case R::kExpGate:
        case R::kExpUp:
            return {c.intermediate, c.hidden};
    }
    return {};
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c) {
    const Architecture& a = architecture_of(c);
    std::vector<ExpectedTensor> out;
    for (const TensorSpec& t : a.tensors)
        if (!t.per_layer && gated_in(c, t)) out.push_back({t.hf, tensor_shape(c, t.role), t.role, -1, t.split});
    for (int64_t l = 0; l < c.n_layers; ++l)
        for (const TensorSpec& t : a.tensors) {
            if (!t.per_layer || !gated_in(c, t)) continue;
            if (!t.per_expert) {
                out.push_back({layer_prefix(l) + t.hf, tensor_shape(c, t.role), t.role, l, t.split});
                continue;
            }
            for (int64_t e = 0; e < c.n_experts; ++e)
                out.push_back({layer_prefix(l) + expert_name(t.hf, e), tensor_shape(c, t.role), t.role, l, t.split, e});
        }
    return out;
}

std::string tensor_name(const ModelConfig& c, TensorRole role, int64_t layer, int64_t expert) {
    const TensorSpec& t = spec_of(architecture_of(c), role);
    if (!t.per_layer) return t.hf;
    LATTICE_CHECK(layer >= 0, "tensor_name: per-layer tensor \"{}\" needs a layer", t.hf);
    if (!t.per_expert) return layer_prefix(layer) + t.hf;
    LATTICE_CHECK(expert >= 0 && expert < c.n_experts, "tensor_name: per-expert tensor \"{}\": expert {} of {}", t.hf,
                  expert, c.n_experts);
    return layer_prefix(layer) + expert_name(t.hf, expert);
}

int64_t hf_layer_of(const std::string& name) {
    std::string rest;
    return split_layer(name, "model.layers.", &rest);
}

bool hf_tensor_ignorable(const std::string& name) {
    return name.ends_with("rotary_emb.inv_freq");
}

std::string gguf_to_hf_name(const Architecture& arch, const std::string& n) {
    for (const TensorSpec& t : arch.tensors)
        if (!t.per_layer && n == t.gguf) return t.hf;
    std::string rest;
    const int64_t l = split_layer(n, "blk.", &rest);
    if (l < 0) return {};
    for (const TensorSpec& t : arch.tensors) {
        if (!t.per_layer) continue;
        if (!t.per_expert && rest == t.gguf) return layer_prefix(l) + t.hf;
        int64_t e = -1;
        if (t.per_expert && match_expert(rest, t.gguf, &e)) return layer_prefix(l) + expert_name(t.hf, e);
    }
    return {};
}

int64_t gguf_layer_of(const std::string& name, std::string* rest) {
    return split_layer(name, "blk.", rest);
}

bool hf_role_of(const Architecture& arch, const std::string& name, TensorRole* role) {
    std::string rest;
    const bool layered = split_layer(name, "model.layers.", &rest) >= 0;
    for (const TensorSpec& t : arch.tensors) {
        if (t.per_layer != layered) continue;
        int64_t e = -1;
        if (t.per_expert ? layered && match_expert(rest, t.hf, &e) : (layered ? rest : name) == t.hf) {
            *role = t.role;
            return true;
        }
    }
    return false;
}

std::string PreparedNames::embed() {
    return "model.embed_tokens.weight";
}
std::string PreparedNames::lm_head() {
    return "lm_head.weight";
}
std::string PreparedNames::final_norm() {
    return "model.norm.weight";
}
std::string PreparedNames::attn_norm(int64_t l) {
    return layer_prefix(l) + "input_layernorm.weight";
}
std::string PreparedNames::ffn_norm(int64_t l) {
    return layer_prefix(l) + "post_attention_layernorm.weight";
}
std::string PreparedNames::wqkv(int64_t l) {
    return layer_prefix(l) + "self_attn.qkv_proj.weight";
}
std::string PreparedNames::bqkv(int64_t l) {
    return layer_prefix(l) + "self_attn.qkv_proj.bias";
}
std::string PreparedNames::wo(int64_t l) {
    return layer_prefix(l) + "self_attn.o_proj.weight";
}
std::string PreparedNames::w_gate_up(int64_t l) {
    return layer_prefix(l) + "mlp.gate_up_proj.weight";
}
std::string PreparedNames::w_down(int64_t l) {
    return layer_prefix(l) + "mlp.down_proj.weight";
}
std::string PreparedNames::router(int64_t l) {
    return layer_prefix(l) + "block_sparse_moe.gate.weight";
}
std::string PreparedNames::expert_gate_up(int64_t l, int64_t e) {
    return layer_prefix(l) + "block_sparse_moe.experts." + std::to_string(e) + ".gate_up_proj.weight";
}
std::string PreparedNames::expert_down(int64_t l, int64_t e) {
    return layer_prefix(l) + "block_sparse_moe.experts." + std::to_string(e) + ".down_proj.weight";
}

std::string PreparedNames::q_norm(int64_t l) {
    return layer_prefix(l) + "self_attn.q_norm.weight";
}
std::string PreparedNames::k_norm(int64_t l) {
    return layer_prefix(l) + "self_attn.k_norm.weight";
}
std::string PreparedNames::post_attn_norm(int64_t l) {
    return layer_prefix(l) + "sandwich.post_attention_norm.weight";
}
std::string PreparedNames::post_ffn_norm(int64_t l) {
    return layer_prefix(l) + "sandwich.post_feedforward_norm.weight";
}

}  // namespace lattice
