// Tools in chat requests (OpenAI's "tools" and "tool_choice"; the parse of the request side; the
// output side is runtime/tokenizer/tool_calls.h, the response shape launch/openai/response.cpp):
//   tools        [{"type": "function", "function": {"name", "description"?, "parameters"?: JSON schema}}]
//                (at most 128, names unique, [A-Za-z0-9_.-]{1,64}); they reach the model's chat template
//                as its `tools` variable, in the request's order;
//   tool_choice  "auto" (the default with tools: the output is parsed for calls), "none" (the
//                template does not see the tools, nothing is parsed), "required" (the output is one
//                call of any tool: sampled under the grammar of the call object), or {"type":
//                "function", "function": {"name"}} (one call of that tool, likewise). A forced call
//                cannot be combined with response_format / guided_*.
//   parallel_tool_calls  false: an output with several calls returns the first only (default true);
//   messages     with tools, the roles "tool" (content, tool_call_id) and an assistant turn with
//                "tool_calls" (content null: "") reach the template (normalized: launch/openai/messages.h).
// A chat template of a hard-coded family (not the model's Jinja) cannot show tools: 400.
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "runtime/engine/grammar.h"
#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/tool_calls.h"

namespace lattice::openai {

// A request body's field is present and not null (null is the same as absent, as OpenAI takes it).
inline bool field_given(const nlohmann::json& body, const char* key) {
    return body.contains(key) && !body[key].is_null();
}

struct ToolUse {
    bool parse = false;    // tools offered, tool_choice not "none": the output is parsed for calls
    bool forced = false;   // "required" or a named function: the output is exactly one call (grammar)
    bool parallel = true;  // "parallel_tool_calls" (default true); false: only the first call is returned
    ToolCallFormat format = ToolCallFormat::kJson;
    std::set<std::string> names;
    GrammarSpec grammar;  // forced: the call object's JSON schema
};

// "tools" and "tool_choice" of a chat body (Error naming the field at fault).
ToolUse parse_tool_use(const nlohmann::json& body, const Tokenizer& tok);

// Whether the messages need the template's JSON form (tool roles, tool_calls).
bool messages_use_tools(const nlohmann::json& messages);

// The prompt text of a chat body that uses tools: its messages (normalized: launch/openai/messages.h)
// and (unless tool_choice is "none") the tools, through the model's template; a forced call's prompt
// suffix appended.
std::string render_tool_chat(const nlohmann::ordered_json& messages, const nlohmann::json& body, const Tokenizer& tok,
                             const ToolUse& use, bool add_generation_prompt = true);

}  // namespace lattice::openai
