// The OpenAI API layer of `lattice serve` without sockets or a model: the routes (launch/server/
// api.h, metrics.h) and the protocol they answer with (launch/openai/): routing and its refusals in
// order, error bodies, the response and chunk shapes, the depth guard, the constant-time key compare
// and the Prometheus text; the request parser's choices (n, best_of, prompt lists, logprobs, echo)
// and the shapes of logprobs, several choices and best_of's pick; max_tokens beyond the context;
// /health while draining.
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/error.h"
#include "launch/server/api.h"
#include "launch/server/metrics.h"
#include "launch/openai/tools.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/launch/serve_routes.h"

using lattice::SampledToken;
using lattice::openai::ApiCall;
using lattice::openai::Delta;
using lattice::openai::ResponseShaper;
using lattice::serve::Metrics;
using lattice::serve::RouteContext;
using lattice::serve::Routed;
using lattice::serve::ServedModel;
using lattice::test::expect_error;
using lattice::test::get;
using lattice::test::post;
using nlohmann::json;

namespace {

// A kTokens delta of choice `index`: text, ids, their logprobs (and top alternatives when given).
Delta tokens(const std::string& text, std::vector<int32_t> ids, int64_t index = 0, std::vector<float> lps = {},
             std::vector<std::vector<SampledToken>> top = {}, std::string finish = "") {
    Delta d;
    d.index = index;
    d.text = text;
    if (lps.empty()) lps.assign(ids.size(), -0.5f);
    d.tokens = std::move(ids);
    d.logprobs = std::move(lps);
    d.top = std::move(top);
    d.finish_reason = std::move(finish);
    return d;
}

Delta finish(int64_t prompt_tokens, int64_t completion_tokens) {
    Delta d;
    d.kind = Delta::Kind::kFinish;
    d.prompt_tokens = prompt_tokens;
    d.completion_tokens = completion_tokens;
    return d;
}

json data(const std::string& ev) {
    REQUIRE(ev.starts_with("data: "));
    REQUIRE(ev.ends_with("\n\n"));
    return json::parse(ev.substr(6, ev.size() - 8));
}

ServedModel tiny_model() {
    ServedModel m = lattice::test::served_model("tiny", 320, 64);  // no tokenizer: prompts are token ids
    m.created = 1700000000;
    return m;
}

}  // namespace

TEST_CASE("routes refuse, in order, what they must") {
    const ServedModel m = tiny_model();
    Metrics metrics;
    RouteContext ctx = lattice::test::serving(m);
    ctx.metrics = &metrics;

    SUBCASE("unknown path 404, wrong method 405 with Allow") {
        expect_error(get(ctx, "/nope"), 404);
        const Routed r = get(ctx, "/v1/completions");
        expect_error(r, 405);
        CHECK(r.reply->headers.size() == 1);
        CHECK(r.reply->headers[0] == std::pair<std::string, std::string>{"Allow", "POST"});
        expect_error(post(ctx, "/health", ""), 405);
    }
    SUBCASE("API key: every /v1 route, constant-time compare, not /health or /metrics") {
        ctx.api_key = "sekrit-key";
        const std::string body = R"({"prompt": [1, 2, 3]})";
        const json e = expect_error(post(ctx, "/v1/completions", body), 401);
        CHECK(e["code"] == "invalid_api_key");
        expect_error(post(ctx, "/v1/completions", body, "Bearer sekrit-kez"), 401);
        expect_error(post(ctx, "/v1/completions", body, "Bearer sekrit-key2"), 401);
        expect_error(post(ctx, "/v1/completions", body, "sekrit-key"), 401);
        expect_error(get(ctx, "/v1/models"), 401);
        expect_error(get(ctx, "/v1/whatever"), 401);  // before 404
        CHECK(post(ctx, "/v1/completions", body, "Bearer sekrit-key").call.has_value());
        CHECK(get(ctx, "/health").reply->status == 200);
        CHECK(get(ctx, "/metrics").reply->status == 200);
    }
    SUBCASE("loading: /health 503, /v1 503; draining: completions 503, models still listed") {
        RouteContext loading = ctx;
        loading.model = nullptr;
        CHECK(get(loading, "/health").reply->status == 503);
        expect_error(post(loading, "/v1/completions", R"({"prompt": [1]})"), 503);
        RouteContext draining = ctx;
        draining.draining = true;
        expect_error(post(draining, "/v1/chat/completions", R"({"messages": []})"), 503);
        CHECK(get(draining, "/v1/models").reply->status == 200);
    }
    SUBCASE("bodies: malformed JSON, deep nesting, wrong types, empty messages") {
        CHECK(expect_error(post(ctx, "/v1/completions", "{\"prompt\": [1, 2"), 400)["message"] ==
              "the body is not valid JSON");
        expect_error(post(ctx, "/v1/completions", std::string(100000, '[') + std::string(100000, ']')), 400);
        expect_error(post(ctx, "/v1/completions", "[1, 2]"), 400);
        CHECK(expect_error(post(ctx, "/v1/completions", R"({"prompt": [1], "max_tokens": "8"})"), 400)["param"] ==
              "max_tokens");
        CHECK(expect_error(post(ctx, "/v1/completions", R"({"prompt": [1], "temperature": -1})"), 400)["param"] ==
              "temperature");
        CHECK(expect_error(post(ctx, "/v1/completions", R"({"prompt": [1, 999]})"), 400)["param"] == "prompt");
        CHECK(expect_error(post(ctx, "/v1/completions", R"({"prompt": [1], "return_token_ids": 1})"), 400)["param"] ==
              "return_token_ids");
        CHECK(expect_error(post(ctx, "/v1/chat/completions", R"({"messages": []})"), 400)["param"] == "messages");
        json long_prompt = {{"prompt", json::array()}};
        for (int i = 0; i < 64; ++i) long_prompt["prompt"].push_back(1);
        // A prompt that fills the context: 400 here, naming the prompt (the context is ServedModel's).
        CHECK(expect_error(post(ctx, "/v1/completions", long_prompt.dump()), 400)["param"] == "prompt");
        expect_error(post(ctx, "/v1/completions", R"({"prompt": "text needs a tokenizer"})"), 400);
    }
    SUBCASE("min_tokens above max_tokens: 400 naming both (vLLM's rule); equal is fine") {
        const json e =
            expect_error(post(ctx, "/v1/completions", R"({"prompt": [1], "max_tokens": 4, "min_tokens": 5})"), 400);
        CHECK(e["param"] == "min_tokens");
        CHECK(e["message"].get<std::string>().find("(5)") != std::string::npos);
        CHECK(e["message"].get<std::string>().find("(4)") != std::string::npos);
        CHECK(post(ctx, "/v1/completions", R"({"prompt": [1], "max_tokens": 4, "min_tokens": 4})").call.has_value());
    }
    SUBCASE("max_tokens beyond the context's room: 400 naming max_tokens, the prompt and the context") {
        json b = {{"prompt", json::array()}, {"max_tokens", 5}};
        for (int i = 0; i < 60; ++i) b["prompt"].push_back(1);
        const json e = expect_error(post(ctx, "/v1/completions", b.dump()), 400);
        CHECK(e["param"] == "max_tokens");
        CHECK(e["message"].get<std::string>().find("60 tokens") != std::string::npos);
        CHECK(e["message"].get<std::string>().find("64") != std::string::npos);
        b["max_tokens"] = 4;  // exactly the room
        CHECK(post(ctx, "/v1/completions", b.dump()).call.has_value());
        b["prompt"].push_back(1);  // a list of prompts: the longest one counts
        b["prompt"] = json::array({json::array({1, 2}), b["prompt"]});
        expect_error(post(ctx, "/v1/completions", b.dump()), 400);
    }
    SUBCASE("/health: 200 when ready, 503 with Retry-After while draining") {
        RouteContext draining = ctx;
        draining.draining = true;
        const Routed h = get(draining, "/health");
        CHECK(h.reply->status == 503);
        CHECK(json::parse(h.reply->body)["status"] == "draining");
        CHECK(h.reply->headers.size() == 1);
        CHECK(get(ctx, "/health").reply->status == 200);
    }
    SUBCASE("model: another name 404, the served name or none accepted") {
        const json e = expect_error(post(ctx, "/v1/completions", R"({"model": "gpt-4", "prompt": [1]})"), 404);
        CHECK(e["code"] == "model_not_found");
        CHECK(e["param"] == "model");
        CHECK(post(ctx, "/v1/completions", R"({"model": "tiny", "prompt": [1]})").call.has_value());
        CHECK(post(ctx, "/v1/completions", R"({"prompt": [1]})").call.has_value());
        expect_error(get(ctx, "/v1/models/gpt-4"), 404);
        const Routed card = get(ctx, "/v1/models/tiny");
        CHECK(json::parse(card.reply->body)["id"] == "tiny");
        const json list = json::parse(get(ctx, "/v1/models?x=1").reply->body);
        CHECK(list["object"] == "list");
        CHECK(list["data"][0]["id"] == "tiny");
        CHECK(list["data"][0]["max_model_len"] == 64);
    }
    SUBCASE("a good request becomes a call with its fields") {
        ctx.request_number = 7;
        const Routed r = post(ctx, "/v1/completions", R"({"prompt": [5, 6], "max_tokens": 3, "stream": true,
            "stream_options": {"include_usage": true}, "temperature": 0})");
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
        CHECK(s.tokens(tokens("Hel", {1})).empty());
        CHECK(s.tokens(tokens("lo", {2}, 0, {}, {}, "length")).empty());
        const json j = json::parse(s.finish(finish(4, 2)));
        CHECK(j["object"] == "text_completion");
        CHECK(j["id"] == "cmpl-1");
        CHECK(j["model"] == "tiny");
        CHECK(j["choices"][0]["text"] == "Hello");
        CHECK(j["choices"][0]["token_ids"] == json::array({1, 2}));
        CHECK(j["choices"][0]["finish_reason"] == "length");
        CHECK(j["usage"] == json{{"prompt_tokens", 4},
                                 {"completion_tokens", 2},
                                 {"total_tokens", 6},
                                 {"prompt_tokens_details", {{"cached_tokens", 0}}}});
    }
    SUBCASE("chat, streamed with usage: role chunk, content chunks, finish chunk, usage chunk, [DONE]") {
        call.request.chat = true;
        call.request.stream = true;
        call.request.include_usage = true;
        ResponseShaper s(call);
        const json role = data(s.accepted());
        CHECK(role["object"] == "chat.completion.chunk");
        CHECK(role["choices"][0]["delta"]["role"] == "assistant");
        CHECK(role["usage"].is_null());
        CHECK(s.tokens(tokens("", {9})).empty());  // nothing visible and no ids asked for: no chunk
        const json c = data(s.tokens(tokens("Hi", {3})));
        CHECK(c["choices"][0]["delta"]["content"] == "Hi");
        CHECK(c["choices"][0]["finish_reason"].is_null());
        CHECK(c["choices"][0]["logprobs"].is_null());
        CHECK(!c["choices"][0].contains("token_ids"));
        const json fin = data(s.tokens(tokens("", {}, 0, {}, {}, "stop")));
        CHECK(fin["choices"][0]["finish_reason"] == "stop");
        CHECK(fin["choices"][0]["delta"] == json::object());
        const std::string tail = s.finish(finish(3, 2));
        const size_t b = tail.find("\n\n");
        const json usage = data(tail.substr(0, b + 2));
        CHECK(usage["choices"] == json::array());
        CHECK(usage["usage"]["total_tokens"] == 5);
        CHECK(tail.substr(b + 2) == "data: [DONE]\n\n");
    }
    SUBCASE("invalid UTF-8 in generated text is replaced, not an exception") {
        ResponseShaper s(call);
        s.tokens(tokens(std::string("\xff\xfe", 2), {1}, 0, {}, {}, "stop"));
        const json j = json::parse(s.finish(finish(1, 1)));
        CHECK(j["choices"][0]["text"] == "\xEF\xBF\xBD\xEF\xBF\xBD");
    }
}

TEST_CASE("choices: n, best_of, lists of prompts, logprobs and echo parsed; seeds seed + i") {
    const ServedModel m = tiny_model();
    const RouteContext ctx = lattice::test::serving(m);
    auto call = [&](const std::string& path, const std::string& body) {
        const Routed r = post(ctx, path, body);
        REQUIRE_MESSAGE(r.call.has_value(), (r.reply ? r.reply->body : ""));
        return r.call->request;
    };
    const lattice::openai::ApiRequest r =
        call("/v1/completions", R"({"prompt": [[1, 2], [3], [4, 5, 6]], "n": 2, "seed": 10, "logprobs": 3})");
    REQUIRE(r.prompts.size() == 3);
    CHECK(r.prompts[2] == std::vector<int32_t>{4, 5, 6});
    CHECK(r.n == 2);
    CHECK(r.best_of == 2);
    CHECK(r.logprobs == 3);
    const std::vector<lattice::ClientRequest> q = lattice::openai::choice_requests(r);
    REQUIRE(q.size() == 6);
    CHECK(q[3].prompt == std::vector<int32_t>{3});  // prompt 1, sequence 1
    CHECK(q[3].sampling.seed == 11);
    CHECK(q[4].sampling.seed == 10);
    CHECK(q[5].sampling.logprobs == 3);
    CHECK(call("/v1/completions", R"({"prompt": [1], "echo": true, "max_tokens": 0, "logprobs": 0})").echo);
    // Refusals, each naming its field.
    for (const auto& body_field : std::vector<std::pair<std::string, std::string>>{
             {R"({"prompt": [1], "n": 0})", "n"},
             {R"({"prompt": [1], "n": 3, "best_of": 2})", "best_of"},
             {R"({"prompt": [1], "n": 1, "best_of": 2, "stream": true})", "best_of"},
             {R"({"prompt": [[1], "x"]})", "prompt"},
             {R"({"prompt": [[1], [999]]})", "prompt"},
             {R"({"prompt": [1], "max_tokens": 0})", "max_tokens"},
             {R"({"prompt": [1], "logprobs": 21})", "logprobs"},
             {R"({"prompt": [1], "prompt_logprobs": 1, "stream": true})", "prompt_logprobs"},
             {R"({"prompt": [1], "prompt_logprobs": 21})", "prompt_logprobs"},
             {R"({"prompt": [1], "frobnicate": 1})", "frobnicate"}}) {
        const std::string& body = body_field.first;
        CAPTURE(body);
        CHECK(expect_error(post(ctx, "/v1/completions", body), 400)["param"] == body_field.second);
    }
    CHECK(expect_error(post(ctx, "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}],
        "best_of": 2})"), 400)["param"] == "best_of");
}

TEST_CASE("logprobs, several choices and best_of in OpenAI's shapes") {
    ApiCall call;
    call.id = "cmpl-2";
    call.model = "tiny";
    call.request.prompts = {{1, 2}, {3}};
    const std::vector<std::vector<SampledToken>> top = {{{7, -0.1f}, {4, -2.5f}}, {{8, -0.2f}, {9, -1.0f}}};
    SUBCASE("completions, not streamed: per-choice logprobs dicts, most likely first; index p * n + i") {
        call.request.n = call.request.best_of = 2;
        call.request.logprobs = 2;
        ResponseShaper s(call);
        for (int64_t i = 0; i < 4; ++i)
            s.tokens(tokens("ab", {7, 9}, i, {-0.1f, float(-1.0 - double(i))}, top, i % 2 ? "stop" : "length"));
        const json j = json::parse(s.finish(finish(3, 8)));
        REQUIRE(j["choices"].size() == 4);
        for (int64_t i = 0; i < 4; ++i) CHECK(j["choices"][size_t(i)]["index"] == i);
        const json& lp = j["choices"][3]["logprobs"];
        CHECK(lp["tokens"] == json::array({"token_id:7", "token_id:9"}));
        CHECK(lp["token_logprobs"][1].get<double>() == doctest::Approx(-4.0));
        CHECK(lp["text_offset"] == json::array({0, 10}));
        // the k best, most likely first (insertion order kept), and the chosen token when it is not among them
        const std::string second = lp["top_logprobs"][1].dump();
        CHECK(second.find("token_id:8") < second.find("token_id:9"));
        CHECK(lp["top_logprobs"][1].size() == 2);
        CHECK(lp["top_logprobs"][0].size() == 2);
        CHECK(j["choices"][1]["finish_reason"] == "stop");
        CHECK(j["usage"]["prompt_tokens"] == 3);
    }
    SUBCASE("best_of 3, n 1: the highest cumulative logprob of each prompt, re-indexed") {
        call.request.best_of = 3;
        ResponseShaper s(call);
        const float lps[6] = {-3, -1, -2, -0.5f, -4, -0.1f};
        for (int64_t i = 0; i < 6; ++i) s.tokens(tokens(std::to_string(i), {1}, i, {lps[i]}, {}, "length"));
        const json j = json::parse(s.finish(finish(3, 6)));
        REQUIRE(j["choices"].size() == 2);
        CHECK(j["choices"][0]["text"] == "1");
        CHECK(j["choices"][1]["text"] == "5");
        CHECK(j["choices"][1]["index"] == 1);
        CHECK(j["choices"][0]["logprobs"].is_null());
    }
    SUBCASE("chat, streamed: a chunk per token with its logprobs and the choice's index, even with no text") {
        call.request.chat = true;
        call.request.stream = true;
        call.request.n = call.request.best_of = 2;
        call.request.prompts = {{1}};
        call.request.logprobs = 1;
        ResponseShaper s(call);
        const std::string roles = s.accepted();
        CHECK(roles.find("\"index\":1") != std::string::npos);
        const json c = data(s.tokens(tokens("", {7}, 1, {-0.1f}, {{{7, -0.1f}}})));
        CHECK(c["choices"][0]["index"] == 1);
        const json& e = c["choices"][0]["logprobs"]["content"][0];
        CHECK(e["token"] == "token_id:7");
        CHECK(e["bytes"] == json::array({'t', 'o', 'k', 'e', 'n', '_', 'i', 'd', ':', '7'}));
        CHECK(e["top_logprobs"][0]["logprob"].get<double>() == doctest::Approx(-0.1));
    }
    SUBCASE("echo with max_tokens 0: the prompt's tokens, the first logprob null") {
        call.request.echo = true;
        call.request.logprobs = 0;
        call.request.prompts = {{1, 2}};
        ResponseShaper s(call);
        Delta d = tokens("", {1, 2}, 0, {std::nanf(""), -2.0f}, {{}, {{2, -2.0f}}}, "length");
        d.echo = true;
        s.tokens(d);
        const json j = json::parse(s.finish(finish(2, 0)));
        const json& lp = j["choices"][0]["logprobs"];
        CHECK(lp["token_logprobs"][0].is_null());
        CHECK(lp["top_logprobs"][0].is_null());
        CHECK(lp["token_logprobs"][1] == -2.0);
    }
}

TEST_CASE("parse_body bounds nesting; keys_equal") {
    CHECK(lattice::openai::parse_body(R"({"a": [[1]], "s": "[[[[[[["})", 3)["a"][0][0] == 1);
    CHECK_THROWS_AS(lattice::openai::parse_body("[[[[1]]]]", 3), lattice::Error);
    CHECK_THROWS_AS(lattice::openai::parse_body("", 3), lattice::Error);
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

TEST_CASE("chat with tools: the output's calls become tool_calls; streamed, each name first, then its arguments") {
    ApiCall call;
    call.id = "chatcmpl-7";
    call.model = "tiny";
    call.request.chat = true;
    call.request.tools.parse = true;
    call.request.tools.format = lattice::ToolCallFormat::kHermes;
    call.request.tools.names = {"get_weather", "get_time"};
    const std::string out =
        "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>"
        "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>";
    SUBCASE("not streamed: content null, both calls, finish_reason tool_calls") {
        ResponseShaper s(call);
        s.tokens(tokens(out, {1, 2}, 0, {}, {}, "stop"));
        const json m = json::parse(s.finish(finish(3, 2)))["choices"][0];
        CHECK(m["finish_reason"] == "tool_calls");
        CHECK(m["message"]["content"].is_null());
        REQUIRE(m["message"]["tool_calls"].size() == 2);
        const json& c0 = m["message"]["tool_calls"][0];
        CHECK(c0["type"] == "function");
        CHECK(c0["id"] == "call_7_0_0");
        CHECK(c0["function"]["name"] == "get_weather");
        CHECK(json::parse(c0["function"]["arguments"].get<std::string>()) == json{{"city", "Oslo"}});
    }
    SUBCASE("parallel_tool_calls false: the first call only") {
        call.request.tools.parallel = false;
        ResponseShaper s(call);
        s.tokens(tokens(out, {1, 2}, 0, {}, {}, "stop"));
        const json m = json::parse(s.finish(finish(3, 2)))["choices"][0];
        REQUIRE(m["message"]["tool_calls"].size() == 1);
        CHECK(m["message"]["tool_calls"][0]["function"]["name"] == "get_weather");
    }
    SUBCASE("streamed: each call's name as soon as it is complete, its arguments member by member") {
        call.request.stream = true;
        ResponseShaper s(call);
        std::string calls_args[2];
        std::vector<json> deltas;
        for (size_t i = 0; i < out.size(); i += 7) {  // 7 bytes a token
            const bool last = i + 7 >= out.size();
            const std::string ev = s.tokens(tokens(out.substr(i, 7), {1}, 0, {}, {}, last ? "stop" : ""));
            if (ev.empty()) continue;
            const json ch = data(ev)["choices"][0];
            CHECK(!ch["delta"].contains("content"));
            if (last) CHECK(ch["finish_reason"] == "tool_calls");
            for (const json& tc : ch["delta"].value("tool_calls", json::array())) deltas.push_back(tc);
        }
        REQUIRE(deltas.size() >= 4);
        CHECK(deltas[0]["index"] == 0);
        CHECK(deltas[0]["id"] == "call_7_0_0");
        CHECK(deltas[0]["function"]["name"] == "get_weather");
        CHECK(deltas[0]["function"]["arguments"] == "");
        for (const json& tc : deltas) {
            if (tc.contains("id")) CHECK(tc["function"].contains("name"));
            calls_args[tc["index"].get<size_t>()] += tc["function"]["arguments"].get<std::string>();
        }
        CHECK(calls_args[0] == R"({"city":"Oslo"})");
        CHECK(calls_args[1] == "{}");
    }
    SUBCASE("an answer in words stays content, its own finish_reason") {
        ResponseShaper s(call);
        s.tokens(tokens("It is sunny.", {1}, 0, {}, {}, "length"));
        const json m = json::parse(s.finish(finish(3, 1)))["choices"][0];
        CHECK(m["finish_reason"] == "length");
        CHECK(m["message"]["content"] == "It is sunny.");
        CHECK(!m["message"].contains("tool_calls"));
    }
}

TEST_CASE("tools: each parameters schema is compiled whatever tool_choice is") {
    lattice::TokenizerSpec spec;
    spec.tokens = {"<unk>", "a"};
    spec.scores = {0.0f, 0.0f};
    const lattice::Tokenizer tok(std::move(spec));
    const json bad = {{"type", "function"},
                      {"function",
                       {{"name", "f"},
                        {"parameters", {{"type", "object"}, {"properties", {{"x", {{"type", "no-such-type"}}}}}}}}}};
    for (const char* choice : {"auto", "none", "required"}) {
        CAPTURE(choice);
        const json b = {{"tools", json::array({bad})}, {"tool_choice", choice}};
        try {
            (void)lattice::openai::parse_tool_use(b, tok);
            FAIL("an invalid parameters schema was accepted");
        } catch (const lattice::Error& e) {
            const std::string m = e.message();
            CHECK(m.find("\"tools\"[0].function.parameters") != std::string::npos);
            CHECK(m.find("no-such-type") != std::string::npos);
        }
    }
}
