// OpenAI-shaped request bodies (completions and chat completions) to engine requests: one parser
// for `lattice batch` (the "body" of each input line) and `lattice serve` (the HTTP body), so both
// accept exactly the same fields with the same defaults and the same errors.
// Fields: model, prompt (string | token-id array | [string]) or messages ([{role, content}] where
// content is a string or [{"type": "text", "text": ...}]), max_tokens (chat also
// max_completion_tokens), temperature, top_p, top_k (-1 or 0: off), seed, stop (string or up to 4
// strings), stream, stream_options.include_usage, n (1 only), presence_penalty and frequency_penalty
// (OpenAI's, [-2, 2], over the generated tokens), and vLLM's ignore_eos, min_tokens, min_p and
// repetition_penalty (over prompt and output: the whole sequence, unless repeat_last_n, llama.cpp's
// window, says fewer tokens), and vLLM's priority (an integer, lower runs first; default 0). Sampling semantics: runtime/engine/sampler.h, shared with the CLI.
// Unknown fields are ignored (clients send extras such as "user"); a known field of the wrong type
// or out of range is an Error whose message names the field. Known fields lattice does not implement
// yet (logprobs, top_logprobs, echo, logit_bias, tools, functions, a response_format other than text)
// are refused naming the field, unless given their neutral value.
// Defaults: completions max_tokens 16 (OpenAI's); chat: the rest of the context (kRestOfContext to
// the engine client, runtime/engine/client.h, which owns the context budget). Temperature 1, top_p 1 (OpenAI's).
// Seed: random unless given (reported back by the caller).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/engine/client.h"
#include "runtime/tokenizer/tokenizer.h"

namespace lattice {

struct ApiLimits {
    int64_t vocab = 0;  // token ids of a prompt are checked against it
};

struct ApiRequest {
    bool chat = false;
    std::string model;              // "" when absent
    ClientRequest client;  // to the engine client: prompt, limits, sampling, stop strings
    bool stream = false;
    bool include_usage = false;
    bool seed_given = false;
};

// Throws Error naming the field at fault. `tok` may be null (a model without a tokenizer: prompts
// must then be token ids, and messages are refused).
ApiRequest parse_api_request(const nlohmann::json& body, bool chat, const Tokenizer* tok, const ApiLimits& limits);

}  // namespace lattice
