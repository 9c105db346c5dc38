// The Llama-shaped families: Llama, Mistral (Llama plus a sliding window) and Mixtral (Mistral's attention
// with a sparse mixture of experts for the MLP). Their forward is the skeleton's blocks with no option:
// RMSNorm, attention, SwiGLU MLP or MoE, pre-norm residuals.
#include "runtime/arch/families.h"

namespace lattice::families {

namespace {

// Mixtral's expert counts (num_local_experts, num_experts_per_tok).
void read_mixtral(const nlohmann::json& j, ModelConfig& c) {
    read_expert_counts(j, "num_local_experts", c);
}

}  // namespace

void add_llama(std::vector<Architecture>& t) {
    Architecture llama = named("llama", "llama", "LlamaForCausalLM", "llama");
    llama.gguf_qk_interleaved = true;
    llama.rope_scaling = {"llama3", "linear"};
    llama.tensors = dense_tensors(false);
    t.push_back(llama);

    // Mistral is Llama's tensors plus a sliding window, which attention honours (query i attends keys
    // i - W < j <= i, in every layer). llama.cpp writes Mistral GGUFs as architecture "llama"
    // (without the window), so there is no GGUF name of its own.
    Architecture mistral = named("mistral", "mistral", "MistralForCausalLM");
    mistral.gguf_qk_interleaved = true;
    mistral.tensors = llama.tensors;
    mistral.sliding_window = true;
    mistral.sliding_window_honoured = true;
    mistral.rope_scaling = {"linear"};
    t.push_back(mistral);
}

void add_mixtral(std::vector<Architecture>& t) {
    // Mixtral: Mistral's attention (and window) with a sparse MoE block for the MLP: the router
    // [experts, hidden] picks num_experts_per_tok experts per token by softmax, their weights
    // renormalized (transformers' MixtralSparseMoeBlock). Each expert's FFN splits over TP like a dense
    // FFN (gate/up rows, down columns), the router is replicated. llama.cpp writes it as "llama" with
    // llama.expert_count, q/k rows interleaved like llama's.
    Architecture mixtral = named("mixtral", "mixtral", "MixtralForCausalLM", "llama");
    mixtral.gguf_qk_interleaved = true;
    mixtral.sliding_window = true;
    mixtral.sliding_window_honoured = true;
    mixtral.rope_scaling = {"linear"};
    mixtral.moe = true;
    mixtral.moe_renormalize = true;
    mixtral.read_config = read_mixtral;
    mixtral.tensors = dense_tensors(false, true);
    t.push_back(mixtral);
}

}  // namespace lattice::families
