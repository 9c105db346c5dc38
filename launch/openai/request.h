// OpenAI-shaped request bodies (completions and chat completions) to engine requests: one parser
// for `lattice batch` (the "body" of each input line) and `lattice serve` (the HTTP body), so both
// accept exactly the same fields with the same defaults and the same errors.
// Fields: model, prompt (completions: a string, an array of token ids, an array of strings or an
// array of token-id arrays: one choice per prompt, x n) or messages ([{role, content}] where content
// is a string or [{"type": "text", "text": ...}]), max_tokens (chat also max_completion_tokens; 0 only
// with echo), temperature, top_p, top_k (-1 or 0: off), seed, stop (string or up to 4 strings),
// stream, stream_options.include_usage, n and best_of (completions; best_of >= n, not with stream:
// the n of best_of with the highest cumulative logprob; at most kMaxChoices choices in all), logprobs
// (completions: k in [0, 20], the chosen token's log-softmax and the k most likely; chat: true, with
// top_logprobs k in [0, 20]), echo (completions: the prompt before the output; with logprobs, the
// prompt's logprobs (the first null) before the generated tokens', any max_tokens, as vLLM and OpenAI's
// legacy API), vLLM's prompt_logprobs (both endpoints: k in [0, 20]; not with stream), presence_penalty and
// frequency_penalty (OpenAI's, [-2, 2], over the generated tokens), and vLLM's ignore_eos, min_tokens, min_p and
// repetition_penalty (over prompt and output: the whole sequence, unless repeat_last_n, llama.cpp's window, says fewer
// tokens), and vLLM's priority (an integer, lower runs first; default 0), and return_token_ids (response.h). Chat
// messages are normalized before the template as vLLM does (launch/openai/messages.h). Sampling semantics:
// runtime/engine/sampler.h, shared with the CLI. Choice i of prompt p has index p * n + i and seed
// seed + i (choice_requests).
// Structured output: response_format {"type": "json_object"} or {"type": "json_schema", "json_schema":
// {"schema": ...}}, or vLLM's guided_json (a schema), guided_regex, guided_choice (one of them):
// compiled once per distinct spec (runtime/engine/grammar.h says what is supported; an unsupported
// schema keyword is a 400 naming it); guided_grammar is refused.
// Metadata fields that change nothing are accepted: user, metadata, store (false), service_tier,
// stream_options. Chat: tools, tool_choice and parallel_tool_calls (launch/openai/tools.h). Known
// fields lattice does not implement (logit_bias, functions, function_call, suffix, audio,
// modalities, prediction) are refused naming the field, unless given their neutral value. Any other
// field is refused naming it (a misspelt "max_token" must not pass silently); a known field of the
// wrong type or out of range is an Error whose message names the field.
// Defaults: completions max_tokens 16 (OpenAI's); chat: the rest of the context (kRestOfContext to
// the engine client, runtime/engine/client.h, which owns the context budget). Temperature 1, top_p 1 (OpenAI's).
// Seed: random unless given (reported back by the caller).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "launch/openai/tools.h"
#include "runtime/engine/client.h"
#include "runtime/tokenizer/tokenizer.h"

namespace lattice::openai {

struct ApiLimits {
    int64_t vocab = 0;  // token ids of a prompt are checked against it
};

struct ApiRequest {
    static constexpr int64_t kMaxChoices = 128;  // prompts x best_of
    bool chat = false;
    std::string model;              // "" when absent
    ClientRequest client;  // to the engine client: the first prompt, limits, sampling, stop strings
    std::vector<std::vector<int32_t>> prompts;  // every prompt (prompts[0] == client.prompt)
    int64_t n = 1;                 // choices returned per prompt
    int64_t best_of = 1;           // sequences run per prompt (>= n)
    int32_t logprobs = -1;         // -1: none; k >= 0: each token's logprob and its k most likely (client.sampling.logprobs)
    bool echo = false;             // completions: the prompt's text (and logprobs) before the output
    int32_t prompt_logprobs = -1;  // vLLM's: -1 none; k >= 0: each prompt token's logprob, rank and k most likely
    bool stream = false;
    bool include_usage = false;
    bool seed_given = false;
    ToolUse tools;                 // chat: "tools" / "tool_choice" (launch/openai/tools.h)
};

// Throws Error naming the field at fault. `tok` may be null (a model without a tokenizer: prompts
// must then be token ids, and messages are refused).
ApiRequest parse_api_request(const nlohmann::json& body, bool chat, const Tokenizer* tok, const ApiLimits& limits);

// The engine requests of a parsed request, in choice order: prompt p's sequence i (of best_of) at
// p * best_of + i, with seed + i. Every sequence asks for 0 tokens when max_tokens is 0 (echo).
std::vector<ClientRequest> choice_requests(const ApiRequest& r);

// Whether the prompts are scored before they run (echo with logprobs, prompt_logprobs).
inline bool scores_prompt(const ApiRequest& r) {
    return (r.echo && r.logprobs >= 0) || r.prompt_logprobs >= 0;
}

// The body as JSON; Error when it is not JSON or nests deeper than `max_depth` (nlohmann's copy and
// destruction recurse, so depth is bounded before parsing, by base/json_limits.h).
nlohmann::json parse_body(std::string_view body, int max_depth = 64);

// Checks of a parsed request against the served model's context (max_model_len; <= 0: none): a
// prompt must leave room, and "max_tokens" more than the context leaves after the prompt is an
// Error naming max_tokens, the prompt's length and the context (vLLM's, never clamped).
void check_context(const ApiRequest& r, int64_t context);

// The "return_token_ids" extension (response.h): true or false; always true without a tokenizer.
bool parse_return_token_ids(const nlohmann::json& body, const Tokenizer* tok);

}  // namespace lattice::openai
