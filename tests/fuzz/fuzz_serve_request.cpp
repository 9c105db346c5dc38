// libFuzzer target for `lattice serve`'s request handling without sockets: route() (path, method,
// API key, readiness, drain, JSON body -> parse_api_request through a real tokenizer and chat
// template) and, for accepted calls, the ResponseShaper's JSON and SSE output (launch/openai/).
// Input: byte 0 = flags (bit 0 chat, bit 1 API key required, bit 2 model still loading, bit 3
// draining, bits 4-5 method, bit 6 no tokenizer, bit 7 custom target), then, with bit 7, a target
// up to the first '\n'; the rest is the body. The API key (when required) is "fuzz-key"; inputs of odd
// size send it, even ones send the body's first 8 bytes as their guess.
// Invariants checked: route() never throws; exactly one of reply / call; replies carry a known
// status and, when not 200, an OpenAI error body; an accepted call has a non-empty prompt of valid
// ids, max_tokens >= 1 (or chat's kRestOfContext: the engine client's budget), at
// most 4 non-empty stop strings; the shaper's non-stream answer is JSON and its stream ends with "data: [DONE]".
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "base/error.h"
#include "launch/server/api.h"
#include "launch/server/metrics.h"
#include "runtime/tokenizer/tokenizer.h"

namespace {

using lattice::openai::ResponseShaper;

// A small SentencePiece vocab with byte fallback (every text encodes) and a ChatML template.
const lattice::Tokenizer& tokenizer() {
    static const lattice::Tokenizer tok = [] {
        lattice::TokenizerSpec s;
        s.kind = lattice::TokenizerKind::kSentencePiece;
        auto add = [&](std::string t, lattice::TokenType type, float score) {
            s.tokens.push_back(std::move(t));
            s.types.push_back(type);
            s.scores.push_back(score);
        };
        add("<unk>", lattice::TokenType::kUnknown, 0);
        add("<s>", lattice::TokenType::kControl, 0);
        add("</s>", lattice::TokenType::kControl, 0);
        add("<|im_start|>", lattice::TokenType::kControl, 0);
        add("<|im_end|>", lattice::TokenType::kControl, 0);
        for (int b = 0; b < 256; ++b) {
            char name[8];
            std::snprintf(name, sizeof(name), "<0x%02X>", b);
            add(name, lattice::TokenType::kByte, 0);
        }
        float score = -1;
        for (const char* w : {"\xE2\x96\x81", "e", "l", "o", "H", "\xE2\x96\x81H", "ll", "llo", "\xE2\x96\x81Hello",
                              "user", "system", "assistant"})
            add(w, lattice::TokenType::kNormal, score -= 0.5f);
        s.unk_id = 0;
        s.bos_id = 1;
        s.eos_id = 2;
        s.eog_ids = {2, 4};
        s.add_bos = true;
        s.chat_template =
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\\n{{ m['content'] }}<|im_end|>\\n{% endfor %}";
        s.source = "fuzz";
        return lattice::Tokenizer(std::move(s));
    }();
    return tok;
}

bool is_error_body(const std::string& body) {
    const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
    return !j.is_discarded() && j.is_object() && j.contains("error") && j["error"].is_object() &&
           j["error"].contains("message") && j["error"]["message"].is_string() &&
           !j["error"]["message"].get<std::string>().empty() && j["error"].contains("type") &&
           j["error"].contains("param") && j["error"].contains("code");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    const uint8_t flags = data[0];
    std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
    const bool chat = flags & 1;
    std::string_view target = chat ? "/v1/chat/completions" : "/v1/completions";
    if (flags & 0x80) {
        const size_t nl = rest.find('\n');
        target = rest.substr(0, nl);
        rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    }
    static const char* kMethods[] = {"POST", "GET", "PUT", "DELETE"};
    const std::string auth = (size & 1) ? std::string("Bearer fuzz-key") : "Bearer " + std::string(rest.substr(0, 8));

    lattice::serve::ServedModel model;
    model.name = "fuzz-model";
    model.tokenizer = (flags & 0x40) ? nullptr : &tokenizer();
    model.limits = lattice::openai::ApiLimits{model.tokenizer ? model.tokenizer->vocab_size() : 300};
    model.created = 1;
    lattice::serve::Metrics metrics;
    lattice::serve::RouteContext ctx;
    ctx.api_key = (flags & 2) ? "fuzz-key" : "";
    ctx.model = (flags & 4) ? nullptr : &model;
    ctx.draining = flags & 8;
    ctx.metrics = &metrics;
    ctx.request_number = size;
    const lattice::serve::RouteInput in{kMethods[(flags >> 4) & 3], target, auth, rest};

    const lattice::serve::Routed r = lattice::serve::route(in, ctx);  // any exception is a finding
    if (r.reply.has_value() == r.call.has_value()) std::abort();
    if (r.route.empty()) std::abort();
    if (r.reply) {
        const int st = r.reply->status;
        if (st != 200 && st != 400 && st != 401 && st != 404 && st != 405 && st != 503) std::abort();
        if (st != 200 && !is_error_body(r.reply->body)) std::abort();
        metrics.count_response(r.route, st);
        if (metrics.render().empty()) std::abort();
        return 0;
    }
    const lattice::openai::ApiCall& call = *r.call;
    const lattice::ClientRequest& e = call.request.client;
    if (e.prompt.empty()) std::abort();
    for (int32_t id : e.prompt)
        if (id < 0 || id >= model.limits.vocab) std::abort();
    if (e.max_tokens < 1 && !(chat && e.max_tokens == lattice::ClientRequest::kRestOfContext) &&
        !(call.request.echo && e.max_tokens == 0))
        std::abort();
    for (const auto& p : call.request.prompts)
        for (int32_t id : p)
            if (id < 0 || id >= model.limits.vocab) std::abort();
    const int64_t sequences = int64_t(call.request.prompts.size()) * call.request.best_of;
    if (sequences < 1 || sequences > lattice::openai::ApiRequest::kMaxChoices || call.request.n > call.request.best_of)
        std::abort();
    if (e.stop.size() > 4) std::abort();
    for (const std::string& s : e.stop)
        if (s.empty()) std::abort();
    if (call.request.chat != chat) std::abort();

    ResponseShaper shaper(call);
    std::string out = shaper.accepted();
    const size_t k = size_t(std::max(call.request.logprobs, 0));
    for (int64_t i = 0; i < sequences; ++i) {
        lattice::openai::Delta d;
        d.index = i;
        d.text = "He\xFF";  // invalid UTF-8 must not throw (it becomes U+FFFD)
        d.tokens = {5, 6};
        d.logprobs = {-0.5f, -INFINITY};
        if (call.request.logprobs >= 0) d.top.assign(2, std::vector<lattice::SampledToken>(k, {5, -0.5f}));
        out += shaper.tokens(d);
        d.text = "llo";
        d.tokens = {7};
        d.logprobs = {std::nanf("")};
        if (call.request.logprobs >= 0) d.top.resize(1);
        d.finish_reason = "length";
        out += shaper.tokens(d);
    }
    lattice::openai::Delta f;
    f.kind = lattice::openai::Delta::Kind::kFinish;
    f.prompt_tokens = int64_t(e.prompt.size());
    f.completion_tokens = 3 * sequences;
    const std::string last = shaper.finish(f);
    if (shaper.streaming()) {
        if (!(out + last).ends_with("data: [DONE]\n\n")) std::abort();
    } else {
        if (!out.empty()) std::abort();
        const nlohmann::json j = nlohmann::json::parse(last, nullptr, false);
        if (j.is_discarded() || !j.contains("usage") || !j.contains("choices")) std::abort();
    }
    return 0;
}
