// ModelConfig: the hyper-parameters every loader (config.json, GGUF metadata, built-in presets)
// produces and the model consumes, with the family (runtime/arch/architecture.h) they belong to.
// validate() rejects inconsistent values, and families or options lattice does not run, with a
// message naming the source and field. It lives in runtime/arch/ (below runtime/weights) because
// both the weight sources, which parse configs, and the model read it.
#pragma once

#include "parallel/world_config.h"

#include <cstdint>
#include <string>
#include <vector>

namespace lattice {

// Experts per MoE layer lattice accepts (Mixtral 8, DeepSeek/Qwen MoE up to 160).
constexpr int64_t kMaxExperts = 256;

struct RopeScaling {
    std::string type;  // "" (none), "llama3", "linear", "longrope" (also written "su")
    double factor = 1.0;
    double low_freq_factor = 1.0;
    double high_freq_factor = 4.0;
    int64_t original_max_position = 8192;
    // longrope (Phi-3): per-pair divisors [head_dim / 2] of the frequencies, the long ones for a context past
    // original_max_position; cos and sin times attention_factor (0: sqrt(1 + ln(factor) / ln(original)),
    // factor = max_position / original_max_position, or 1 when that is <= 1).
    std::vector<double> short_factor, long_factor;
    double attention_factor = 0;
};

// The gated MLP's activation (config.json hidden_act / hidden_activation): SwiGLU or GeGLU (tanh GELU).
enum class HiddenAct : uint8_t { kSilu, kGeluTanh };

struct ModelConfig {
    std::string source;  // file the config came from (for error messages)
    std::string architecture = "LlamaForCausalLM";  // HF class name (config.json architectures[0])
    std::string family = "llama";  // entry of the architecture table (runtime/arch/architecture.h)
    // Attention window (keys j with i - sliding_window < j <= i); 0: none. Only families with the
    // option carry one; validate() refuses a window shorter than max_position where the family's
    // window is not honoured (Architecture::sliding_window_honoured).
    int64_t sliding_window = 0;
    // The window limits the layers >= window_layer_begin only (Qwen2's max_window_layers); 0: all.
    int64_t window_layer_begin = 0;
    // Interleaved local / global attention (Gemma 2: 2, Gemma 3: 6): with a window, layer l is global (full
    // attention) when (l + 1) % window_pattern == 0 and windowed otherwise; 0: window_layer_begin's rule.
    int64_t window_pattern = 0;
    // The forward's per-family values (0: the plain Llama behaviour), set from config.json by the family's
    // entry: the rope base of the windowed layers (Gemma 3's rope_local_base_freq, unscaled), the attention
    // scale (query_pre_attn_scalar^-0.5), soft-caps of the attention scores and of the final logits.
    double rope_local_theta = 0;
    double query_pre_attn_scalar = 0;
    double attn_softcap = 0;
    double final_softcap = 0;
    HiddenAct hidden_act = HiddenAct::kSilu;
    // MoE: the top-k router weights renormalized to sum 1 (Mixtral always; Qwen3-MoE's norm_topk_prob).
    bool moe_renormalize = true;
    int64_t hidden = 0;
    int64_t intermediate = 0;  // FFN channels (of each expert in a MoE family)
    // Mixture of experts (families with Architecture::moe): experts per layer (num_local_experts) and
    // experts each token is routed to (num_experts_per_tok); 0 for dense families.
    int64_t n_experts = 0;
    int64_t n_experts_used = 0;
    int64_t n_layers = 0;
    int64_t n_heads = 0;
    int64_t n_kv_heads = 0;
    int64_t head_dim = 0;
    int64_t vocab = 0;
    int64_t max_position = 2048;
    double rms_eps = 1e-5;
    double rope_theta = 10000.0;
    RopeScaling rope_scaling;
    bool tie_embeddings = false;
    int64_t bos_id = 1;
    std::vector<int64_t> eos_ids{2};

    void validate() const;  // throws Error
    int64_t q_dim() const { return n_heads * head_dim; }
    int64_t kv_dim() const { return n_kv_heads * head_dim; }
    bool is_moe() const { return n_experts > 0; }
    // Whether layer l's attention is limited to the sliding window (window_layer_begin / window_pattern).
    bool layer_windowed(int64_t l) const {
        if (sliding_window <= 0) return false;
        return window_pattern > 0 ? (l + 1) % window_pattern != 0 : l >= window_layer_begin;
    }
    // The softmax scale of attention scores: query_pre_attn_scalar^-0.5, else head_dim^-0.5.
    double attention_scale() const;
    // What the layout rules (parallel/world_config.h) need to know.
    ModelDims dims() const {
        return {n_layers, n_heads, n_kv_heads, intermediate, vocab, source, hidden, head_dim, tie_embeddings,
                n_experts, n_experts_used};
    }
    // Parameters of the full model (embedding and head counted once when tied); validate() bounds
    // it to 1e15, so the int64 form cannot overflow on a validated config.
    int64_t parameter_count() const;
    // The parameters one token runs: a MoE model's n_experts_used of its n_experts FFNs (a dense
    // model: parameter_count()).
    int64_t active_parameter_count() const;
    double parameter_count_estimate() const;
    bool is_eos(int64_t id) const;
    // Per-pair inverse frequencies [head_dim/2] with rope scaling applied (HF semantics); local: those of
    // the windowed layers (rope_local_theta, unscaled) where the family has a local base. longrope: the
    // long factors when `context` (the positions a sequence may reach) exceeds original_max_position, as
    // llama.cpp picks them by its context (transformers picks per forward by its length).
    std::vector<float> rope_inv_freq(bool local = false, int64_t context = 0) const;
    // longrope's factor on cos and sin (RopeScaling::attention_factor resolved); 1 otherwise.
    double rope_attention_factor() const;
};

// Parses a Hugging Face config.json of a family in the architecture table. Throws Error naming the
// path (and, for an unsupported family, listing the supported ones).
ModelConfig load_hf_config(const std::string& path);
ModelConfig parse_hf_config(const std::string& json_text, const std::string& source);

// Built-in shapes for random-weight benchmarks: "tinyllama-1.1b", "llama-2-7b", "llama-2-13b", "llama-2-70b",
// "llama-3-8b", "llama-3-70b", "mixtral-8x7b", "mixtral-tiny-8x1.1b" (TinyLlama's layers with 8 experts top 2
// of a quarter of its FFN each). Throws Error listing the names for an unknown one.
ModelConfig preset_config(const std::string& name);
std::vector<std::string> preset_names();

}  // namespace lattice
