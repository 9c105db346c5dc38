// Chat prompts. A model that carries a Jinja chat template (tokenizer_config.json `chat_template`,
// GGUF `tokenizer.chat_template`) gets that template rendered by runtime/tokenizer/jinja.h with
// messages, add_generation_prompt, bos_token, eos_token and tools (null when none are given), as
// Hugging Face transformers renders it. Only a model without a template (or with one our Jinja
// subset cannot parse, logged at load) falls back to the hard-coded family formats below, chosen
// by the family markers in the template text:
//   kLlama2  "<s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] ..."
//   kLlama3  "<|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>..."
//   kChatML  "<|im_start|>{role}\n{content}<|im_end|>\n..." (Qwen2, SmolLM2)
// The rendered text contains special-token text; encode it with parse_special = true and
// add_bos = false (the BOS text is part of the rendering where the family uses one).
// Contents are copied verbatim except where the family's official template trims them
// (Llama 2 strips user/assistant text, Llama 3 trims every message).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace lattice {

namespace jinja {
class Template;
}

// kJinja: the model's template is rendered and its family is none of the three below (a template
// of a known family keeps the family's kind, for describe(), and is rendered all the same).
enum class ChatTemplateKind { kNone, kLlama2, kLlama3, kChatML, kJinja };

const char* chat_template_kind_name(ChatTemplateKind k);

// Family of a Jinja chat template by its markers; kNone when none is recognised (or text empty).
ChatTemplateKind detect_chat_template(std::string_view jinja);

// A ChatML template's built-in system prompt, used when the conversation has none (SmolLM2 and
// Qwen2 templates write one literally: "<|im_start|>system\nYou are ...<|im_end|>"); "" if none.
std::string chatml_default_system(std::string_view jinja);

struct ChatMessage {
    std::string role;  // "system", "user", "assistant" (a model's template may accept more, e.g. "tool")
    std::string content;
};

// Messages as the templates see them: [{"role": ..., "content": ...}, ...].
nlohmann::ordered_json chat_messages_json(const std::vector<ChatMessage>& messages);

class ChatTemplate {
public:
    ChatTemplate() = default;
    ChatTemplate(ChatTemplateKind kind, std::string bos_text, std::string eos_text, std::string default_system = {})
        : kind_(kind),
          bos_(std::move(bos_text)),
          eos_(std::move(eos_text)),
          default_system_(std::move(default_system)) {}

    // The model's own template (parsed once by the Tokenizer); `family` is the detected kind.
    ChatTemplate(std::shared_ptr<const jinja::Template> model_template, ChatTemplateKind family, std::string bos_text,
                 std::string eos_text)
        : kind_(family), bos_(std::move(bos_text)), eos_(std::move(eos_text)), jinja_(std::move(model_template)) {}

    ChatTemplateKind kind() const { return kind_; }
    // Whether render() runs the model's Jinja template (false: a hard-coded family or kNone).
    bool from_model() const { return jinja_ != nullptr; }

    // Renders the conversation; add_generation_prompt appends the header that opens the assistant's
    // turn (Llama 2's prompt already ends in "[/INST]"). Throws Error on an unknown role or, for
    // Llama 2, when user and assistant turns do not alternate; with the model's template, whatever
    // the template rejects (its raise_exception message, with the template's line and column).
    std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
    // With tools: `tools` is the OpenAI request's "tools" array (as sent, key order kept: parse the
    // request with nlohmann::ordered_json), or null for none. Only the model's template can show
    // tools; a non-null `tools` with a hard-coded family is an Error.
    std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                       const nlohmann::ordered_json& tools) const;
    // Messages as OpenAI chat JSON (roles such as "tool", "tool_calls", "tool_call_id", content
    // null): the model's template sees them as they are; the hard-coded families need string
    // contents and their three roles.
    std::string render_json(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                            const nlohmann::ordered_json& tools = nullptr) const;

private:
    ChatTemplateKind kind_ = ChatTemplateKind::kNone;
    std::string bos_, eos_, default_system_;
    std::shared_ptr<const jinja::Template> jinja_;
};

}  // namespace lattice
