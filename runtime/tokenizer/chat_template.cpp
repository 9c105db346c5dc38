// Chat template rendering; formats and detection rules in chat_template.h. A model's own template
// is run by the Jinja engine (jinja.h). The fallback renders follow each
// family's official Hugging Face Jinja template (Llama-2-chat, Llama-3-Instruct, ChatML as used by
// Qwen2 / SmolLM2) so the prompt matches what the model was trained on, byte for byte.
#include "runtime/tokenizer/chat_template.h"

#include "base/error.h"
#include "runtime/tokenizer/jinja.h"

namespace lattice {

namespace {

std::string_view trim(std::string_view s) {
    auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
    while (!s.empty() && ws(s.front())) s.remove_prefix(1);
    while (!s.empty() && ws(s.back())) s.remove_suffix(1);
    return s;
}

void check_role(const ChatMessage& m) {
    LATTICE_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant",
                  "chat template: unknown role '{}' (expected system, user or assistant)", m.role);
}

}  // namespace

const char* chat_template_kind_name(ChatTemplateKind k) {
    switch (k) {
        case ChatTemplateKind::kNone:
            return "none";
        case ChatTemplateKind::kLlama2:
            return "llama2";
        case ChatTemplateKind::kLlama3:
            return "llama3";
        case ChatTemplateKind::kChatML:
            return "chatml";
        case ChatTemplateKind::kJinja:
            return "jinja";
    }
    return "?";
}

ChatTemplateKind detect_chat_template(std::string_view jinja) {
    if (jinja.find("<|start_header_id|>") != std::string_view::npos) return ChatTemplateKind::kLlama3;
    if (jinja.find("<|im_start|>") != std::string_view::npos) return ChatTemplateKind::kChatML;
    if (jinja.find("[INST]") != std::string_view::npos) return ChatTemplateKind::kLlama2;
    return ChatTemplateKind::kNone;
}

std::string chatml_default_system(std::string_view jinja) {
    static constexpr std::string_view kHead = "<|im_start|>system";
    for (size_t at = jinja.find(kHead); at != std::string_view::npos; at = jinja.find(kHead, at + 1)) {
        std::string_view rest = jinja.substr(at + kHead.size());
        // The newline is written either as a Jinja escape (backslash n) or literally.
        if (rest.starts_with("\\n"))
            rest.remove_prefix(2);
        else if (rest.starts_with("\n"))
            rest.remove_prefix(1);
        else
            continue;
        const size_t end = rest.find("<|im_end|>");
        if (end == std::string_view::npos) continue;
        std::string_view text = rest.substr(0, end);
        // A literal prompt, not an expression such as "' + message['content'] + '".
        if (text.empty() || text.find_first_of("'\"{}+") != std::string_view::npos) continue;
        std::string out;
        for (size_t i = 0; i < text.size(); ++i) {
            if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'n') {
                out += '\n';
                ++i;
            } else {
                out += text[i];
            }
        }
        return out;
    }
    return {};
}

nlohmann::ordered_json chat_messages_json(const std::vector<ChatMessage>& messages) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const ChatMessage& m : messages) out.push_back({{"role", m.role}, {"content", m.content}});
    return out;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& tools) const {
    if (jinja_) return render_json(chat_messages_json(messages), add_generation_prompt, tools);
    LATTICE_CHECK(tools.is_null(),
                  "chat template: this model has no chat template of its own, so tools cannot be shown to it");
    return render(messages, add_generation_prompt);
}

std::string ChatTemplate::render_json(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                      const nlohmann::ordered_json& tools) const {
    LATTICE_CHECK(messages.is_array(), "chat template: messages must be an array");
    LATTICE_CHECK(tools.is_null() || tools.is_array(), "chat template: tools must be an array or null");
    if (jinja_) {
        const nlohmann::ordered_json context = {{"messages", messages},
                                                {"tools", tools},
                                                {"add_generation_prompt", add_generation_prompt},
                                                {"bos_token", bos_},
                                                {"eos_token", eos_}};
        return jinja_->render(context);
    }
    LATTICE_CHECK(tools.is_null(),
                  "chat template: this model has no chat template of its own, so tools cannot be shown to it");
    std::vector<ChatMessage> plain;
    for (size_t i = 0; i < messages.size(); ++i) {
        const auto& m = messages[i];
        LATTICE_CHECK(
            m.is_object() && m.contains("role") && m["role"].is_string() && m.contains("content") &&
                m["content"].is_string(),
            "chat template: message {} needs string 'role' and 'content' (this model has no template of its own)", i);
        plain.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    return render(plain, add_generation_prompt);
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
    if (jinja_) return render_json(chat_messages_json(messages), add_generation_prompt, nullptr);
    for (const ChatMessage& m : messages) check_role(m);
    std::string out;
    switch (kind_) {
        case ChatTemplateKind::kLlama2: {
            size_t first = 0;
            std::string system;
            bool has_system = false;
            if (!messages.empty() && messages[0].role == "system") {
                system = messages[0].content;
                has_system = true;
                first = 1;
            }
            for (size_t i = first; i < messages.size(); ++i) {
                const ChatMessage& m = messages[i];
                const bool expect_user = (i - first) % 2 == 0;
                LATTICE_CHECK((m.role == "user") == expect_user && m.role != "system",
                              "chat template llama2: roles must alternate user/assistant (message {} is '{}')", i,
                              m.role);
                std::string content = m.content;
                if (i == first && has_system) content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
                if (m.role == "user") {
                    out += bos_ + "[INST] ";
                    out += trim(content);
                    out += " [/INST]";
                } else {
                    out += " ";
                    out += trim(content);
                    out += " " + eos_;
                }
            }
            return out;  // the prompt already ends where the assistant's answer starts
        }
        case ChatTemplateKind::kLlama3: {
            if (!messages.empty()) out += bos_;
            for (const ChatMessage& m : messages) {
                out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
                out += trim(m.content);
                out += "<|eot_id|>";
            }
            if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
            return out;
        }
        case ChatTemplateKind::kChatML: {
            if (!default_system_.empty() && !messages.empty() && messages[0].role != "system")
                out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
            for (const ChatMessage& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
            if (add_generation_prompt) out += "<|im_start|>assistant\n";
            return out;
        }
        case ChatTemplateKind::kJinja:  // only with a template (rendered above)
        case ChatTemplateKind::kNone: {
            // No template: contents one per line, so a base model still sees the conversation text.
            for (const ChatMessage& m : messages) out += m.content + "\n";
            return out;
        }
    }
    return out;
}

}  // namespace lattice
