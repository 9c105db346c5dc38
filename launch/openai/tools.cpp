// Tools in chat requests (see tools.h).
#include "launch/openai/tools.h"

#include <fmt/format.h>

#include "base/error.h"

namespace lattice::openai {

namespace {

using nlohmann::json;

bool valid_name(const std::string& n) {
    if (n.empty() || n.size() > 64) return false;
    for (unsigned char c : n)
        if (!std::isalnum(c) && c != '_' && c != '-' && c != '.') return false;
    return true;
}

}  // namespace

bool messages_use_tools(const json& m) {
    if (!m.is_array()) return false;
    for (const json& x : m)
        if (x.is_object() && ((x.contains("role") && x["role"] == "tool") || field_given(x, "tool_calls"))) return true;
    return false;
}

ToolUse parse_tool_use(const json& b, const Tokenizer& tok) {
    ToolUse u;
    const bool given = field_given(b, "tools") && !b["tools"].empty();
    const bool choice_given = field_given(b, "tool_choice");
    if (!given) {
        LATTICE_CHECK(!choice_given || b["tool_choice"] == "none" || b["tool_choice"] == "auto",
                      "\"tool_choice\" needs \"tools\"");
        return u;
    }
    const json& tools = b["tools"];
    LATTICE_CHECK(tools.is_array() && tools.size() <= 128, "\"tools\" must be an array of at most 128 tools");
    std::vector<json> fns;
    for (size_t i = 0; i < tools.size(); ++i) {
        const json& t = tools[i];
        LATTICE_CHECK(t.is_object() && t.contains("type") && t["type"] == "function" && t.contains("function") &&
                          t["function"].is_object(),
                      "\"tools\"[{}] must be {{\"type\": \"function\", \"function\": {{...}}}}", i);
        const json& f = t["function"];
        LATTICE_CHECK(f.contains("name") && f["name"].is_string() && valid_name(f["name"].get<std::string>()),
                      "\"tools\"[{}].function.name must be 1-64 characters of [A-Za-z0-9_.-]", i);
        LATTICE_CHECK(!field_given(f, "parameters") || f["parameters"].is_object(),
                      "\"tools\"[{}].function.parameters must be a JSON schema (an object)", i);
        // Compiled whatever tool_choice is (as "required" would): a schema the grammar cannot take is the
        // client's error now, not a surprise on a later request that forces the call.
        if (field_given(f, "parameters")) {
            try {
                Grammar::compile(GrammarSpec{GrammarSpec::Kind::kJsonSchema, f["parameters"].dump(), {}});
            } catch (const Error& e) {
                throw Error(fmt::format("\"tools\"[{}].function.parameters: {}", i, e.message()));
            }
        }
        LATTICE_CHECK(u.names.insert(f["name"].get<std::string>()).second, "\"tools\"[{}]: the name \"{}\" is taken", i,
                      f["name"].get<std::string>());
        fns.push_back(t);
    }
    std::string choice = "auto";
    std::vector<json> forced;
    if (choice_given) {
        const json& c = b["tool_choice"];
        if (c.is_string()) {
            choice = c.get<std::string>();
            LATTICE_CHECK(choice == "auto" || choice == "none" || choice == "required",
                          "\"tool_choice\" must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\", "
                          "\"function\": {{\"name\": ...}}}}, got \"{}\"",
                          choice);
            if (choice == "required") forced = fns;
        } else {
            LATTICE_CHECK(c.is_object() && c.contains("function") && c["function"].is_object() &&
                              c["function"].contains("name") && c["function"]["name"].is_string(),
                          "\"tool_choice\" must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\", "
                          "\"function\": {{\"name\": ...}}}}");
            const std::string name = c["function"]["name"].get<std::string>();
            LATTICE_CHECK(u.names.count(name), "\"tool_choice\" names the function \"{}\", which \"tools\" lacks",
                          name);
            for (const json& t : fns)
                if (t["function"]["name"] == name) forced.push_back(t);
            choice = "named";
        }
    }
    if (choice == "none") return ToolUse{};
    LATTICE_CHECK(tok.chat_template().from_model(),
                  "\"tools\": this model's chat template is not its own Jinja template (a built-in {} format), which "
                  "cannot show tools",
                  chat_template_kind_name(tok.chat_template_kind()));
    u.parse = true;
    u.format = tool_call_format(tok.chat_template_text());
    if (field_given(b, "parallel_tool_calls")) {
        LATTICE_CHECK(b["parallel_tool_calls"].is_boolean(), "\"parallel_tool_calls\" must be true or false");
        u.parallel = b["parallel_tool_calls"].get<bool>();
    }
    if (!forced.empty()) {
        u.forced = true;
        u.grammar.kind = GrammarSpec::Kind::kJsonSchema;
        u.grammar.source = forced_call_schema(forced, u.format).dump();
    }
    return u;
}

std::string render_tool_chat(const nlohmann::ordered_json& m, const json& b, const Tokenizer& tok, const ToolUse& use,
                             bool add_generation_prompt) {
    for (size_t i = 0; i < m.size(); ++i) {
        const std::string role = m[i]["role"].get<std::string>();
        LATTICE_CHECK(role == "system" || role == "user" || role == "assistant" || role == "tool",
                      "\"messages\"[{}].role \"{}\" is not system, user, assistant or tool", i, role);
    }
    const ChatTemplate t = tok.chat_template();
    LATTICE_CHECK(t.from_model(),
                  "\"messages\" with tool turns: this model's chat template is a built-in {} format, which cannot "
                  "show them",
                  chat_template_kind_name(tok.chat_template_kind()));
    // (ordered_json keeps the keys in the order the parser left them)
    const nlohmann::ordered_json tools =
        use.parse ? nlohmann::ordered_json(b["tools"]) : nlohmann::ordered_json(nullptr);
    std::string text = t.render_json(m, add_generation_prompt, tools);
    if (use.forced) text += forced_prompt_suffix(use.format);
    return text;
}

}  // namespace lattice::openai
