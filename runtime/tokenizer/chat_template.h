// Chat prompt formats for the model families we load, chosen from the model's Jinja chat template
// by the family markers it contains (we do not run Jinja):
//   kLlama2  "<s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] ..."
//   kLlama3  "<|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>..."
//   kChatML  "<|im_start|>{role}\n{content}<|im_end|>\n..." (Qwen2, SmolLM2)
// The rendered text contains special-token text; encode it with parse_special = true and
// add_bos = false (the BOS text is part of the rendering where the family uses one).
// Contents are copied verbatim except where the family's official template trims them
// (Llama 2 strips user/assistant text, Llama 3 trims every message).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace lattice {

enum class ChatTemplateKind { kNone, kLlama2, kLlama3, kChatML };

const char* chat_template_kind_name(ChatTemplateKind k);

// Family of a Jinja chat template by its markers; kNone when none is recognised (or text empty).
ChatTemplateKind detect_chat_template(std::string_view jinja);

// A ChatML template's built-in system prompt, used when the conversation has none (SmolLM2 and
// Qwen2 templates write one literally: "<|im_start|>system\nYou are ...<|im_end|>"); "" if none.
std::string chatml_default_system(std::string_view jinja);

struct ChatMessage {
    std::string role;  // "system", "user", "assistant"
    std::string content;
};

class ChatTemplate {
public:
    ChatTemplate() = default;
    ChatTemplate(ChatTemplateKind kind, std::string bos_text, std::string eos_text, std::string default_system = {})
        : kind_(kind),
          bos_(std::move(bos_text)),
          eos_(std::move(eos_text)),
          default_system_(std::move(default_system)) {}

    ChatTemplateKind kind() const { return kind_; }
    // Renders the conversation; add_generation_prompt appends the header that opens the assistant's
    // turn (Llama 2's prompt already ends in "[/INST]"). Throws Error on an unknown role or, for
    // Llama 2, when user and assistant turns do not alternate.
    std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

private:
    ChatTemplateKind kind_ = ChatTemplateKind::kNone;
    std::string bos_, eos_, default_system_;
};

}  // namespace lattice
