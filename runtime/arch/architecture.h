// The architecture table: what each model family lattice runs is, in one place. Every other file
// asks this table for a tensor's name (HF safetensors, GGUF, lattice's converted format), its shape
// from the config and its tensor-parallel split; none spells a tensor name itself.
//
// One entry per family, each made in its family file (runtime/arch/family_*.cpp, registered in
// families.h): its names (config.json model_type and class, GGUF architecture), its tensors (the
// Llama skeleton's roles, gated by options, plus the roles of its extra blocks), the blocks of its
// forward (norm kind, QK-norm, sandwich norms, activation, embedding scale; runtime/model/model.cpp
// assembles the forward from them) and the config.json keys of its own options (read_config). Adding
// a family whose blocks exist is one family file plus its line in families.h
// (docs/adding-a-model-family.md).
//
// The table sits beside ModelConfig (runtime/arch/, below runtime/weights), so the weight sources
// (names, shapes, GGUF mapping), the model (sharding, load), the converter and SmoothQuant all read
// the same entries. A config whose family or option is not in the table is refused when it is parsed
// (parse_hf_config, gguf_model_config), never loaded and run wrong; families known to need blocks
// lattice lacks (DeepSeek's multi-head latent attention, Gemma 3's vision tower) are refused by name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "runtime/arch/config.h"

namespace lattice {

// A tensor's role in the forward, whatever the checkpoint calls it.
enum class TensorRole : uint8_t {
    kEmbed,      // [vocab, hidden]
    kLmHead,     // [vocab, hidden] (absent when tied)
    kFinalNorm,  // [hidden]
    kAttnNorm,   // per layer [hidden]
    kFfnNorm,    // per layer [hidden]
    kWq,         // per layer [nq * head_dim, hidden]
    kWk,         // per layer [nkv * head_dim, hidden]
    kWv,         // per layer [nkv * head_dim, hidden]
    kBq,         // per layer [nq * head_dim]      (qkv_bias families)
    kBk,         // per layer [nkv * head_dim]     (qkv_bias families)
    kBv,         // per layer [nkv * head_dim]     (qkv_bias families)
    kWo,         // per layer [hidden, nq * head_dim]
    kWGate,      // per layer [ffn, hidden]
    kWUp,        // per layer [ffn, hidden]
    kWDown,      // per layer [hidden, ffn]
    kRouter,     // per layer [experts, hidden]        (MoE families)
    kExpGate,    // per layer and expert [ffn, hidden] (MoE families)
    kExpUp,      // per layer and expert [ffn, hidden] (MoE families)
    kExpDown,    // per layer and expert [hidden, ffn] (MoE families)
    kQNorm,      // per layer [head_dim]  (QK-norm families)
    kKNorm,      // per layer [head_dim]  (QK-norm families)
    kPostAttnNorm,  // per layer [hidden] (sandwich-norm families: on the attention block's output)
    kPostFfnNorm,   // per layer [hidden] (sandwich-norm families: on the MLP block's output)
};

// How a tensor splits over the tensor-parallel group (parallel/world_config.h shard_shape gives the
// ranges): rows of the vocabulary, rows (or bias entries) of q heads / kv heads / FFN channels
// (column-parallel), columns of q heads / FFN channels (row-parallel), or whole on every rank.
enum class TpSplit : uint8_t { kReplicated, kVocabRows, kQHeadRows, kKvHeadRows, kFfnRows, kQHeadCols, kFfnCols };

// When a tensor is part of a checkpoint.
enum class TensorGate : uint8_t { kAlways, kUntiedHead, kQkvBias };

// Per-expert names hold kExpertMark where the expert's number goes ("block_sparse_moe.experts.*.w1.weight").
constexpr char kExpertMark = '*';

struct TensorSpec {
    TensorRole role;
    bool per_layer;
    const char* hf;    // HF name; per-layer ones after "model.layers.N."; "<fused>:<part>" for a part of a
                       // checkpoint tensor that fuses several (Phi-3's qkv_proj: the HF source shows it as
                       // its parts, row ranges in table order)
    const char* gguf;  // GGUF name; per-layer ones after "blk.N."; "<fused>:<part>" for a part of a tensor
                       // llama.cpp fuses (Phi-3's attn_qkv, ffn_up holding gate|up), row ranges in table order
    TpSplit split;
    TensorGate gate;
    bool per_expert = false;         // one tensor per expert (its number at kExpertMark in hf and gguf)
    const char* gguf_merged = "";    // per-expert tensors: llama.cpp's one 3-D tensor of every expert
                                     // ([experts, rows, cols] in HF order), after "blk.N."
};

// What a family's GGUF reader sees of the file (runtime/weights/gguf_source.cpp gives it over the file): its
// metadata by full key and its small f32 tensors (LongRoPE's factors); nullopt when absent.
struct GgufMetadata {
    std::string source;  // the file (for messages)
    std::string prefix;  // "<general.architecture>."
    virtual ~GgufMetadata() = default;
    virtual std::optional<int64_t> int_value(const std::string& key) const = 0;
    virtual std::optional<double> float_value(const std::string& key) const = 0;
    // A 1-D f32 tensor's values; throws naming it when it is not one.
    virtual std::optional<std::vector<float>> f32_vector(const std::string& tensor) const = 0;
    // The metadata key <prefix><key>, required (throws naming it when absent).
    int64_t required_int(const std::string& key) const;
};

struct Architecture {
    std::string name;                         // lattice's name: "llama", "mistral", "qwen2"
    std::vector<std::string> hf_model_types;  // config.json "model_type" values
    std::vector<std::string> hf_classes;      // config.json "architectures"[0] values
    std::string hf_model_type;                // what `lattice convert` writes as model_type
    std::string gguf_name;                    // GGUF general.architecture (metadata key prefix)
    bool qkv_bias = false;                    // q/k/v projections carry biases
    bool gguf_qk_interleaved = false;         // llama.cpp's converter stored q/k rows in RoPE-pair order
    bool sliding_window = false;              // the config may carry a sliding window
    bool sliding_window_honoured = false;     // ... which attention applies (else refused when it bites)
    std::string sliding_window_flag;          // config.json switch the window needs ("": always applies)
    std::string sliding_window_layers;        // config.json key of the first windowed layer ("": every layer)
    int64_t sliding_window_layers_default = 0;  // ... when the config omits it
    std::vector<std::string> rope_scaling;    // rope_scaling kinds accepted besides none
    // Mixture of experts: each layer's FFN is experts routed per token (Mixtral's sparse MoE block:
    // softmax over the router's logits, the top num_experts_per_tok, their weights renormalized to
    // sum 1 when moe_renormalize); GGUF marks such a model by <arch>.expert_count.
    bool moe = false;
    bool moe_renormalize = true;              // the default of ModelConfig::moe_renormalize
    // The blocks of the forward beyond Llama's (runtime/model/model.cpp):
    bool norm_one_plus = false;   // RMSNorm weights are stored as w and applied as (1 + w) (Gemma)
    bool qk_norm = false;         // an RMSNorm over each q and k head before RoPE (kQNorm, kKNorm)
    bool sandwich_norms = false;  // the attention and MLP outputs normed before the residual add (kPost*Norm)
    bool embed_scale = false;     // embeddings times sqrt(hidden) (Gemma)
    HiddenAct hidden_act = HiddenAct::kSilu;  // the one activation the family's configs may name
    // The family's own config.json keys (after the shared ones) into c; null: none. Throws naming the key.
    void (*read_config)(const nlohmann::json& j, ModelConfig& c) = nullptr;
    // Those keys written back (the config.json of a converted checkpoint); null: none.
    void (*write_config)(const ModelConfig& c, nlohmann::json& j) = nullptr;
    // The family's own GGUF metadata (after the shared <arch>.* keys gguf_model_config reads), as llama.cpp
    // reads it for the architecture; null: none. Throws naming the key.
    void (*read_gguf)(const GgufMetadata& m, ModelConfig& c) = nullptr;
    // llama.cpp's converter stores every RMSNorm weight plus this (Gemma: 1, its (1 + w) folded in); the
    // GGUF reader subtracts it, so the source shows HF's values.
    float gguf_norm_shift = 0;
    std::vector<TensorSpec> tensors;          // every tensor the family may hold, gated by its options
};

// The table, in the order "supported: ..." lists it.
const std::vector<Architecture>& architectures();
// "llama, mistral, qwen2"
std::string supported_architectures();
// By lattice name; throws Error "architecture 'gemma2' is not supported; supported: ..." for others.
const Architecture& find_architecture(const std::string& name);
// The entry a config.json names: by model_type (what transformers dispatches on), by architectures[0]
// only when model_type is absent; nullptr when none.
const Architecture* architecture_for_hf(const std::string& model_type, const std::string& hf_class);
// Why a known family is not run ("" when it is not one of those): the reason a refusal names.
std::string unsupported_reason(const std::string& model_type, const std::string& hf_class);
// The entry whose GGUF general.architecture is `gguf_name` and that is (not) a MoE family, as the file's
// <arch>.expert_count says (llama.cpp writes Mixtral as "llama" with experts); nullptr when none.
const Architecture* architecture_for_gguf(const std::string& gguf_name, bool moe = false);
// The config's entry (ModelConfig::family).
const Architecture& architecture_of(const ModelConfig& c);

// One tensor a checkpoint of `c` holds: HF name, shape (HF order) and role.
struct ExpectedTensor {
    std::string name;
    std::vector<int64_t> shape;
    TensorRole role;
    int64_t layer;  // -1 for the model-level tensors
    TpSplit split;
    int64_t expert = -1;  // per-expert tensors: the expert
};
// Every tensor a checkpoint of `c` must hold, model-level ones first, then layer by layer.
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c);
// HF name of `role` (layer for per-layer roles, expert for per-expert ones); throws when the family has
// no such tensor.
std::string tensor_name(const ModelConfig& c, TensorRole role, int64_t layer = -1, int64_t expert = -1);
// Shape of `role` from the config, HF order.
std::vector<int64_t> tensor_shape(const ModelConfig& c, TensorRole role);
// Layer index of an HF per-layer name ("model.layers.N.*"), -1 otherwise.
int64_t hf_layer_of(const std::string& name);
// Tensors checkpoints carry that the forward recomputes (rotary_emb.inv_freq).
bool hf_tensor_ignorable(const std::string& name);
// HF name of a GGUF tensor of `arch`, "" when the table has none (e.g. "blk.3.attn_q.bias" ->
// "model.layers.3.self_attn.q_proj.bias"). Layer numbers are decimal without leading zeros.
std::string gguf_to_hf_name(const Architecture& arch, const std::string& gguf_name);
// The role of an HF name ("" layer prefix handled), or false when the table has none.
bool hf_role_of(const Architecture& arch, const std::string& name, TensorRole* role);
// The parts of a fused GGUF tensor (`rest` after "blk.N.", e.g. "attn_qkv.weight"), in table order; empty when
// `rest` is no fused tensor of `arch`.
std::vector<const TensorSpec*> gguf_fused_parts(const Architecture& arch, const std::string& rest);
// Whether `role` is an RMSNorm weight (the final, per-layer, QK and sandwich norms).
bool is_norm_role(TensorRole role);
// The per-expert specs of `arch` whose merged GGUF name is `rest` (after "blk.N."), nullptr when none.
const TensorSpec* gguf_merged_spec(const Architecture& arch, const std::string& rest);
// `pattern` with kExpertMark replaced by the expert's number.
std::string expert_name(const char* pattern, int64_t expert);
// "blk.N." + rest -> N and rest (decimal layer numbers without leading zeros); -1 otherwise.
int64_t gguf_layer_of(const std::string& name, std::string* rest);
// GGUF tensors besides the mapped ones that a reader consumes itself: llama3's rope_freqs.weight, LongRoPE's
// factors (read into ModelConfig::rope_scaling by Phi-3's read_gguf).
constexpr const char* kGgufRopeFreqs = "rope_freqs.weight";
constexpr const char* kGgufRopeFactorsLong = "rope_factors_long.weight";
constexpr const char* kGgufRopeFactorsShort = "rope_factors_short.weight";

// Names in lattice's converted (pre-sharded) format: one rank's tensors, q|k|v and gate|up fused.
struct PreparedNames {
    static std::string embed();
    static std::string lm_head();
    static std::string final_norm();
    static std::string attn_norm(int64_t layer);
    static std::string ffn_norm(int64_t layer);
    static std::string wqkv(int64_t layer);
    static std::string bqkv(int64_t layer);  // q|k|v bias, f32 (qkv_bias families)
    static std::string wo(int64_t layer);
    static std::string w_gate_up(int64_t layer);
    static std::string w_down(int64_t layer);
    static std::string router(int64_t layer);                    // [experts, hidden], replicated
    static std::string expert_gate_up(int64_t layer, int64_t e);  // [2 * ffn_local, hidden]
    static std::string expert_down(int64_t layer, int64_t e);     // [hidden, ffn_local]
    static std::string q_norm(int64_t layer);                     // [head_dim] f32 (QK-norm families)
    static std::string k_norm(int64_t layer);
    static std::string post_attn_norm(int64_t layer);             // [hidden] f32 (sandwich-norm families)
    static std::string post_ffn_norm(int64_t layer);
};

}  // namespace lattice
