// Tool calls in a model's output, parsed back into OpenAI's `tool_calls`, in the format the model's
// chat template teaches it:
//   kHermes   <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number, text between them
//             is content (Hermes 2/3, Qwen2.5, QwQ: their templates say so);
//   kMistral  [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] (Mistral, Mistral-Nemo);
//   kJson     the whole output one JSON object {"name": ..., "parameters": {...}} ("arguments" also
//             taken), optionally after <|python_tag|> (Llama 3.1 / 3.3's custom tools; templates
//             without tool markers get this too).
// A call names one of the request's tools, or it is not a call (the text stays content); arguments
// must be a JSON object (OpenAI returns them as its JSON text). Output that does not parse as the
// format's calls is content, never an error: a model may answer in words.
// Forced calls (tool_choice "required" or a named function): forced_call_schema() is the JSON schema
// the output is constrained to (runtime/engine/grammar.h), the format's argument key included;
// forced_prompt_suffix() is what the prompt gets after the generation header so the model writes
// the call inside its format (Hermes: "<tool_call>\n"); the output is then the call object alone.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace lattice {

enum class ToolCallFormat : uint8_t { kJson, kHermes, kMistral };

// The format a chat template teaches (its Jinja text; "" for none: kJson).
ToolCallFormat tool_call_format(std::string_view template_text);
std::string_view tool_call_format_name(ToolCallFormat f);

struct ToolCall {
    std::string name;
    std::string arguments;  // a JSON object's compact text, its keys in the model's order
};

struct ToolCallOutput {
    std::string content;  // the text that is not a call ("" when the output was calls only)
    std::vector<ToolCall> calls;
};

// `names`: the request's tools' function names.
ToolCallOutput parse_tool_calls(std::string_view text, ToolCallFormat f, const std::set<std::string>& names);
// The output of a forced call (exactly the object forced_call_schema allows).
ToolCallOutput parse_forced_call(std::string_view text, ToolCallFormat f);

// `tools`: the request's "tools" entries that may be called ({"type": "function", "function": {"name",
// "parameters"}}); one: that function; several: any of them (anyOf).
nlohmann::json forced_call_schema(const std::vector<nlohmann::json>& tools, ToolCallFormat f);
std::string forced_prompt_suffix(ToolCallFormat f);

}  // namespace lattice
