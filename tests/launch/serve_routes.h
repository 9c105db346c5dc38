// The harness of the tests that drive `lattice serve`'s routes without sockets or an engine
// (launch/server/api.h route(); test_serve_api.cpp, test_openai_clients.cpp, test_serve_lora.cpp): a served
// model with no weights, a request context serving it, one request through route(), and the check of an
// OpenAI error body. Header-only, doctest's assertions (it is included by doctest test files only).
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>

#include "launch/server/api.h"

namespace lattice::test {

// A served model without weights: its name (a request's "model" must match it), the vocab a prompt's token
// ids are checked against, its context (max_model_len), and its tokenizer (null: prompts must be token ids).
inline serve::ServedModel served_model(std::string name, int64_t vocab, int64_t context,
                                       const Tokenizer* tokenizer = nullptr) {
    serve::ServedModel m;
    m.name = std::move(name);
    m.tokenizer = tokenizer;
    m.limits = openai::ApiLimits{vocab};
    m.context = context;
    return m;
}

// A request context that serves `m` (no API key, not draining, no metrics): change what a test needs.
inline serve::RouteContext serving(const serve::ServedModel& m) {
    serve::RouteContext ctx;
    ctx.model = &m;
    return ctx;
}

// One request through the router: its method, path (with any query), body and Authorization header.
inline serve::Routed request(const serve::RouteContext& ctx, std::string_view method, std::string_view path,
                          std::string_view body = "", std::string_view auth = "") {
    return serve::route(serve::RouteInput{method, path, auth, body}, ctx);
}

inline serve::Routed get(const serve::RouteContext& ctx, std::string_view path, std::string_view auth = "") {
    return request(ctx, "GET", path, "", auth);
}

inline serve::Routed post(const serve::RouteContext& ctx, std::string_view path, std::string_view body,
                          std::string_view auth = "") {
    return request(ctx, "POST", path, body, auth);
}

// The reply is an OpenAI error body with this status (a non-empty message, a type, param and code present);
// returns its "error" object.
inline nlohmann::json expect_error(const serve::Routed& r, int status) {
    REQUIRE(r.reply.has_value());
    CHECK(r.reply->status == status);
    const nlohmann::json j = nlohmann::json::parse(r.reply->body);
    REQUIRE(j.contains("error"));
    const nlohmann::json& e = j["error"];
    CHECK(e["message"].is_string());
    CHECK(!e["message"].get<std::string>().empty());
    CHECK(e["type"].is_string());
    CHECK(e.contains("param"));
    CHECK(e.contains("code"));
    return e;
}

}  // namespace lattice::test
