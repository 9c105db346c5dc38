// Chat messages normalized for the template (see messages.h).
#include "launch/openai/messages.h"

#include <fmt/format.h>

#include <vector>

#include "base/error.h"

namespace lattice::openai {

namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

std::string content_text(const json& content, size_t i) {
    if (content.is_null()) return {};
    if (content.is_string()) return content.get<std::string>();
    LATTICE_CHECK(content.is_array(), "\"messages\"[{}].content must be a string or an array of text parts", i);
    std::string text;
    for (size_t k = 0; k < content.size(); ++k) {
        const json& part = content[k];
        LATTICE_CHECK(part.is_object() && part.contains("type") && part["type"].is_string(),
                      "\"messages\"[{}].content[{}] must be an object with a \"type\"", i, k);
        const std::string type = part["type"].get<std::string>();
        LATTICE_CHECK(type == "text", "\"messages\"[{}].content[{}]: \"{}\" parts are not supported (only text)", i, k,
                      type);
        LATTICE_CHECK(part.contains("text") && part["text"].is_string(),
                      "\"messages\"[{}].content[{}].text must be a string", i, k);
        if (k > 0) text += '\n';  // vLLM joins text parts by newlines
        text += part["text"].get<std::string>();
    }
    return text;
}

// tool_calls[].function.arguments as the object its JSON text holds (vLLM's, for Hugging Face templates).
ojson tool_calls_of(const json& calls) {
    ojson out = calls;
    if (!out.is_array()) return out;
    for (ojson& c : out) {
        if (!c.is_object() || !c.contains("function") || !c["function"].is_object()) continue;
        ojson& f = c["function"];
        if (!f.contains("arguments") || !f["arguments"].is_string()) continue;
        ojson args = ojson::parse(f["arguments"].get<std::string>(), nullptr, false);
        if (args.is_object()) f["arguments"] = std::move(args);
    }
    return out;
}

// The template's own rendering, its errors without the template's file.
template <typename F>
std::string rendered(F&& render) {
    try {
        return render();
    } catch (const Error& e) {
        throw Error(public_template_error(e.message()));
    }
}

}  // namespace

ojson normalize_messages(const json& m) {
    LATTICE_CHECK(m.is_array() && !m.empty(), "\"messages\" must be a non-empty array");
    ojson out = ojson::array();
    for (size_t i = 0; i < m.size(); ++i) {
        LATTICE_CHECK(m[i].is_object() && m[i].contains("role") && m[i]["role"].is_string(),
                      "\"messages\"[{}] must be an object with a string \"role\"", i);
        ojson msg = ojson::object();
        msg["role"] = m[i]["role"];
        msg["content"] = content_text(m[i].contains("content") ? m[i]["content"] : json(nullptr), i);
        for (const auto& [key, value] : m[i].items()) {
            if (key == "role" || key == "content" || value.is_null()) continue;
            msg[key] = key == "tool_calls" ? tool_calls_of(value) : ojson(value);
        }
        out.push_back(std::move(msg));
    }
    return out;
}

std::string render_chat(const ojson& messages, const json& body, const Tokenizer& tok, const ToolUse& use,
                        bool add_generation_prompt) {
    if (use.parse || messages_use_tools(json(messages)))
        return rendered([&] { return render_tool_chat(messages, body, tok, use, add_generation_prompt); });
    std::vector<ChatMessage> msgs;
    for (size_t i = 0; i < messages.size(); ++i) {
        const std::string role = messages[i]["role"].get<std::string>();
        LATTICE_CHECK(role == "system" || role == "user" || role == "assistant",
                      "\"messages\"[{}].role \"{}\" is not system, user or assistant", i, role);
        msgs.push_back({role, messages[i]["content"].get<std::string>()});
    }
    return rendered([&] { return tok.chat_template().render(msgs, add_generation_prompt); });
}

std::string public_template_error(std::string_view message) {
    static constexpr std::string_view kHead = "chat template '";
    const size_t a = message.find(kHead);
    if (a == std::string_view::npos) return std::string(message);
    const size_t b = message.find("' ", a + kHead.size());
    if (b == std::string_view::npos) return std::string(message);
    return fmt::format("{}chat template {}", message.substr(0, a), message.substr(b + 2));
}

}  // namespace lattice::openai
