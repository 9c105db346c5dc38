// ModelConfig parsing (HF config.json), validation, rope frequencies and built-in presets.
#include "runtime/arch/config.h"

#include "runtime/arch/architecture.h"
#include "runtime/arch/config_json.h"

#include "base/error.h"
#include "base/file.h"
#include "base/json_limits.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace lattice {

namespace {
constexpr int64_t kMaxConfigBytes = 1 << 20;

// Phi-3's LongRoPE: short / long factor lists, original_max_position_embeddings (top level, else in
// rope_scaling, else max_position_embeddings) and an optional attention_factor.
void read_longrope(const nlohmann::json& j, const nlohmann::json& rs, ModelConfig& c) {
    const std::string& src = c.source;
    RopeScaling& r = c.rope_scaling;
    r.type = "longrope";
    for (const char* key : {"short_factor", "long_factor"}) {
        LATTICE_CHECK(rs.contains(key) && rs[key].is_array() && rs[key].size() <= 4096,
                      "{}: rope_scaling {} must be a list of numbers", src, key);
        auto& out = std::string(key) == "short_factor" ? r.short_factor : r.long_factor;
        for (const auto& v : rs[key]) {
            LATTICE_CHECK(v.is_number(), "{}: rope_scaling {} must be a list of numbers", src, key);
            out.push_back(v.get<double>());
        }
    }
    const int64_t max_pos = config_json::get_optional<int64_t>(j, "max_position_embeddings", 2048, src);
    r.original_max_position = config_json::get_optional<int64_t>(
        j, "original_max_position_embeddings",
        config_json::get_optional<int64_t>(rs, "original_max_position_embeddings", max_pos, src), src);
    r.factor = r.original_max_position > 0 ? double(max_pos) / double(r.original_max_position) : 1.0;
    r.attention_factor = config_json::get_optional<double>(rs, "attention_factor", 0.0, src);
}

// The per-layer norm weights beyond Llama's two: QK-norm's two [head_dim], the sandwich norms' two [hidden].
int64_t extra_norm_params(const Architecture& a, int64_t hidden, int64_t head_dim) {
    return (a.qk_norm ? 2 * head_dim : 0) + (a.sandwich_norms ? 2 * hidden : 0);
}

// Newer transformers configs spell the layers' attention out (layer_types): it must be the pattern the
// window fields give (ModelConfig::layer_windowed), which is all lattice runs.
void check_layer_types(const nlohmann::json& j, const ModelConfig& c) {
    if (!j.contains("layer_types") || j["layer_types"].is_null()) return;
    const auto& lt = j["layer_types"];
    const std::string& src = c.source;
    LATTICE_CHECK(lt.is_array() && int64_t(lt.size()) == c.n_layers, "{}: layer_types must list {} layers", src,
                  c.n_layers);
    for (int64_t i = 0; i < c.n_layers; ++i) {
        const char* want = c.layer_windowed(i) ? "sliding_attention" : "full_attention";
        LATTICE_CHECK(lt[size_t(i)].is_string() && lt[size_t(i)].get<std::string>() == want,
                      "{}: layer_types[{}] is {} but sliding_window {} from layer {} gives \"{}\" (other "
                      "per-layer attention patterns are not supported)",
                      src, i, lt[size_t(i)].dump(), c.sliding_window,
                      c.window_pattern > 0 ? "(pattern)" : std::to_string(c.window_layer_begin), want);
    }
}
}  // namespace

using config_json::get_optional;
using config_json::get_required;

ModelConfig parse_hf_config(const std::string& text, const std::string& src) {
    LATTICE_CHECK(int64_t(text.size()) <= kMaxConfigBytes, "{}: config of {} bytes exceeds the {} byte limit", src,
                  text.size(), kMaxConfigBytes);
    JsonLimits lim;
    lim.max_depth = 16;
    check_json_limits(text, src, lim);
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        LATTICE_FAIL("{}: not valid JSON ({})", src, e.what());
    }
    LATTICE_CHECK(j.is_object(), "{}: expected a JSON object", src);
    ModelConfig c;
    c.source = src;
    if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
        j["architectures"][0].is_string())
        c.architecture = j["architectures"][0].get<std::string>();
    const bool has_class = j.contains("architectures");
    std::string model_type = get_optional<std::string>(j, "model_type", "", src);
    const std::string why = unsupported_reason(model_type, c.architecture);
    LATTICE_CHECK(why.empty(), "{}: architecture '{}' is not supported: {}", src,
                  model_type.empty() ? c.architecture : model_type, why);
    const Architecture* arch = architecture_for_hf(model_type, c.architecture);
    if (!arch && model_type.empty() && !has_class) arch = &find_architecture("llama");  // bare Llama configs
    LATTICE_CHECK(arch != nullptr, "{}: architecture '{}' is not supported; supported: {}", src,
                  model_type.empty() ? c.architecture : model_type, supported_architectures());
    c.family = arch->name;
    if (arch->sliding_window) {
        // Qwen2 names the window but applies it only with use_sliding_window; Mistral always.
        const bool used = arch->sliding_window_flag.empty() ||
                          get_optional<bool>(j, arch->sliding_window_flag.c_str(), false, src);
        if (used) c.sliding_window = get_optional<int64_t>(j, "sliding_window", 0, src);
        if (used && !arch->sliding_window_layers.empty())
            c.window_layer_begin = get_optional<int64_t>(j, arch->sliding_window_layers.c_str(),
                                                         arch->sliding_window_layers_default, src);
    }
    // Gemma names its activation hidden_activation (hidden_act beside it may be stale).
    const char* act_key = j.contains("hidden_activation") && !j["hidden_activation"].is_null() ? "hidden_activation"
                                                                                                : "hidden_act";
    const std::string act = get_optional<std::string>(j, act_key, "silu", src);
    const char* want = arch->hidden_act == HiddenAct::kSilu ? "silu" : "gelu_pytorch_tanh";
    LATTICE_CHECK(act == want, "{}: {} \"{}\" unsupported for architecture '{}' (only {})", src, act_key, act,
                  arch->name, want);
    c.hidden_act = arch->hidden_act;
    c.moe_renormalize = arch->moe_renormalize;
    LATTICE_CHECK(!get_optional<bool>(j, "attention_bias", false, src), "{}: attention_bias=true unsupported", src);
    LATTICE_CHECK(!get_optional<bool>(j, "mlp_bias", false, src), "{}: mlp_bias=true unsupported", src);

    c.hidden = get_required<int64_t>(j, "hidden_size", src);
    c.intermediate = get_required<int64_t>(j, "intermediate_size", src);
    c.n_layers = get_required<int64_t>(j, "num_hidden_layers", src);
    c.n_heads = get_required<int64_t>(j, "num_attention_heads", src);
    c.n_kv_heads = get_optional<int64_t>(j, "num_key_value_heads", c.n_heads, src);
    c.vocab = get_required<int64_t>(j, "vocab_size", src);
    if (arch->read_config) arch->read_config(j, c);
    check_layer_types(j, c);
    LATTICE_CHECK(c.n_heads > 0, "{}: num_attention_heads must be positive, got {}", src, c.n_heads);
    if (!j.contains("head_dim") || j["head_dim"].is_null())
        LATTICE_CHECK(c.hidden % c.n_heads == 0, "{}: num_attention_heads {} does not divide hidden_size {}", src,
                      c.n_heads, c.hidden);
    c.head_dim = get_optional<int64_t>(j, "head_dim", c.hidden / c.n_heads, src);
    c.max_position = get_optional<int64_t>(j, "max_position_embeddings", 2048, src);
    c.rms_eps = get_optional<double>(j, "rms_norm_eps", 1e-5, src);
    c.rope_theta = get_optional<double>(j, "rope_theta", 10000.0, src);
    c.tie_embeddings = get_optional<bool>(j, "tie_word_embeddings", false, src);
    c.bos_id = get_optional<int64_t>(j, "bos_token_id", 1, src);
    if (j.contains("eos_token_id") && j["eos_token_id"].is_array()) {
        c.eos_ids.clear();
        LATTICE_CHECK(j["eos_token_id"].size() <= 64, "{}: eos_token_id lists {} ids, more than 64", src,
                      j["eos_token_id"].size());
        for (auto& e : j["eos_token_id"]) {
            LATTICE_CHECK(e.is_number_integer(), "{}: eos_token_id entries must be integers", src);
            c.eos_ids.push_back(e.get<int64_t>());
        }
    } else {
        c.eos_ids = {get_optional<int64_t>(j, "eos_token_id", 2, src)};
    }
    if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
        const auto& rs = j["rope_scaling"];
        LATTICE_CHECK(rs.is_object(), "{}: rope_scaling must be an object or null", src);
        std::string type = rs.contains("rope_type") ? get_optional<std::string>(rs, "rope_type", "", src)
                                                    : get_optional<std::string>(rs, "type", "", src);
        if (type == "default" || type.empty()) {
            c.rope_scaling.type = "";
        } else if (type == "llama3") {
            c.rope_scaling.type = "llama3";
            c.rope_scaling.factor = get_required<double>(rs, "factor", src + " rope_scaling");
            c.rope_scaling.low_freq_factor = get_optional<double>(rs, "low_freq_factor", 1.0, src);
            c.rope_scaling.high_freq_factor = get_optional<double>(rs, "high_freq_factor", 4.0, src);
            c.rope_scaling.original_max_position =
                get_required<int64_t>(rs, "original_max_position_embeddings", src + " rope_scaling");
        } else if (type == "linear") {
            c.rope_scaling.type = "linear";
            c.rope_scaling.factor = get_required<double>(rs, "factor", src + " rope_scaling");
        } else if (type == "longrope" || type == "su") {
            read_longrope(j, rs, c);
        } else {
            LATTICE_FAIL("{}: rope_scaling type \"{}\" unsupported (llama3, linear, longrope)", src, type);
        }
        bool allowed = c.rope_scaling.type.empty();
        for (const std::string& k : arch->rope_scaling) allowed = allowed || k == c.rope_scaling.type;
        LATTICE_CHECK(allowed, "{}: rope_scaling type \"{}\" is not supported for architecture '{}'", src, type,
                      arch->name);
    }
    c.validate();
    return c;
}

ModelConfig load_hf_config(const std::string& path) {
    return parse_hf_config(read_regular_file(path, kMaxConfigBytes, "config file"), path);
}

void ModelConfig::validate() const {
    const std::string& s = source;
    const Architecture& arch = find_architecture(family);
    LATTICE_CHECK(sliding_window >= 0, "{}: sliding_window {} must be >= 0", s, sliding_window);
    LATTICE_CHECK(window_layer_begin >= 0 && window_layer_begin < (int64_t(1) << 31),
                  "{}: the window's first layer (max_window_layers) {} must be >= 0", s, window_layer_begin);
    LATTICE_CHECK(sliding_window == 0 || arch.sliding_window, "{}: architecture '{}' has no sliding window", s,
                  family);
    LATTICE_CHECK(sliding_window == 0 || sliding_window >= max_position || arch.sliding_window_honoured,
                  "{}: architecture '{}' with sliding_window {} < max_position_embeddings {} is not supported "
                  "(lattice does not apply this family's window; it would be ignored and answers past it wrong)",
                  s, family, sliding_window, max_position);
    LATTICE_CHECK(arch.moe == (n_experts > 0),
                  "{}: architecture '{}' {} experts, but the config gives num_local_experts {}", s, family,
                  arch.moe ? "routes tokens to" : "has no", n_experts);
    if (arch.moe)
        LATTICE_CHECK(n_experts <= kMaxExperts && n_experts_used >= 1 && n_experts_used <= n_experts,
                      "{}: num_local_experts {} must be in [1, {}] and num_experts_per_tok {} in [1, "
                      "num_local_experts]",
                      s, n_experts, kMaxExperts, n_experts_used);
    auto positive = [&](int64_t v, const char* name) {
        LATTICE_CHECK(v > 0 && v < (int64_t(1) << 31), "{}: {} must be in [1, 2^31), got {}", s, name, v);
    };
    positive(hidden, "hidden_size");
    positive(intermediate, "intermediate_size");
    positive(n_layers, "num_hidden_layers");
    positive(n_heads, "num_attention_heads");
    positive(n_kv_heads, "num_key_value_heads");
    positive(head_dim, "head_dim");
    positive(vocab, "vocab_size");
    positive(max_position, "max_position_embeddings");
    LATTICE_CHECK(n_layers <= 1024, "{}: num_hidden_layers {} is implausible", s, n_layers);
    LATTICE_CHECK(n_heads % n_kv_heads == 0, "{}: num_key_value_heads {} does not divide num_attention_heads {}", s,
                  n_kv_heads, n_heads);
    LATTICE_CHECK(head_dim % 2 == 0, "{}: head_dim {} must be even for RoPE", s, head_dim);
    LATTICE_CHECK(rms_eps > 0 && rms_eps < 1, "{}: rms_norm_eps {} out of range (0, 1)", s, rms_eps);
    LATTICE_CHECK(std::isfinite(rope_theta) && rope_theta > 0, "{}: rope_theta {} must be positive and finite", s,
                  rope_theta);
    if (!rope_scaling.type.empty())
        LATTICE_CHECK(std::isfinite(rope_scaling.factor) && rope_scaling.factor > 0,
                      "{}: rope_scaling factor {} must be positive and finite ({} scaling)", s, rope_scaling.factor,
                      rope_scaling.type);
    if (rope_scaling.type == "llama3") {
        LATTICE_CHECK(
            std::isfinite(rope_scaling.low_freq_factor) && std::isfinite(rope_scaling.high_freq_factor) &&
                rope_scaling.low_freq_factor > 0 && rope_scaling.high_freq_factor > rope_scaling.low_freq_factor &&
                rope_scaling.original_max_position > 0,
            "{}: llama3 rope_scaling parameters inconsistent (need 0 < low_freq_factor {} < "
            "high_freq_factor {}, original_max_position_embeddings {} > 0)",
            s, rope_scaling.low_freq_factor, rope_scaling.high_freq_factor, rope_scaling.original_max_position);
    }
    // Shapes multiply: bound the total so every count below (parameter_count, buffer sizes) fits in
    // int64 with room to spare. 10^15 parameters is ~500x the largest models published.
    const double params = parameter_count_estimate();
    LATTICE_CHECK(params <= 1e15,
                  "{}: the config describes {:.3g} parameters (hidden_size {}, intermediate_size {}, "
                  "num_hidden_layers {}, vocab_size {}), more than the 1e15 this loader accepts",
                  s, params, hidden, intermediate, n_layers, vocab);
    for (int64_t e : eos_ids) LATTICE_CHECK(e >= 0 && e < vocab, "{}: eos_token_id {} outside vocab {}", s, e, vocab);
    LATTICE_CHECK(window_pattern >= 0 && std::isfinite(rope_local_theta) && rope_local_theta >= 0 &&
                      std::isfinite(query_pre_attn_scalar) && query_pre_attn_scalar >= 0 &&
                      std::isfinite(attn_softcap) && attn_softcap >= 0 && std::isfinite(final_softcap) &&
                      final_softcap >= 0,
                  "{}: window pattern {}, local rope base {}, query_pre_attn_scalar {}, soft-caps {} / {} must be "
                  "finite and >= 0",
                  s, window_pattern, rope_local_theta, query_pre_attn_scalar, attn_softcap, final_softcap);
    if (rope_scaling.type == "longrope")
        LATTICE_CHECK(int64_t(rope_scaling.short_factor.size()) == head_dim / 2 &&
                          int64_t(rope_scaling.long_factor.size()) == head_dim / 2 &&
                          rope_scaling.original_max_position > 0 && std::isfinite(rope_scaling.attention_factor) &&
                          rope_scaling.attention_factor >= 0,
                      "{}: longrope needs {} short and long factors (head_dim / 2), got {} and {}, and "
                      "original_max_position_embeddings {} > 0",
                      s, head_dim / 2, rope_scaling.short_factor.size(), rope_scaling.long_factor.size(),
                      rope_scaling.original_max_position);
    for (const auto* list : {&rope_scaling.short_factor, &rope_scaling.long_factor})
        for (double f : *list)
            LATTICE_CHECK(std::isfinite(f) && f > 0, "{}: longrope factor {} must be positive and finite", s, f);
    LATTICE_CHECK(hidden_act == arch.hidden_act, "{}: architecture '{}' runs one activation, not this config's", s,
                  family);
}

double ModelConfig::parameter_count_estimate() const {
    const double h = double(hidden), q = double(n_heads) * double(head_dim), kv = double(n_kv_heads) * double(head_dim);
    const double bias = find_architecture(family).qkv_bias ? q + 2 * kv : 0.0;
    // A MoE layer: every expert's FFN plus the router [experts, hidden].
    const double experts = double(std::max<int64_t>(n_experts, 1)), router = n_experts > 0 ? double(n_experts) * h : 0;
    const double norms = double(extra_norm_params(find_architecture(family), hidden, head_dim));
    const double per_layer =
        h * (q + 2 * kv) + q * h + experts * 3 * h * double(intermediate) + router + 2 * h + bias + norms;
    const double emb = double(vocab) * h;
    return double(n_layers) * per_layer + emb + (tie_embeddings ? 0 : emb) + h;
}

int64_t ModelConfig::parameter_count() const {
    const int64_t bias = find_architecture(family).qkv_bias ? q_dim() + 2 * kv_dim() : 0;
    const int64_t experts = std::max<int64_t>(n_experts, 1), router = n_experts * hidden;
    int64_t per_layer = hidden * (q_dim() + 2 * kv_dim()) + q_dim() * hidden + experts * 3 * hidden * intermediate +
                        router + 2 * hidden + bias + extra_norm_params(find_architecture(family), hidden, head_dim);
    int64_t emb = vocab * hidden;
    return n_layers * per_layer + emb + (tie_embeddings ? 0 : emb) + hidden;
}

int64_t ModelConfig::active_parameter_count() const {
    return parameter_count() - n_layers * (n_experts - n_experts_used) * 3 * hidden * intermediate;
}

bool ModelConfig::is_eos(int64_t id) const {
    for (int64_t e : eos_ids)
        if (e == id) return true;
    return false;
}

double ModelConfig::attention_scale() const {
    return 1.0 / std::sqrt(query_pre_attn_scalar > 0 ? query_pre_attn_scalar : double(head_dim));
}

double ModelConfig::rope_attention_factor() const {
    const RopeScaling& r = rope_scaling;
    if (r.type != "longrope") return 1.0;
    if (r.attention_factor > 0) return r.attention_factor;
    return r.factor <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(r.factor) / std::log(double(r.original_max_position)));
}

std::vector<float> ModelConfig::rope_inv_freq(bool local, int64_t context) const {
    const int64_t half = head_dim / 2;
    std::vector<float> inv(static_cast<size_t>(half));
    local = local && rope_local_theta > 0;
    const bool longrope = !local && rope_scaling.type == "longrope";
    const std::vector<double>& ext =
        context > rope_scaling.original_max_position ? rope_scaling.long_factor : rope_scaling.short_factor;
    for (int64_t i = 0; i < half; ++i) {
        double f = 1.0 / std::pow(local ? rope_local_theta : rope_theta, double(2 * i) / double(head_dim));
        if (local) {
            // the local layers' rope: unscaled (transformers' Gemma 3 rotary_emb_local)
        } else if (longrope) {
            f = 1.0 / (ext[size_t(i)] * std::pow(rope_theta, double(2 * i) / double(head_dim)));
        } else if (rope_scaling.type == "llama3") {
            // transformers' _compute_llama3_parameters
            const double low_wavelen = double(rope_scaling.original_max_position) / rope_scaling.low_freq_factor;
            const double high_wavelen = double(rope_scaling.original_max_position) / rope_scaling.high_freq_factor;
            const double wavelen = 2.0 * M_PI / f;
            if (wavelen > low_wavelen) {
                f = f / rope_scaling.factor;
            } else if (wavelen >= high_wavelen) {
                double smooth = (double(rope_scaling.original_max_position) / wavelen - rope_scaling.low_freq_factor) /
                                (rope_scaling.high_freq_factor - rope_scaling.low_freq_factor);
                f = (1.0 - smooth) * f / rope_scaling.factor + smooth * f;
            }
        } else if (rope_scaling.type == "linear") {
            f = f / rope_scaling.factor;
        }
        inv[size_t(i)] = float(f);
    }
    return inv;
}

namespace {
ModelConfig make_preset(const char* name, int64_t hidden, int64_t ffn, int64_t layers, int64_t heads, int64_t kv,
                        int64_t vocab, double theta, int64_t max_pos, bool llama3) {
    ModelConfig c;
    c.source = std::string("preset ") + name;
    c.hidden = hidden;
    c.intermediate = ffn;
    c.n_layers = layers;
    c.n_heads = heads;
    c.n_kv_heads = kv;
    c.head_dim = hidden / heads;
    c.vocab = vocab;
    c.rope_theta = theta;
    c.max_position = max_pos;
    if (llama3) {
        c.rope_scaling = RopeScaling{"llama3", 8.0, 1.0, 4.0, 8192};
        c.bos_id = 128000;
        c.eos_ids = {128001, 128009};
    }
    return c;
}

// Mixtral's shape (mistralai/Mixtral-8x7B-v0.1 config.json: no window) with `experts` top `used`.
ModelConfig make_mixtral(const char* name, int64_t hidden, int64_t ffn, int64_t layers, int64_t heads, int64_t kv,
                         int64_t experts, int64_t used, int64_t max_pos) {
    ModelConfig c = make_preset(name, hidden, ffn, layers, heads, kv, 32000, 1e6, max_pos, false);
    c.family = "mixtral";
    c.architecture = "MixtralForCausalLM";
    c.n_experts = experts;
    c.n_experts_used = used;
    return c;
}
}  // namespace

std::vector<std::string> preset_names() {
    return {"tinyllama-1.1b", "llama-2-7b",   "llama-2-13b",  "llama-2-70b",
            "llama-3-8b",     "llama-3-70b", "mixtral-8x7b", "mixtral-tiny-8x1.1b"};
}

ModelConfig preset_config(const std::string& name) {
    if (name == "tinyllama-1.1b") return make_preset("tinyllama-1.1b", 2048, 5632, 22, 32, 4, 32000, 1e4, 2048, false);
    if (name == "llama-2-7b") return make_preset("llama-2-7b", 4096, 11008, 32, 32, 32, 32000, 1e4, 4096, false);
    if (name == "llama-2-13b") return make_preset("llama-2-13b", 5120, 13824, 40, 40, 40, 32000, 1e4, 4096, false);
    if (name == "llama-2-70b") return make_preset("llama-2-70b", 8192, 28672, 80, 64, 8, 32000, 1e4, 4096, false);
    if (name == "llama-3-8b") return make_preset("llama-3-8b", 4096, 14336, 32, 32, 8, 128256, 5e5, 8192, true);
    if (name == "llama-3-70b") return make_preset("llama-3-70b", 8192, 28672, 80, 64, 8, 128256, 5e5, 8192, true);
    if (name == "mixtral-8x7b") return make_mixtral("mixtral-8x7b", 4096, 14336, 32, 32, 8, 8, 2, 32768);
    // TinyLlama-1.1B's attention and layers with 8 experts top 2, each a quarter of its FFN (1408 of
    // 5632): 1.9 B parameters (~2 GB in INT8), 0.7 B active per token.
    if (name == "mixtral-tiny-8x1.1b") return make_mixtral("mixtral-tiny-8x1.1b", 2048, 1408, 22, 32, 4, 8, 2, 2048);
    std::string names;
    for (auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
    LATTICE_FAIL("unknown model preset \"{}\" (known: {})", name, names);
}

}  // namespace lattice
