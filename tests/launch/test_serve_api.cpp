// The OpenAI API layer of `lattice serve` without sockets or a model (launch/server/api.h,
// metrics.h): routing and its refusals in order, error bodies, the response and chunk shapes,
// the depth guard, the constant-time key compare and the Prometheus text.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "base/error.h"
#include "launch/server/api.h"
#include "launch/server/metrics.h"

using lattice::serve::ApiCall;
using lattice::serve::Metrics;
using lattice::serve::ResponseShaper;
using lattice::serve::RouteContext;
using lattice::serve::Routed;
using lattice::serve::RouteInput;
using lattice::serve::ServedModel;
using nlohmann::json;

namespace {

ServedModel tiny_model() {
    ServedModel m;
    m.name = "tiny";
    m.limits = {320};  // no tokenizer: prompts are token ids
    m.context = 64;
    m.created = 1700000000;
    return m;
}

Routed post(const std::string& path, const std::string& body, const RouteContext& ctx, const std::string& auth = "") {
    return lattice::serve::route(RouteInput{"POST", path, auth, body}, ctx);
}

// The reply is an OpenAI error body with this status; returns its "error" object.
json expect_error(const Routed& r, int status) {
    REQUIRE(r.reply.has_value());
    CHECK(r.reply->status == status);
    const json j = json::parse(r.reply->body);
    REQUIRE(j.contains("error"));
    const json& e = j["error"];
    CHECK(e["message"].is_string());
    CHECK(!e["message"].get<std::string>().empty());
    CHECK(e["type"].is_string());
    CHECK(e.contains("param"));
    CHECK(e.contains("code"));
    return e;
}

}  // namespace

TEST_CASE("routes refuse, in order, what they must") {
    const ServedModel m = tiny_model();
    Metrics metrics;
    RouteContext ctx;
    ctx.model = &m;
    ctx.metrics = &metrics;

    SUBCASE("unknown path 404, wrong method 405 with Allow") {
        expect_error(lattice::serve::route({"GET", "/nope", "", ""}, ctx), 404);
        const Routed r = lattice::serve::route({"GET", "/v1/completions", "", ""}, ctx);
        expect_error(r, 405);
        CHECK(r.reply->headers.size() == 1);
        CHECK(r.reply->headers[0] == std::pair<std::string, std::string>{"Allow", "POST"});
        expect_error(lattice::serve::route({"POST", "/health", "", ""}, ctx), 405);
    }
    SUBCASE("API key: every /v1 route, constant-time compare, not /health or /metrics") {
        ctx.api_key = "sekrit-key";
        const std::string body = R"({"prompt": [1, 2, 3]})";
        const json e = expect_error(post("/v1/completions", body, ctx), 401);
        CHECK(e["code"] == "invalid_api_key");
        expect_error(post("/v1/completions", body, ctx, "Bearer sekrit-kez"), 401);
        expect_error(post("/v1/completions", body, ctx, "Bearer sekrit-key2"), 401);
        expect_error(post("/v1/completions", body, ctx, "sekrit-key"), 401);
        expect_error(lattice::serve::route({"GET", "/v1/models", "", ""}, ctx), 401);
        expect_error(lattice::serve::route({"GET", "/v1/whatever", "", ""}, ctx), 401);  // before 404
        CHECK(post("/v1/completions", body, ctx, "Bearer sekrit-key").call.has_value());
        CHECK(lattice::serve::route({"GET", "/health", "", ""}, ctx).reply->status == 200);
        CHECK(lattice::serve::route({"GET", "/metrics", "", ""}, ctx).reply->status == 200);
    }
    SUBCASE("loading: /health 503, /v1 503; draining: completions 503, models still listed") {
        RouteContext loading = ctx;
        loading.model = nullptr;
        CHECK(lattice::serve::route({"GET", "/health", "", ""}, loading).reply->status == 503);
        expect_error(post("/v1/completions", R"({"prompt": [1]})", loading), 503);
        RouteContext draining = ctx;
        draining.draining = true;
        expect_error(post("/v1/chat/completions", R"({"messages": []})", draining), 503);
        CHECK(lattice::serve::route({"GET", "/v1/models", "", ""}, draining).reply->status == 200);
    }
    SUBCASE("bodies: malformed JSON, deep nesting, wrong types, empty messages") {
        CHECK(expect_error(post("/v1/completions", "{\"prompt\": [1, 2", ctx), 400)["message"] ==
              "the body is not valid JSON");
        expect_error(post("/v1/completions", std::string(100000, '[') + std::string(100000, ']'), ctx), 400);
        expect_error(post("/v1/completions", "[1, 2]", ctx), 400);
        CHECK(expect_error(post("/v1/completions", R"({"prompt": [1], "max_tokens": "8"})", ctx), 400)["param"] ==
              "max_tokens");
        CHECK(expect_error(post("/v1/completions", R"({"prompt": [1], "temperature": -1})", ctx), 400)["param"] ==
              "temperature");
        CHECK(expect_error(post("/v1/completions", R"({"prompt": [1, 999]})", ctx), 400)["param"] == "prompt");
        CHECK(expect_error(post("/v1/completions", R"({"prompt": [1], "return_token_ids": 1})", ctx), 400)["param"] ==
              "return_token_ids");
        CHECK(expect_error(post("/v1/chat/completions", R"({"messages": []})", ctx), 400)["param"] == "messages");
        json long_prompt = {{"prompt", json::array()}};
        for (int i = 0; i < 64; ++i) long_prompt["prompt"].push_back(1);
        // The context budget is the engine client's: a 400 from the engine thread (launch_serve checks it).
        CHECK(post("/v1/completions", long_prompt.dump(), ctx).call.has_value());
        expect_error(post("/v1/completions", R"({"prompt": "text needs a tokenizer"})", ctx), 400);
    }
    SUBCASE("model: another name 404, the served name or none accepted") {
        const json e = expect_error(post("/v1/completions", R"({"model": "gpt-4", "prompt": [1]})", ctx), 404);
        CHECK(e["code"] == "model_not_found");
        CHECK(e["param"] == "model");
        CHECK(post("/v1/completions", R"({"model": "tiny", "prompt": [1]})", ctx).call.has_value());
        CHECK(post("/v1/completions", R"({"prompt": [1]})", ctx).call.has_value());
        expect_error(lattice::serve::route({"GET", "/v1/models/gpt-4", "", ""}, ctx), 404);
        const Routed card = lattice::serve::route({"GET", "/v1/models/tiny", "", ""}, ctx);
        CHECK(json::parse(card.reply->body)["id"] == "tiny");
        const json list = json::parse(lattice::serve::route({"GET", "/v1/models?x=1", "", ""}, ctx).reply->body);
        CHECK(list["object"] == "list");
        CHECK(list["data"][0]["id"] == "tiny");
        CHECK(list["data"][0]["max_model_len"] == 64);
    }
    SUBCASE("a good request becomes a call with its fields") {
        ctx.request_number = 7;
        const Routed r = post("/v1/completions", R"({"prompt": [5, 6], "max_tokens": 3, "stream": true,
            "stream_options": {"include_usage": true}, "temperature": 0})",
                              ctx);
        REQUIRE(r.call.has_value());
        CHECK(r.route == "/v1/completions");
        CHECK(r.call->id == "cmpl-0000000000000007");
        CHECK(r.call->return_token_ids);  // no tokenizer: ids always
        CHECK(r.call->request.stream);
        CHECK(r.call->request.include_usage);
        CHECK(r.call->request.client.prompt == std::vector<int32_t>{5, 6});
        CHECK(r.call->request.client.max_tokens == 3);
    }
}

TEST_CASE("response shapes follow OpenAI's") {
    ApiCall call;
    call.id = "cmpl-1";
    call.model = "tiny";
    call.created = 5;
    SUBCASE("completion, not streamed: one body with text, token ids and usage") {
        call.return_token_ids = true;
        ResponseShaper s(call);
        CHECK(s.accepted().empty());
        CHECK(s.tokens("Hel", {1}).empty());
        CHECK(s.tokens("lo", {2}).empty());
        const json j = json::parse(s.finish("length", 4, 2));
        CHECK(j["object"] == "text_completion");
        CHECK(j["id"] == "cmpl-1");
        CHECK(j["model"] == "tiny");
        CHECK(j["choices"][0]["text"] == "Hello");
        CHECK(j["choices"][0]["token_ids"] == json::array({1, 2}));
        CHECK(j["choices"][0]["finish_reason"] == "length");
        CHECK(j["usage"] == json{{"prompt_tokens", 4}, {"completion_tokens", 2}, {"total_tokens", 6}});
    }
    SUBCASE("chat, streamed with usage: role chunk, content chunks, finish chunk, usage chunk, [DONE]") {
        call.request.chat = true;
        call.request.stream = true;
        call.request.include_usage = true;
        ResponseShaper s(call);
        auto data = [](const std::string& ev) {
            REQUIRE(ev.starts_with("data: "));
            REQUIRE(ev.ends_with("\n\n"));
            return json::parse(ev.substr(6, ev.size() - 8));
        };
        const json role = data(s.accepted());
        CHECK(role["object"] == "chat.completion.chunk");
        CHECK(role["choices"][0]["delta"]["role"] == "assistant");
        CHECK(role["usage"].is_null());
        CHECK(s.tokens("", {9}).empty());  // nothing visible and no ids asked for: no chunk
        const json c = data(s.tokens("Hi", {3}));
        CHECK(c["choices"][0]["delta"]["content"] == "Hi");
        CHECK(c["choices"][0]["finish_reason"].is_null());
        CHECK(!c["choices"][0].contains("token_ids"));
        const std::string tail = s.finish("stop", 3, 2);
        const size_t a = tail.find("\n\n"), b = tail.find("\n\n", a + 2);
        const json fin = data(tail.substr(0, a + 2));
        CHECK(fin["choices"][0]["finish_reason"] == "stop");
        CHECK(fin["choices"][0]["delta"] == json::object());
        const json usage = data(tail.substr(a + 2, b - a));
        CHECK(usage["choices"] == json::array());
        CHECK(usage["usage"]["total_tokens"] == 5);
        CHECK(tail.substr(b + 2) == "data: [DONE]\n\n");
    }
    SUBCASE("invalid UTF-8 in generated text is replaced, not an exception") {
        ResponseShaper s(call);
        s.tokens(std::string("\xff\xfe", 2), {1});
        const json j = json::parse(s.finish("stop", 1, 1));
        CHECK(j["choices"][0]["text"] == "\xEF\xBF\xBD\xEF\xBF\xBD");
    }
}

TEST_CASE("parse_body bounds nesting; keys_equal") {
    CHECK(lattice::serve::parse_body(R"({"a": [[1]], "s": "[[[[[[["})", 3)["a"][0][0] == 1);
    CHECK_THROWS_AS(lattice::serve::parse_body("[[[[1]]]]", 3), lattice::Error);
    CHECK_THROWS_AS(lattice::serve::parse_body("", 3), lattice::Error);
    CHECK(lattice::serve::keys_equal("abc", "abc"));
    CHECK(!lattice::serve::keys_equal("abd", "abc"));
    CHECK(!lattice::serve::keys_equal("ab", "abc"));
    CHECK(!lattice::serve::keys_equal("abcd", "abc"));
    CHECK(!lattice::serve::keys_equal("", "abc"));
}

TEST_CASE("metrics render Prometheus text, vLLM's names under lattice: with the model_name label") {
    Metrics m;
    m.set_model("smol \"x\"", 300);
    m.count_response("/v1/completions", 200);
    m.count_response("/v1/completions", 200);
    m.count_response("other", 404);
    m.observe_ttft(0.03);
    m.observe_ttft(100);
    m.set_engine({.running = 2, .waiting = 1, .blocks_used = 5, .blocks_total = 20, .prompt_tokens = 40,
                  .cached_tokens = 16});
    m.observe_finished("stop", 1.2, 30, 7);
    m.observe_finished("length", 3, 250, 50);
    m.count_finish("cancelled");
    const std::string t = m.render();
    auto has = [&](const std::string& line) {
        INFO(line);
        CHECK(t.find(line) != std::string::npos);
    };
    const std::string L = "model_name=\"smol \\\"x\\\"\"";
    has("lattice_http_requests_total{route=\"/v1/completions\",code=\"200\"} 2\n");
    has("lattice_http_requests_total{route=\"other\",code=\"404\"} 1\n");
    has("# TYPE lattice:num_requests_running gauge\nlattice:num_requests_running{" + L + "} 2\n");
    has("lattice:num_requests_waiting{" + L + "} 1\n");
    has("lattice:kv_cache_usage_perc{" + L + "} 0.25\n");
    has("# TYPE lattice:prefix_cache_queries_total counter\nlattice:prefix_cache_queries_total{" + L + "} 40\n");
    has("lattice:prefix_cache_hits_total{" + L + "} 16\n");
    has("lattice_kv_blocks_used 5\n");
    has("lattice_kv_blocks_total 20\n");
    has("lattice:request_success_total{" + L + ",finished_reason=\"stop\"} 1\n");
    has("lattice:request_success_total{" + L + ",finished_reason=\"length\"} 1\n");
    has("lattice:request_success_total{" + L + ",finished_reason=\"abort\"} 1\n");
    has("lattice:time_to_first_token_seconds_bucket{" + L + ",le=\"0.02\"} 0\n");
    has("lattice:time_to_first_token_seconds_bucket{" + L + ",le=\"0.04\"} 1\n");
    has("lattice:time_to_first_token_seconds_bucket{" + L + ",le=\"+Inf\"} 2\n");
    has("lattice:time_to_first_token_seconds_count{" + L + "} 2\n");
    has("# TYPE lattice:inter_token_latency_seconds histogram\n");
    has("lattice:e2e_request_latency_seconds_bucket{" + L + ",le=\"1.5\"} 1\n");
    has("lattice:e2e_request_latency_seconds_sum{" + L + "} 4.2\n");
    // Token-count buckets in 1-2-5 steps up to the context (300): ... 100, 200, 500.
    has("lattice:request_prompt_tokens_bucket{" + L + ",le=\"50\"} 1\n");
    has("lattice:request_prompt_tokens_bucket{" + L + ",le=\"500\"} 2\n");
    CHECK(t.find("le=\"1000\"") == std::string::npos);
    has("lattice:request_generation_tokens_bucket{" + L + ",le=\"10\"} 1\n");
    has("lattice:request_generation_tokens_count{" + L + "} 2\n");
}
