// Routes and response shapes of the OpenAI-compatible API (see api.h).
#include "launch/server/api.h"

#include <fmt/format.h>

#include "base/error.h"
#include "base/json_limits.h"

namespace lattice::serve {

namespace {

using nlohmann::json;

std::string_view error_type(int status) {
    switch (status) {
        case 401:
            return "authentication_error";
        case 404:
            return "not_found_error";
        case 503:
            return "server_error";
        default:
            return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

// The field an Error message names first ("\"max_tokens\" must be ..." -> max_tokens).
std::string param_of(std::string_view msg) {
    const size_t a = msg.find('"');
    if (a == std::string_view::npos) return {};
    const size_t b = msg.find('"', a + 1);
    if (b == std::string_view::npos || b == a + 1 || b - a > 40) return {};
    return std::string(msg.substr(a + 1, b - a - 1));
}

std::string dump(const json& j) {
    // Generated text may hold bytes that never form UTF-8: they become U+FFFD, not an exception.
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Reply json_reply(int status, const json& j) {
    Reply r;
    r.status = status;
    r.body = dump(j);
    return r;
}

}  // namespace

std::string error_json(int status, std::string_view message, std::string_view param, std::string_view code) {
    json e = {{"message", std::string(message)},
              {"type", std::string(error_type(status))},
              {"param", param.empty() ? json(nullptr) : json(std::string(param))},
              {"code", code.empty() ? json(nullptr) : json(std::string(code))}};
    return dump(json{{"error", e}});
}

Reply error_reply(int status, std::string_view message, std::string_view param, std::string_view code) {
    Reply r;
    r.status = status;
    r.body = error_json(status, message, param, code);
    if (status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
    return r;
}

json parse_body(std::string_view body, int max_depth) {
    JsonLimits lim;
    lim.max_depth = max_depth;
    check_json_limits(body, "the request body", lim);
    json j = json::parse(body.begin(), body.end(), nullptr, false);
    LATTICE_CHECK(!j.is_discarded(), "the body is not valid JSON");
    return j;
}

bool keys_equal(std::string_view given, std::string_view expected) {
    unsigned diff = given.size() == expected.size() ? 0u : 1u;
    for (size_t i = 0; i < expected.size(); ++i) {
        const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
        diff |= g ^ static_cast<unsigned char>(expected[i]);
    }
    return diff == 0;
}

namespace {

struct KnownRoute {
    std::string_view path, method;
    bool prefix;  // path is a prefix (/v1/models/{id})
};

// GET /v1/models and /v1/models/{id}: the one model's card.
Reply model_reply(std::string_view path, const KnownRoute& hit, const ServedModel& m) {
    const json card = {{"id", m.name},
                       {"object", "model"},
                       {"created", m.created},
                       {"owned_by", "lattice"},
                       {"max_model_len", m.context}};
    if (!hit.prefix) return json_reply(200, {{"object", "list"}, {"data", json::array({card})}});
    const std::string_view id = path.substr(hit.path.size());
    if (id != m.name)
        return error_reply(404, fmt::format("model \"{}\" does not exist; this server serves \"{}\"", id, m.name),
                           "model", "model_not_found");
    return json_reply(200, card);
}

// POST /v1/completions and /v1/chat/completions: the body parsed into a call, or a 400 / 404 reply.
void completion_route(const RouteInput& in, const RouteContext& ctx, bool chat, Routed& out) {
    const ServedModel& m = *ctx.model;
    try {
        const json body = parse_body(in.body);
        if (body.is_object() && body.contains("model") && body["model"].is_string() &&
            body["model"].get<std::string>() != m.name) {
            out.reply = error_reply(404,
                                    fmt::format("model \"{}\" does not exist; this server serves \"{}\"",
                                                body["model"].get<std::string>(), m.name),
                                    "model", "model_not_found");
            return;
        }
        ApiCall call;
        call.request = parse_api_request(body, chat, m.tokenizer, m.limits);
        const auto it = body.find("return_token_ids");
        LATTICE_CHECK(it == body.end() || it->is_null() || it->is_boolean(),
                      "\"return_token_ids\" must be true or false");
        call.return_token_ids = !m.tokenizer || (it != body.end() && it->is_boolean() && it->get<bool>());
        call.id = fmt::format("{}-{:016x}", chat ? "chatcmpl" : "cmpl", ctx.request_number);
        call.created = int64_t(std::time(nullptr));
        call.model = m.name;
        out.call = std::move(call);
    } catch (const Error& e) {
        out.reply = error_reply(400, e.message(), param_of(e.message()));
    }
}

}  // namespace

Routed route(const RouteInput& in, const RouteContext& ctx) {
    Routed out;
    std::string_view path = in.target.substr(0, in.target.find('?'));
    static constexpr KnownRoute kRoutes[] = {
        {"/v1/completions", "POST", false}, {"/v1/chat/completions", "POST", false},
        {"/v1/models", "GET", false},       {"/v1/models/", "GET", true},
        {"/health", "GET", false},          {"/metrics", "GET", false},
    };
    const KnownRoute* hit = nullptr;
    for (const KnownRoute& k : kRoutes)
        if (k.prefix ? path.starts_with(k.path) && path.size() > k.path.size() : path == k.path) hit = &k;
    out.route = hit ? std::string(hit->prefix ? "/v1/models/{id}" : hit->path) : "other";
    if (path.starts_with("/v1/") && !ctx.api_key.empty()) {
        constexpr std::string_view kBearer = "Bearer ";
        const std::string_view auth = in.authorization;
        if (!auth.starts_with(kBearer) || !keys_equal(auth.substr(kBearer.size()), ctx.api_key)) {
            out.reply = error_reply(401, "missing or wrong API key: send the header \"Authorization: Bearer KEY\"", "",
                                    "invalid_api_key");
            return out;
        }
    }
    if (!hit) {
        out.reply = error_reply(404, fmt::format("no route {} {}", in.method, path), "", "not_found");
        return out;
    }
    if (in.method != hit->method) {
        out.reply = error_reply(405, fmt::format("{} takes {}, not {}", out.route, hit->method, in.method), "",
                                "method_not_allowed");
        out.reply->headers.emplace_back("Allow", std::string(hit->method));
        return out;
    }
    if (path == "/health") {
        out.reply = ctx.model ? json_reply(200, {{"status", "ok"}}) : json_reply(503, {{"status", "loading"}});
    } else if (path == "/metrics") {
        Reply r;
        r.content_type = "text/plain; version=0.0.4; charset=utf-8";
        if (ctx.metrics) r.body = ctx.metrics->render();
        out.reply = std::move(r);
    } else if (!ctx.model) {
        out.reply = error_reply(503, "the model is still loading; retry when GET /health answers 200");
        out.reply->headers.emplace_back("Retry-After", "5");
    } else if (hit->path.starts_with("/v1/models")) {
        out.reply = model_reply(path, *hit, *ctx.model);
    } else if (ctx.draining) {
        out.reply = error_reply(503, "the server is shutting down and takes no new requests");
    } else {
        completion_route(in, ctx, path == "/v1/chat/completions", out);
    }
    return out;
}

ResponseShaper::ResponseShaper(const ApiCall& c)
    : chat_(c.request.chat),
      stream_(c.request.stream),
      include_usage_(c.request.include_usage),
      token_ids_(c.return_token_ids),
      id_(c.id),
      model_(c.model),
      created_(c.created) {}

json ResponseShaper::chunk_base() const {
    json j = {{"id", id_},
              {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
              {"created", created_},
              {"model", model_}};
    if (include_usage_) j["usage"] = nullptr;
    return j;
}

std::string ResponseShaper::event(const json& j) {
    return "data: " + dump(j) + "\n\n";
}

std::string ResponseShaper::accepted() {
    if (!stream_ || !chat_) return {};
    json j = chunk_base();
    j["choices"] = json::array({{{"index", 0},
                                 {"delta", {{"role", "assistant"}, {"content", ""}}},
                                 {"logprobs", nullptr},
                                 {"finish_reason", nullptr}}});
    return event(j);
}

std::string ResponseShaper::tokens(const std::string& text, const std::vector<int32_t>& ids) {
    if (!stream_) {
        text_ += text;
        if (token_ids_) ids_.insert(ids_.end(), ids.begin(), ids.end());
        return {};
    }
    if (text.empty() && !token_ids_) return {};  // held back (a possible stop string): nothing to show yet
    json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    if (chat_)
        choice["delta"] = {{"content", text}};
    else
        choice["text"] = text;
    if (token_ids_) choice["token_ids"] = ids;
    json j = chunk_base();
    j["choices"] = json::array({choice});
    return event(j);
}

std::string ResponseShaper::finish(const std::string& reason, int64_t prompt_tokens, int64_t completion_tokens) {
    const json usage = {{"prompt_tokens", prompt_tokens},
                        {"completion_tokens", completion_tokens},
                        {"total_tokens", prompt_tokens + completion_tokens}};
    if (!stream_) {
        json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", reason}};
        if (chat_)
            choice["message"] = {{"role", "assistant"}, {"content", text_}};
        else
            choice["text"] = text_;
        if (token_ids_) choice["token_ids"] = ids_;
        return dump(json{{"id", id_},
                         {"object", chat_ ? "chat.completion" : "text_completion"},
                         {"created", created_},
                         {"model", model_},
                         {"choices", json::array({choice})},
                         {"usage", usage}});
    }
    json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", reason}};
    if (chat_)
        choice["delta"] = json::object();
    else
        choice["text"] = "";
    json last = chunk_base();
    last["choices"] = json::array({choice});
    std::string out = event(last);
    if (include_usage_) {
        json u = chunk_base();
        u["choices"] = json::array();
        u["usage"] = usage;
        out += event(u);
    }
    return out + "data: [DONE]\n\n";
}

std::string ResponseShaper::stream_error(int status, std::string_view message) {
    return "data: " + error_json(status, message) + "\n\n";
}

}  // namespace lattice::serve
