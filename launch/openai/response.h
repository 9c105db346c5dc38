// The response side of the OpenAI protocol, shared by `lattice serve` and `lattice batch`: the
// deltas a front collects from the engine client for one call, and the JSON they become.
// Choices: one per sequence of choice_requests (request.h), "index" p * n + i; with best_of > n
// the n of each prompt's best_of with the highest cumulative logprob, re-indexed. Logprobs in OpenAI's
// shapes: completions {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}] (the k most
// likely and the chosen token, as vLLM), "text_offset"}; chat {"content": [{"token", "logprob",
// "bytes", "top_logprobs": [{"token", "logprob", "bytes"}] (the k most likely)}]}; streamed chunks
// carry their own tokens' (a chunk is sent for every token when logprobs are asked, even while its
// text is held back). A token's string is the text it decodes to ("token_id:N" without a tokenizer);
// a logprob of -inf is written -9999.0 (JSON has no infinity). echo: the prompt's text before the
// choice's, and with logprobs the prompt's tokens and logprobs (the first null) before the generated
// ones', text_offset running on (OpenAI's legacy shape, vLLM's). vLLM's prompt_logprobs: completions put
// "prompt_logprobs" in each choice, chat at the top level: [null, {"ID": {"logprob", "rank",
// "decoded_token"}} (the prompt's token and its row's k most likely), ...]. usage carries
// "prompt_tokens_details": {"cached_tokens"} (prompt tokens the prefix cache served).
// Extension: "return_token_ids": true puts "token_ids" in each choice (and in each stream chunk);
// a model without a tokenizer always returns them (its text is empty).
// Chat with tools: the output is parsed for calls (runtime/tokenizer/tool_calls.h) into "tool_calls";
// streamed, each call's name first, then its arguments piece by piece (launch/openai/tool_stream.h).
// Error bodies: {"error": {"message", "type", "param", "code"}} as OpenAI writes them.
// Text that never forms UTF-8 is written with U+FFFD, never an exception.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "launch/openai/request.h"
#include "launch/openai/tool_stream.h"
#include "runtime/tokenizer/tokenizer.h"

namespace lattice::openai {

// What the engine side reports for one call, in order: kAccepted (admitted) then kTokens* (each for
// one choice, by `index`; a choice's last one carries its finish_reason), then exactly one kFinish
// (every choice ended: usage); or a single kError instead (refused, queue full, drain), also after
// some kTokens (a drain cut the request).
struct Delta {
    enum class Kind { kAccepted, kTokens, kFinish, kError };
    Kind kind = Kind::kTokens;
    int64_t index = 0;              // kTokens: the sequence (choice_requests order: prompt * best_of + i)
    bool echo = false;              // kTokens: the prompt itself (echo), its logprobs (first: NaN, no context)
    std::string text;               // kTokens: newly visible text (stop strings held back)
    std::vector<int32_t> tokens;    // kTokens: the new token ids
    std::vector<float> logprobs;    // kTokens: each token's log-softmax
    std::vector<std::vector<SampledToken>> top;  // kTokens, when logprobs are asked: each token's most likely
    std::vector<int64_t> ranks;     // kTokens of a prompt (echo): each token's rank in its row (prompt_logprobs)
    std::string finish_reason;      // kTokens: on a choice's last delta, "stop" | "length"
    int64_t prompt_tokens = 0;      // kAccepted, kFinish (every prompt once)
    int64_t completion_tokens = 0;  // kFinish (every sequence's)
    int64_t cached_tokens = 0;      // kFinish: prompt tokens the prefix cache served (each prompt once)
    int status = 0;                 // kError: HTTP status (400, 503 ...)
    std::string message;            // kError
    std::string error_param, error_code;  // kError: the OpenAI error's "param" and "code" when it names them
};

// The protocol's view of one engine client event (runtime/engine/client.h) of a running call:
// kTokens of choice ev.index with its new text, its token and logprob (and, when `top`, the most
// likely alternatives), and on the choice's last event its finish_reason ("stop" | "length"; a
// cancelled choice gets none: the front decides what a cut means).
Delta token_delta(const ClientEvent& ev, bool top);
// kFinish with the request's usage, for the event that ends the request (ev.last_of_request).
Delta finish_delta(const ClientEvent& ev);

// A completion request ready for the engine.
struct ApiCall {
    ApiRequest request;
    const Tokenizer* tokenizer = nullptr;  // for the logprobs' token strings and echo (null: ids)
    bool return_token_ids = false;
    std::string id;  // "cmpl-..." / "chatcmpl-..."
    int64_t created = 0;
    std::string model;
};

// {"error": {"message", "type", "param", "code"}}; `type` follows the status (401
// authentication_error, 404 not_found_error, 5xx server_error, else invalid_request_error).
std::string error_json(int status, std::string_view message, std::string_view param = {}, std::string_view code = {});
// The field an Error message names first ("\"max_tokens\" must be ..." -> max_tokens): a 400's "param".
std::string error_param(std::string_view message);
// JSON text as the responses write it (invalid UTF-8 replaced).
std::string json_text(const nlohmann::json& j);

// The response side of one call: OpenAI's JSON for its deltas. Streaming calls get server-sent
// events ("data: {chunk}\n\n", the last "data: [DONE]\n\n"); non-streaming calls get "" until
// finish() returns the whole response body (what `lattice batch` writes for a line).
class ResponseShaper {
public:
    explicit ResponseShaper(const ApiCall& call);
    bool streaming() const { return stream_; }
    std::string accepted();  // chat stream: the role chunk of each choice
    std::string tokens(const Delta& d);  // kTokens of one choice
    std::string finish(const Delta& d);  // kFinish: usage
    // A stream that cannot finish (drain deadline): an error event, then the stream ends.
    std::string stream_error(int status, std::string_view message);

private:
    struct Choice {
        std::string text;
        std::vector<int32_t> ids;
        std::vector<float> logprobs;
        std::vector<std::vector<SampledToken>> top;
        nlohmann::ordered_json prompt_lps;  // prompt_logprobs: the prompt's, in vLLM's shape (null: not asked)
        std::string finish;
        size_t offset = 0;  // completions' text_offset of the next token
        ToolCallStream tool_stream;  // chat with tools, streamed: the calls sent so far
        size_t sent = 0;             // chat with tools, streamed: tokens whose logprobs / ids were sent
        bool echoed = false;
        double sum = 0;  // cumulative logprob of the generated tokens (best_of)
    };
    nlohmann::ordered_json chunk_base() const;
    nlohmann::ordered_json logprobs_json(Choice& c, size_t from) const;
    std::string token_string(int32_t id) const;
    nlohmann::ordered_json tool_message(const Choice& c, int64_t index, nlohmann::ordered_json& finish,
                                        bool streamed) const;
    ToolCallOutput tool_calls_of(const Choice& c) const;
    std::string call_id_prefix(int64_t index) const;
    std::string tool_chunk(Choice& c, const Delta& d);
    std::string echo_text(Choice& c, int64_t index, const Delta& d);
    nlohmann::ordered_json prompt_logprobs_json(const Delta& d) const;
    static std::string event(const nlohmann::ordered_json& j);
    bool chat_, stream_, include_usage_, token_ids_;
    int32_t logprobs_, prompt_logprobs_;
    bool echo_;
    int64_t n_, best_of_;
    const Tokenizer* tok_;
    std::vector<std::string> prompt_texts_;  // echo: each prompt's text
    std::string id_, model_;
    int64_t created_;
    ToolUse tools_;  // chat with tools: outputs are parsed for calls
    std::vector<Choice> choices_;  // by sequence (prompt * best_of + i)
};

}  // namespace lattice::openai
