// vLLM's tokenizer endpoints of `lattice serve`, same request and response shapes, so clients such as
// lm-evaluation-harness can tokenize without a local copy of the tokenizer:
//   POST /tokenize    {"model"?, "prompt": text, "add_special_tokens": true, "return_token_strs": false}
//                     or {"model"?, "messages": [...], "add_generation_prompt": true, "add_special_tokens":
//                     false, "tools"?} (the chat body's rendering, launch/openai/messages.h)
//                     -> {"count", "max_model_len", "tokens", "token_strs": null | [piece, ...]}
//                     The prompt is encoded exactly as /v1/completions encodes it (the BOS only when
//                     add_special_tokens and the model adds one), the messages as /v1/chat/completions.
//   POST /detokenize  {"model"?, "tokens": [id, ...]} -> {"prompt": text}
//   GET  /tokenizer_info  {"tokenizer_class", "bos_token", "eos_token", "pad_token", "chat_template",
//                     "model_max_length"} (vLLM's, which lm-eval probes for its remote tokenizer)
//   GET  /version     {"version": "lattice's version"}
// Errors as the completions' (call.h): a "model" other than the served one 404, a bad field 400.
#pragma once

#include <string>
#include <string_view>

#include "launch/openai/call.h"

namespace lattice::openai {

struct Answer {
    int status = 200;
    std::string body;
};

Answer tokenize_answer(std::string_view body, const ModelInfo& m);
Answer detokenize_answer(std::string_view body, const ModelInfo& m);
Answer tokenizer_info_answer(const ModelInfo& m);
Answer version_answer();

}  // namespace lattice::openai
