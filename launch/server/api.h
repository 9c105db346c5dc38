// The OpenAI-compatible API of `lattice serve`, without sockets: which route a request hits, what
// is refused with which status, and the JSON of responses and stream chunks. The HTTP layer
// (http_server.cpp) moves bytes; this file decides what they say, so it is unit-tested and fuzzed
// on its own (tests/fuzz/fuzz_openai_request.cpp).
//
// Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /v1/models/{id},
// GET /health, GET /metrics. Checks, in order: unknown path 404; /v1/* without
// `Authorization: Bearer KEY` (when a key is set) 401, compared in constant time; wrong method 405
// (with Allow); model still loading 503; server draining 503; body not JSON (or nested deeper
// than 64) 400; "model" other than the served name 404 (absent is fine); any field error of
// parse_api_request 400 (its message, and the field as "param"). Queue-full 503 and engine
// refusals 400 come later, from the engine thread (launch/server/engine_loop.h).
// Error bodies: {"error": {"message", "type", "param", "code"}} as OpenAI writes them.
// Extension: "return_token_ids": true puts "token_ids" in each choice (and in each stream chunk);
// a model without a tokenizer always returns them (its text is empty).
// Checks of the body beyond the parser's: "max_tokens" more than the context leaves after the
// prompt is 400 naming max_tokens, the prompt's length and the context (vLLM's, never clamped).
// Choices: one per sequence of choice_requests (openai_request.h), "index" p * n + i; with best_of > n
// the n of each prompt's best_of with the highest cumulative logprob, re-indexed. Logprobs in OpenAI's
// shapes: completions {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}] (the k most
// likely and the chosen token, as vLLM), "text_offset"}; chat {"content": [{"token", "logprob",
// "bytes", "top_logprobs": [{"token", "logprob", "bytes"}] (the k most likely)}]}; streamed chunks
// carry their own tokens' (a chunk is sent for every token when logprobs are asked, even while its
// text is held back). A token's string is the text it decodes to ("token_id:N" without a tokenizer);
// a logprob of -inf is written -9999.0 (JSON has no infinity). echo: the prompt's text before the
// choice's (with max_tokens 0: the prompt's tokens and logprobs, the first null, as OpenAI).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "launch/openai_request.h"
#include "launch/server/exchange.h"
#include "launch/server/metrics.h"
#include "runtime/tokenizer/tokenizer.h"

namespace lattice::serve {

// What the routes know about the model once it is loaded on every rank.
struct ServedModel {
    std::string name;                      // must match the request's "model"
    const Tokenizer* tokenizer = nullptr;  // null: prompts must be token ids
    ApiLimits limits;
    int64_t context = 0;  // positions per sequence, prompt and output (max_model_len)
    int64_t created = 0;  // unix time the server became ready
};

// A response decided without the engine.
struct Reply {
    int status = 200;
    std::string content_type = "application/json";
    std::string body;
    std::vector<std::pair<std::string, std::string>> headers;
};

// {"error": {...}} with `status`; `type` defaults from the status.
Reply error_reply(int status, std::string_view message, std::string_view param = {}, std::string_view code = {});
std::string error_json(int status, std::string_view message, std::string_view param = {}, std::string_view code = {});

// The body as JSON; Error when it is not JSON or nests deeper than `max_depth` (nlohmann's copy and
// destruction recurse, so depth is bounded before parsing, by base/json_limits.h).
nlohmann::json parse_body(std::string_view body, int max_depth = 64);

// A completion request ready for the engine.
struct ApiCall {
    ApiRequest request;
    const Tokenizer* tokenizer = nullptr;  // for the logprobs' token strings and echo (null: ids)
    bool return_token_ids = false;
    std::string id;  // "cmpl-..." / "chatcmpl-..."
    int64_t created = 0;
    std::string model;
};

struct RouteInput {
    std::string_view method;  // "GET", "POST" ...
    std::string_view target;  // path and query
    std::string_view authorization;
    std::string_view body;
};

struct RouteContext {
    std::string_view api_key;            // "" : no key required
    const ServedModel* model = nullptr;  // null while loading
    bool draining = false;
    const Metrics* metrics = nullptr;
    uint64_t request_number = 0;  // makes the response id
};

struct Routed {
    std::string route;            // metrics label: the path for known routes, else "other"
    std::optional<Reply> reply;   // answered here
    std::optional<ApiCall> call;  // or: run it
};

Routed route(const RouteInput& in, const RouteContext& ctx);

// Constant-time for equal lengths; the time depends only on the expected key's length otherwise.
bool keys_equal(std::string_view given, std::string_view expected);

// The response side of one call: OpenAI's JSON for the deltas of the engine thread (exchange.h).
// Streaming calls get server-sent events ("data: {chunk}\n\n", the last "data: [DONE]\n\n");
// non-streaming calls get "" until finish() returns the whole response body. Also the body builder
// of other fronts (lattice batch): feed it the Deltas of a call, take finish()'s body.
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
        std::string finish;
        size_t offset = 0;  // completions' text_offset of the next token
        bool echoed = false;
        double sum = 0;  // cumulative logprob of the generated tokens (best_of)
    };
    nlohmann::ordered_json chunk_base() const;
    nlohmann::ordered_json logprobs_json(Choice& c, size_t from) const;
    std::string token_string(int32_t id) const;
    nlohmann::ordered_json tool_message(const Choice& c, int64_t index, nlohmann::ordered_json& finish,
                                        bool streamed) const;
    std::string echo_text(Choice& c, int64_t index, const Delta& d);
    static std::string event(const nlohmann::ordered_json& j);
    bool chat_, stream_, include_usage_, token_ids_;
    int32_t logprobs_;
    bool echo_;
    int64_t n_, best_of_;
    const Tokenizer* tok_;
    std::vector<std::string> prompt_texts_;  // echo: each prompt's text
    std::string id_, model_;
    int64_t created_;
    ToolUse tools_;  // chat with tools: outputs are parsed for calls
    std::vector<Choice> choices_;  // by sequence (prompt * best_of + i)
};

}  // namespace lattice::serve
