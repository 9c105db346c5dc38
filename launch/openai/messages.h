// Chat messages of an OpenAI request body on their way to the model's chat template, normalized as
// vLLM does (so clients written against vLLM or OpenAI work unchanged):
//   - "content" null or missing -> "" (the openai SDK's tool loop sends an assistant turn back as the
//     server returned it: content null beside "tool_calls"; templates concatenate content as a string);
//   - "content" as a list of parts -> their texts joined by "\n" (only {"type": "text"} parts; an image
//     or audio part is a 400 naming it);
//   - an assistant turn's tool_calls[].function.arguments given as JSON text -> the object it holds
//     (Hugging Face templates expect a mapping: `tool_call.arguments | tojson`); text that is not a
//     JSON object stays as sent;
//   - role, tool_call_id, name and tool_calls are kept; every message must be an object with a string role.
// Template errors reach the client without a filesystem path: "chat template line L column C: ..."
// (the template's file is the server's business; public_template_error).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "launch/openai/tools.h"
#include "runtime/tokenizer/tokenizer.h"

namespace lattice::openai {

// The request's "messages" (a non-empty array) normalized as above; Error naming the message at fault.
nlohmann::ordered_json normalize_messages(const nlohmann::json& messages);

// The prompt text of a chat body: the normalized messages (and, with tools, the tools) through the
// model's template; the hard-coded families (no Jinja template) take system, user and assistant turns.
std::string render_chat(const nlohmann::ordered_json& messages, const nlohmann::json& body, const Tokenizer& tok,
                        const ToolUse& use, bool add_generation_prompt = true);

// A chat template's error message without the template's file: "chat template '/a/b.gguf' line 3 ..."
// -> "chat template line 3 ...".
std::string public_template_error(std::string_view message);

}  // namespace lattice::openai
