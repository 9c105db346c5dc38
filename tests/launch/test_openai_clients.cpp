// What clients written for vLLM and OpenAI send and expect, without a model (the end-to-end side is
// tests/launch/test_serve_clients.py): chat messages normalized before the template (null content, parts,
// tool-call arguments), a template error naming its line and no server path, echo's prompt logprobs
// before the generated tokens' (lm-eval's shape), vLLM's prompt_logprobs, cached_tokens in usage, the
// tokenizer routes, and tool calls streamed piece by piece in each format.
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/error.h"
#include "launch/openai/messages.h"
#include "launch/openai/tool_stream.h"
#include "launch/server/api.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/launch/serve_routes.h"

using lattice::openai::ApiCall;
using lattice::openai::Delta;
using lattice::openai::ResponseShaper;
using lattice::openai::ToolCallStream;
using lattice::serve::ServedModel;
using lattice::test::post;
using lattice::test::request;
using lattice::test::serving;
using nlohmann::json;

namespace {

// A tokenizer of a few pieces whose Jinja chat template is `tmpl`, read from a file under a server path.
lattice::Tokenizer tokenizer_with(const std::string& tmpl) {
    lattice::TokenizerSpec spec;
    spec.tokens = {"<unk>", "a", "b", "\xE2\x96\x81"};
    spec.scores = {0.0f, 0.0f, 0.0f, 0.0f};
    spec.unk_id = 0;
    spec.chat_template = tmpl;
    spec.source = "/srv/secret-models/tiny/tokenizer.json";
    return lattice::Tokenizer(std::move(spec));
}

ServedModel model_of(const lattice::Tokenizer& tok) {
    return lattice::test::served_model("tiny", 4, 4096, &tok);
}

// Template: each turn's role and content concatenated as strings (null content would fail to add).
constexpr const char* kPlain = "{% for m in messages %}{{ m['role'] + ':' + m['content'] }}\n{% endfor %}";

}  // namespace

TEST_CASE("chat messages are normalized as vLLM does before the template") {
    const json m = json::parse(R"([
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "assistant"}])");
    const nlohmann::ordered_json n = lattice::openai::normalize_messages(m);
    CHECK(n[0]["content"] == "a\nb");
    CHECK(n[1]["content"] == "");
    CHECK(n[1]["tool_calls"][0]["function"]["arguments"] == nlohmann::ordered_json{{"x", 1}});
    CHECK(n[2]["tool_call_id"] == "c1");
    CHECK(n[3]["content"] == "");
    CHECK_THROWS_WITH_AS(lattice::openai::normalize_messages(
                             json::parse(R"([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])")),
                         doctest::Contains("\"image_url\" parts are not supported"), lattice::Error);
    CHECK_THROWS_AS(lattice::openai::normalize_messages(json::parse(R"([{"content": "x"}])")), lattice::Error);
}

TEST_CASE("the openai SDK's tool loop renders; a template error names its line and no server path") {
    const lattice::Tokenizer tok = tokenizer_with(kPlain);
    const ServedModel m = model_of(tok);
    const std::string loop = R"({"messages": [{"role": "user", "content": "a"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
         "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "b"}],
        "tools": [{"type": "function", "function": {"name": "f"}}], "max_tokens": 2})";
    const lattice::serve::Routed ok = post(serving(m), "/v1/chat/completions", loop);
    CHECK_MESSAGE(ok.call.has_value(), (ok.reply ? ok.reply->body : ""));
    const lattice::Tokenizer bad =
        tokenizer_with("{% for m in messages %}\n{{ raise_exception('no ' + m['role']) }}{% endfor %}");
    const ServedModel mb = model_of(bad);
    const lattice::serve::Routed r =
        post(serving(mb), "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "a"}]})");
    REQUIRE(r.reply.has_value());
    CHECK(r.reply->status == 400);
    const std::string msg = json::parse(r.reply->body)["error"]["message"];
    CHECK(msg.find("line 2") != std::string::npos);
    CHECK(msg.find("no user") != std::string::npos);
    CHECK(r.reply->body.find("/srv") == std::string::npos);
    CHECK(lattice::openai::public_template_error("chat template '/a/b.gguf' line 3 column 1: x") ==
          "chat template line 3 column 1: x");
}

TEST_CASE("echo with logprobs and max_tokens 1: the prompt's logprobs (first null), then the generated token's") {
    ApiCall call;
    call.id = "cmpl-1";
    call.request.echo = true;
    call.request.logprobs = 1;
    call.request.prompts = {{1, 2, 3}};
    ResponseShaper s(call);
    Delta p;
    p.echo = true;
    p.text = "abc";
    p.tokens = {1, 2, 3};
    p.logprobs = {std::nanf(""), -1.0f, -2.0f};
    p.top = {{}, {{2, -1.0f}}, {{1, -0.5f}}};
    s.tokens(p);
    Delta g;
    g.text = "d";
    g.tokens = {3};
    g.logprobs = {-0.25f};
    g.top = {{{3, -0.25f}}};
    g.finish_reason = "length";
    s.tokens(g);
    Delta f;
    f.kind = Delta::Kind::kFinish;
    f.prompt_tokens = 3;
    f.completion_tokens = 1;
    f.cached_tokens = 2;
    const json j = json::parse(s.finish(f));
    const json& lp = j["choices"][0]["logprobs"];
    CHECK(j["choices"][0]["text"] == "abcd");
    CHECK(lp["token_logprobs"] == json::parse("[null, -1.0, -2.0, -0.25]"));
    CHECK(lp["top_logprobs"][0].is_null());
    CHECK(lp["top_logprobs"][2].size() == 2);  // the most likely and the chosen token (vLLM's)
    CHECK(lp["tokens"].size() == 4);
    CHECK(lp["text_offset"] == json::parse("[0, 10, 20, 30]"));  // "token_id:N" strings without a tokenizer
    CHECK(j["usage"]["prompt_tokens_details"]["cached_tokens"] == 2);
}

TEST_CASE("prompt_logprobs in vLLM's shape: [null, {id: {logprob, rank, decoded_token}}]") {
    for (const bool chat : {false, true}) {
        CAPTURE(chat);
        ApiCall call;
        call.request.chat = chat;
        call.request.prompt_logprobs = 1;
        call.request.prompts = {{1, 2}};
        ResponseShaper s(call);
        Delta p;
        p.echo = true;
        p.tokens = {1, 2};
        p.logprobs = {std::nanf(""), -3.0f};
        p.top = {{}, {{1, -0.1f}}};
        p.ranks = {0, 4};
        s.tokens(p);
        Delta g;
        g.text = "x";
        g.tokens = {3};
        g.logprobs = {-1.0f};
        g.finish_reason = "length";
        s.tokens(g);
        Delta f;
        f.kind = Delta::Kind::kFinish;
        const json j = json::parse(s.finish(f));
        const json pl = chat ? j["prompt_logprobs"] : j["choices"][0]["prompt_logprobs"];
        REQUIRE(pl.size() == 2);
        CHECK(pl[0].is_null());
        CHECK(pl[1]["2"]["rank"] == 4);
        CHECK(pl[1]["2"]["logprob"] == -3.0);
        CHECK(pl[1]["1"]["rank"] == 1);
        CHECK(pl[1]["1"]["decoded_token"] == "token_id:1");
        CHECK((chat ? j["choices"][0]["message"]["content"] : j["choices"][0]["text"]) == "x");  // no echo
    }
}

TEST_CASE("/tokenize, /detokenize, /tokenizer_info and /version in vLLM's shapes") {
    const lattice::Tokenizer tok = tokenizer_with(kPlain);
    const ServedModel m = model_of(tok);
    const auto body = [&](const char* method, const std::string& path, const std::string& b, int status) {
        const lattice::serve::Routed r = request(serving(m), method, path, b);
        REQUIRE(r.reply.has_value());
        CHECK_MESSAGE(r.reply->status == status, r.reply->body);
        return json::parse(r.reply->body);
    };
    const json t = body("POST", "/tokenize", R"({"prompt": "ab", "return_token_strs": true})", 200);
    CHECK(t["count"] == t["tokens"].size());
    CHECK(t["token_strs"].size() == t["tokens"].size());
    CHECK(t["max_model_len"] == 4096);
    CHECK(body("POST", "/detokenize", json{{"tokens", t["tokens"]}}.dump(), 200)["prompt"] == "ab");
    const json c = body("POST", "/tokenize", R"({"messages": [{"role": "user", "content": null}]})", 200);
    CHECK(c["count"].get<int>() > 0);
    CHECK(body("POST", "/tokenize", R"({"prompt": "a", "model": "other"})", 404)["error"]["param"] == "model");
    CHECK(body("POST", "/detokenize", R"({"tokens": [9]})", 400)["error"]["message"].get<std::string>().find(
              "tokens") != std::string::npos);
    CHECK(body("GET", "/version", "", 200)["version"].is_string());
    CHECK(body("GET", "/tokenizer_info", "", 200)["chat_template"] == kPlain);
}

TEST_CASE("tool calls stream as they are written in every format; the pieces add up to the final message") {
    struct Case {
        lattice::ToolCallFormat format;
        bool forced;
        std::string text;
    };
    const std::vector<Case> cases = {
        {lattice::ToolCallFormat::kHermes, false,
         "Sure. <tool_call>\n{\"name\": \"f\", \"arguments\": {\"b\": [1, 2], \"a\": \"x,y\"}}\n</tool_call>"},
        {lattice::ToolCallFormat::kMistral, false,
         "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": 1}}, {\"name\": \"g\", \"arguments\": {}}]"},
        {lattice::ToolCallFormat::kJson, false, "<|python_tag|>{\"name\": \"g\", \"parameters\": {\"q\": \"z\"}}"},
        {lattice::ToolCallFormat::kJson, true, "{\"name\": \"f\", \"parameters\": {\"n\": 12, \"m\": true}}"},
    };
    const std::set<std::string> names = {"f", "g"};
    for (const Case& c : cases) {
        CAPTURE(c.text);
        ToolCallStream st(c.format, c.forced);
        std::string content, args[2], name[2];
        size_t headers = 0, pieces = 0;
        const auto take = [&](const ToolCallStream::Piece& p) {
            content += p.content;
            for (const auto& tc : p.calls) {
                const size_t k = tc["index"].get<size_t>();
                if (tc.contains("id")) {
                    ++headers;
                    CHECK(tc["id"] == "call_x_" + std::to_string(k));
                    name[k] = tc["function"]["name"].get<std::string>();
                } else {
                    ++pieces;
                }
                args[k] += tc["function"]["arguments"].get<std::string>();
            }
        };
        for (size_t i = 1; i <= c.text.size(); ++i) take(st.push(c.text.substr(0, i), names, "call_x_"));
        const lattice::ToolCallOutput out = c.forced ? lattice::parse_forced_call(c.text, c.format)
                                                     : lattice::parse_tool_calls(c.text, c.format, names);
        const size_t before = pieces;
        take(st.finish(out, "call_x_"));
        CHECK(before == pieces);  // everything was streamed before the end
        REQUIRE(headers == out.calls.size());
        for (size_t k = 0; k < out.calls.size(); ++k) {
            CHECK(name[k] == out.calls[k].name);
            CHECK(args[k] == out.calls[k].arguments);
        }
        CHECK(content == out.content);
        CHECK(pieces >= out.calls.size());
    }
}
