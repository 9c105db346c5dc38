// LoRA adapters: reading them (PEFT folders and llama.cpp GGUF LoRA files) into host f32 matrices, and
// the device form one rank holds of one adapter (its TP shard of its stage's layers), which
// Model::add_lora applies unmerged after each projection: y += s * (x A^T) B^T.
//
// An adapter targets any subset of the seven projections of a dense layer (q/k/v/o, gate/up/down),
// named as the architecture table names the base's tensors (runtime/arch/architecture.h). Per target
// and layer: A [r, in] and B [out, r] in HF order (what PEFT's lora_A / lora_B hold), f32.
// Scale s = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora (PEFT's rsLoRA).
//
// Refused by name, at read (never applied wrong): modules_to_save, rank_pattern / alpha_pattern,
// layers_to_transform, DoRA, bias other than "none", targets other than the seven projections (lm_head,
// embed_tokens ...), a rank over the limit, a tensor whose shape does not fit the base (the adapter of
// another model), a target module missing in a layer, a layer the base does not have, a tensor the
// config does not explain, a corrupt or truncated file (safetensors / GGUF readers' checks), and MoE
// experts (gate/up/down of a MoE family). fan_in_fan_out is ignored for these Linear projections, as
// PEFT itself resets it for nn.Linear.
//
// Sharding (LoraShard): the fused column-parallel layers (wqkv [q|k|v], w_gate_up [gate|up]) keep A
// whole and take B's rows of this rank's heads / FFN channels, placed at the part's column offset in
// the fused output; the row-parallel ones (wo, w_down) take A's columns of this rank's input slice and
// keep B whole, so the partial sums ride on the layer's existing all-reduce. A pipeline stage reads
// only its layers.
#pragma once

#include "parallel/world_config.h"
#include "runtime/arch/config.h"
#include "runtime/backend/backend.h"

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lattice {

enum class LoraTarget : uint8_t { kQ, kK, kV, kO, kGate, kUp, kDown };
constexpr int kLoraTargets = 7;
// "q_proj" ... "down_proj" (PEFT's target_modules names of the Llama-skeleton families).
const char* lora_target_name(LoraTarget t);

struct LoraMatrix {
    std::vector<float> a;  // [rank, in] (empty: not targeted in this layer)
    std::vector<float> b;  // [out, rank]
    bool present() const { return !a.empty(); }
};

struct LoraAdapter {
    std::string name;  // as served ("model" of a request)
    std::string path;
    int64_t rank = 0;
    double alpha = 0;
    bool rslora = false;
    float scale = 0;                    // alpha / rank, or alpha / sqrt(rank) (rslora)
    std::vector<LoraTarget> targets;    // in LoraTarget order
    int64_t layer_begin = 0;            // the layers held: [layer_begin, layer_begin + layers.size())
    std::vector<std::array<LoraMatrix, kLoraTargets>> layers;
    int64_t parameters() const;         // elements of A and B held
};

struct LoraReadOptions {
    int64_t max_rank = 64;                     // --max-lora-rank
    int64_t layer_begin = 0, layer_end = -1;   // the stage's layers (-1: all); the others are checked, not kept
};

// Reads a PEFT folder (adapter_config.json + adapter_model.safetensors) or a GGUF LoRA file for the
// base `cfg`. Throws Error naming the adapter, the file and the tensor or field at fault.
LoraAdapter read_lora_adapter(const std::string& name, const std::string& path, const ModelConfig& cfg,
                              const LoraReadOptions& opt = {});

// [in, out] of target t in the base (full, unsharded).
std::pair<int64_t, int64_t> lora_target_dims(const ModelConfig& cfg, LoraTarget t);

// One adapter as a rank holds it on its backend: per local layer and fused projection, the parts
// (a target each) with their A [r, in_local] and B [out_local, r] as float Linears.
enum class LoraSite : uint8_t { kQkv, kO, kGateUp, kDown };
constexpr int kLoraSites = 4;
struct LoraPart {
    Linear a, b;
    int64_t col0 = 0;   // first column of the fused output this part adds to
    int64_t width = 0;  // its columns (B's local rows)
};
struct LoraSiteWeights {
    std::vector<LoraPart> parts;  // empty: the adapter does not touch this projection
};
struct LoraShard {
    std::shared_ptr<const LoraAdapter> adapter;
    float scale = 0;
    int64_t rank = 0;
    std::vector<std::array<LoraSiteWeights, kLoraSites>> layers;  // local layers
    int64_t bytes = 0;                                            // weight bytes on the backend
};

// The shard of `ad` for the TP rank `shard` describes over the local layers [layer_begin, layer_end)
// (the adapter must hold them), its matrices made by be.make_linear (f32, unquantized).
LoraShard make_lora_shard(const std::shared_ptr<const LoraAdapter>& ad, const ModelConfig& cfg, const ShardShape& shard,
                          int64_t layer_begin, int64_t layer_end, Backend& be);

}  // namespace lattice
