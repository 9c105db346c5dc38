// The HTTP routes of `lattice serve`'s OpenAI-compatible API, without sockets: which route a request
// hits, what is refused with which status, and the replies decided without the engine. The HTTP
// layer (http_server.cpp) moves bytes; the protocol (request parsing and checks, response JSON)
// is launch/openai/, shared with `lattice batch`; this file is unit-tested and fuzzed on its own
// (tests/fuzz/fuzz_serve_request.cpp).
//
// Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /v1/models/{id},
// GET /health, GET /metrics, POST /v1/load_lora_adapter, POST /v1/unload_lora_adapter (lora_catalog.h;
// /v1/models lists the adapters with "parent": the base; a request's "model" may name one), and vLLM's POST
// /tokenize, POST /detokenize, GET /tokenizer_info, GET /version (launch/openai/tokenize.h; like vLLM's, outside
// /v1 and so without the API key). Checks, in order: unknown path 404; /v1/* without `Authorization: Bearer KEY`
// (when a key is set) 401, compared in constant time; wrong method 405 (with Allow); model still loading 503; server
// draining 503; body not JSON (or nested deeper than 64) 400; then openai/call.h prepare_call (shared with `lattice
// batch`): "model" other than the served name or an adapter's 404 (absent is fine); any field error of
// parse_api_request 400 (its message, and the field as "param"); the prompt and max_tokens against the context
// (check_context) 400. No error body names a server path (the tokenizer's file is written as the served name).
// Queue-full 503 and engine refusals 400 come later, from the engine thread (launch/server/engine_loop.h). Error
// bodies: openai/response.h error_json; a 401 also carries WWW-Authenticate: Bearer.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "launch/openai/request.h"
#include "launch/server/lora_catalog.h"
#include "launch/openai/response.h"
#include "launch/server/metrics.h"
#include "runtime/tokenizer/tokenizer.h"

namespace lattice::serve {

// What the routes know about the model once it is loaded on every rank.
struct ServedModel {
    std::string name;                      // must match the request's "model"
    const Tokenizer* tokenizer = nullptr;  // null: prompts must be token ids
    openai::ApiLimits limits;
    int64_t context = 0;  // positions per sequence, prompt and output (max_model_len)
    int64_t created = 0;  // unix time the server became ready
    LoraCatalog* loras = nullptr;  // LoRA adapters: names a request's "model" may give (null: none)
};

// A response decided without the engine.
struct Reply {
    int status = 200;
    std::string content_type = "application/json";
    std::string body;
    std::vector<std::pair<std::string, std::string>> headers;
};

// {"error": {...}} with `status` (openai/response.h error_json).
Reply error_reply(int status, std::string_view message, std::string_view param = {}, std::string_view code = {});

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
    std::optional<openai::ApiCall> call;  // or: run it
};

Routed route(const RouteInput& in, const RouteContext& ctx);

// Constant-time for equal lengths; the time depends only on the expected key's length otherwise.
bool keys_equal(std::string_view given, std::string_view expected);

}  // namespace lattice::serve
