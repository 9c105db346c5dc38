// Tool-call formats (see tool_calls.h).
#include "runtime/tokenizer/tool_calls.h"

#include "base/error.h"

namespace lattice {

namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;  // a call's arguments keep the model's key order (vLLM's, and a stream's)

std::string compact(const ojson& j) {
    return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

std::string_view trim(std::string_view s) {
    const size_t a = s.find_first_not_of(" \t\r\n");
    if (a == std::string_view::npos) return {};
    const size_t b = s.find_last_not_of(" \t\r\n");
    return s.substr(a, b - a + 1);
}

// One call object ({"name", "arguments" | "parameters"}) naming an offered tool, else false.
bool call_of(const ojson& j, const std::set<std::string>* names, ToolCall& out) {
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
    const std::string name = j["name"].get<std::string>();
    if (names && !names->count(name)) return false;
    const ojson* args = j.contains("arguments")    ? &j["arguments"]
                        : j.contains("parameters") ? &j["parameters"]
                                                   : nullptr;
    if (args && args->is_string()) {  // some models write the arguments as a JSON string
        const ojson inner = ojson::parse(args->get<std::string>(), nullptr, false);
        if (!inner.is_object()) return false;
        out = {name, compact(inner)};
        return true;
    }
    if (args && !args->is_object()) return false;
    out = {name, args ? compact(*args) : "{}"};
    return true;
}

ToolCallOutput parse_hermes(std::string_view text, const std::set<std::string>& names) {
    static constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";
    ToolCallOutput out;
    size_t at = 0;
    while (at < text.size()) {
        const size_t open = text.find(kOpen, at);
        if (open == std::string_view::npos) break;
        const size_t body = open + kOpen.size();
        size_t close = text.find(kClose, body);
        const size_t end = close == std::string_view::npos ? text.size() : close + kClose.size();
        if (close == std::string_view::npos) close = text.size();  // cut at the end of the output
        ToolCall c;
        if (!call_of(ojson::parse(text.substr(body, close - body), nullptr, false), &names, c)) break;
        out.content += text.substr(at, open - at);
        out.calls.push_back(std::move(c));
        at = end;
    }
    if (out.calls.empty()) return {std::string(text), {}};
    out.content += text.substr(at);
    out.content = std::string(trim(out.content));
    return out;
}

ToolCallOutput parse_mistral(std::string_view text, const std::set<std::string>& names) {
    static constexpr std::string_view kTag = "[TOOL_CALLS]";
    const size_t tag = text.find(kTag);
    if (tag == std::string_view::npos) return {std::string(text), {}};
    const ojson j = ojson::parse(trim(text.substr(tag + kTag.size())), nullptr, false);
    ToolCallOutput out;
    for (const ojson& x : j.is_array() ? j : ojson::array({j})) {
        ToolCall c;
        if (!call_of(x, &names, c)) return {std::string(text), {}};
        out.calls.push_back(std::move(c));
    }
    out.content = std::string(trim(text.substr(0, tag)));
    return out;
}

ToolCallOutput parse_json(std::string_view text, const std::set<std::string>& names) {
    std::string_view t = trim(text);
    static constexpr std::string_view kPython = "<|python_tag|>";
    if (t.starts_with(kPython)) t = trim(t.substr(kPython.size()));
    if (!t.starts_with('{')) return {std::string(text), {}};
    ToolCallOutput out;
    // One object, or several separated by ';' (Llama 3.1 writes one; some outputs chain them).
    size_t at = 0;
    while (at < t.size()) {
        size_t semi = t.find(';', at);
        ojson j;
        for (;;) {  // a ';' inside a string of the object: try the longer piece
            j = ojson::parse(t.substr(at, semi == std::string_view::npos ? std::string_view::npos : semi - at), nullptr,
                             false);
            if (!j.is_discarded() || semi == std::string_view::npos) break;
            semi = t.find(';', semi + 1);
        }
        ToolCall c;
        if (!call_of(j, &names, c)) return {std::string(text), {}};
        out.calls.push_back(std::move(c));
        at = semi == std::string_view::npos ? t.size() : semi + 1;
        while (at < t.size() && (t[at] == ' ' || t[at] == '\n')) ++at;
    }
    return out;
}

}  // namespace

ToolCallFormat tool_call_format(std::string_view t) {
    if (t.find("<tool_call>") != std::string_view::npos) return ToolCallFormat::kHermes;
    if (t.find("[TOOL_CALLS]") != std::string_view::npos) return ToolCallFormat::kMistral;
    return ToolCallFormat::kJson;
}

std::string_view tool_call_format_name(ToolCallFormat f) {
    switch (f) {
        case ToolCallFormat::kHermes:
            return "hermes";
        case ToolCallFormat::kMistral:
            return "mistral";
        case ToolCallFormat::kJson:
            break;
    }
    return "json";
}

ToolCallOutput parse_tool_calls(std::string_view text, ToolCallFormat f, const std::set<std::string>& names) {
    switch (f) {
        case ToolCallFormat::kHermes:
            return parse_hermes(text, names);
        case ToolCallFormat::kMistral:
            return parse_mistral(text, names);
        case ToolCallFormat::kJson:
            break;
    }
    return parse_json(text, names);
}

ToolCallOutput parse_forced_call(std::string_view text, ToolCallFormat f) {
    (void)f;
    ToolCall c;
    if (!call_of(ojson::parse(trim(text), nullptr, false), nullptr, c)) return {std::string(text), {}};
    return {"", {std::move(c)}};
}

json forced_call_schema(const std::vector<json>& tools, ToolCallFormat f) {
    LATTICE_CHECK(!tools.empty(), "a forced tool call needs at least one tool");
    const std::string key = f == ToolCallFormat::kJson ? "parameters" : "arguments";
    json any = json::array();
    for (const json& t : tools) {
        const json& fn = t["function"];
        json params = fn.contains("parameters") && !fn["parameters"].is_null()
                          ? fn["parameters"]
                          : json{{"type", "object"}, {"properties", json::object()}};
        any.push_back({{"type", "object"},
                       {"properties", {{"name", {{"const", fn["name"]}}}, {key, params}}},
                       {"required", {"name", key}},
                       {"additionalProperties", false}});
    }
    return any.size() == 1 ? any[0] : json{{"anyOf", any}};
}

std::string forced_prompt_suffix(ToolCallFormat f) {
    switch (f) {
        case ToolCallFormat::kHermes:
            return "<tool_call>\n";
        case ToolCallFormat::kMistral:
            return "[TOOL_CALLS]";
        case ToolCallFormat::kJson:
            break;
    }
    return "";
}

}  // namespace lattice
