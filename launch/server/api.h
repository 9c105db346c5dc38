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
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "launch/openai_request.h"
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

// The response side of one call: OpenAI's JSON for the deltas of the engine thread.
// Streaming calls get server-sent events ("data: {chunk}\n\n", the last "data: [DONE]\n\n");
// non-streaming calls get "" until finish() returns the whole response body.
class ResponseShaper {
public:
    explicit ResponseShaper(const ApiCall& call);
    bool streaming() const { return stream_; }
    std::string accepted();  // chat stream: the role chunk
    std::string tokens(const std::string& text, const std::vector<int32_t>& ids);
    std::string finish(const std::string& reason, int64_t prompt_tokens, int64_t completion_tokens);
    // A stream that cannot finish (drain deadline): an error event, then the stream ends.
    std::string stream_error(int status, std::string_view message);

private:
    nlohmann::json chunk_base() const;
    static std::string event(const nlohmann::json& j);
    bool chat_, stream_, include_usage_, token_ids_;
    std::string id_, model_;
    int64_t created_;
    std::string text_;
    std::vector<int32_t> ids_;
};

}  // namespace lattice::serve
