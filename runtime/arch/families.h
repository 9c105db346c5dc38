// The family files' registrations (runtime/arch/family_*.cpp), in the order the table lists them
// ("supported: ..."), and what they share. Each add_* appends its entries to the table; a new family
// is a new file with one function here and its line in architecture.cpp's make_table.
#pragma once

#include <vector>

#include "runtime/arch/architecture.h"

namespace lattice::families {

void add_llama(std::vector<Architecture>& table);    // llama, mistral
void add_qwen(std::vector<Architecture>& table);     // qwen2, qwen3, qwen3_moe
void add_mixtral(std::vector<Architecture>& table);  // mixtral (family_llama.cpp)
void add_gemma(std::vector<Architecture>& table);    // gemma2, gemma3 (text)
void add_phi(std::vector<Architecture>& table);      // phi3

// An entry with its names: lattice's name, the config.json model_type (also what `lattice convert` writes
// back) and architectures[0] class, the GGUF general.architecture ("": no GGUF form of its own).
Architecture named(const char* name, const char* model_type, const char* hf_class, const char* gguf_name = "");
// The MoE counts every MoE family's config.json carries: experts per layer (`count_key`) and
// num_experts_per_tok.
void read_expert_counts(const nlohmann::json& j, const char* count_key, ModelConfig& c);

// Llama's skeleton (embedding, per layer RMSNorm + q/k/v/o + RMSNorm + gate/up/down, final norm, LM
// head; HF names after "model.layers.N.", GGUF after "blk.N."), with q/k/v biases when qkv_bias and
// with Mixtral's sparse MoE block (block_sparse_moe.*) in place of the MLP when moe.
std::vector<TensorSpec> dense_tensors(bool qkv_bias, bool moe = false);
// `tensors` without the MLP's gate/up/down (a MoE family adds its own expert tensors).
std::vector<TensorSpec> without_mlp(std::vector<TensorSpec> tensors);
// QK-norm's two per-layer weights: "self_attn.q_norm.weight", "self_attn.k_norm.weight" (GGUF attn_q_norm,
// attn_k_norm), replicated over TP.
std::vector<TensorSpec> qk_norm_tensors();

}  // namespace lattice::families
