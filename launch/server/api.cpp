// HTTP routes of the OpenAI-compatible API (see api.h).
#include "launch/server/api.h"

#include <fmt/format.h>

#include <ctime>

#include "base/error.h"
#include "launch/openai/call.h"
#include "launch/openai/tokenize.h"

namespace lattice::serve {

namespace {

using nlohmann::json;

Reply json_reply(int status, const json& j) {
    Reply r;
    r.status = status;
    r.body = openai::json_text(j);
    return r;
}

}  // namespace

Reply error_reply(int status, std::string_view message, std::string_view param, std::string_view code) {
    Reply r;
    r.status = status;
    r.body = openai::error_json(status, message, param, code);
    if (status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
    return r;
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
    json cards = json::array({card});
    if (m.loras)
        for (const auto& [name, root] : m.loras->list()) {
            json a = card;
            a["id"] = name;
            a["root"] = root;
            a["parent"] = m.name;
            cards.push_back(a);
        }
    if (!hit.prefix) return json_reply(200, {{"object", "list"}, {"data", cards}});
    const std::string_view id = path.substr(hit.path.size());
    for (const json& c : cards)
        if (c["id"] == id) return json_reply(200, c);
    if (id != m.name)
        return error_reply(404, fmt::format("model \"{}\" does not exist; this server serves \"{}\"", id, m.name),
                           "model", "model_not_found");
    return json_reply(200, card);
}

openai::ModelInfo model_info(const ServedModel& m) {
    openai::ModelInfo info{m.name, m.tokenizer, m.limits, m.context, {}};
    if (m.loras) info.is_adapter = [loras = m.loras](const std::string& name) { return loras->has(name); };
    return info;
}

// POST /v1/completions and /v1/chat/completions: the body parsed into a call, or a 400 / 404 reply
// (openai/call.h: the validation `lattice batch` shares).
void completion_route(const RouteInput& in, const RouteContext& ctx, bool chat, Routed& out) {
    const ServedModel& m = *ctx.model;
    nlohmann::json body;
    try {
        body = openai::parse_body(in.body);
    } catch (const Error& e) {
        out.reply = error_reply(400, e.message(), openai::error_param(e.message()));
        return;
    }
    openai::Prepared p = openai::prepare_call(body, chat, model_info(m),
                                              fmt::format("{}-{:016x}", chat ? "chatcmpl" : "cmpl", ctx.request_number),
                                              int64_t(std::time(nullptr)));
    if (p.refusal)
        out.reply = error_reply(p.refusal->status, p.refusal->message, p.refusal->param, p.refusal->code);
    else
        out.call = std::move(p.call);
}

// vLLM's tokenizer routes and /version (openai/tokenize.h).
Reply tokenizer_route(std::string_view path, const RouteInput& in, const ServedModel& m) {
    const openai::ModelInfo info = model_info(m);
    const openai::Answer a = path == "/tokenize"         ? openai::tokenize_answer(in.body, info)
                             : path == "/detokenize"     ? openai::detokenize_answer(in.body, info)
                             : path == "/tokenizer_info" ? openai::tokenizer_info_answer(info)
                                                         : openai::version_answer();
    Reply r;
    r.status = a.status;
    r.body = a.body;
    return r;
}

}  // namespace

Routed route(const RouteInput& in, const RouteContext& ctx) {
    Routed out;
    std::string_view path = in.target.substr(0, in.target.find('?'));
    static constexpr KnownRoute kRoutes[] = {
        {"/v1/completions", "POST", false}, {"/v1/chat/completions", "POST", false},
        {"/v1/models", "GET", false},       {"/v1/models/", "GET", true},
        {"/health", "GET", false},          {"/metrics", "GET", false},
        {"/v1/load_lora_adapter", "POST", false}, {"/v1/unload_lora_adapter", "POST", false},
        {"/tokenize", "POST", false},       {"/detokenize", "POST", false},
        {"/tokenizer_info", "GET", false},  {"/version", "GET", false},
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
        out.reply = !ctx.model     ? json_reply(503, {{"status", "loading"}})
                    : ctx.draining ? json_reply(503, {{"status", "draining"}})
                                   : json_reply(200, {{"status", "ok"}});
        if (out.reply->status == 503) out.reply->headers.emplace_back("Retry-After", "5");
    } else if (path == "/metrics") {
        Reply r;
        r.content_type = "text/plain; version=0.0.4; charset=utf-8";
        if (ctx.metrics) r.body = ctx.metrics->render();
        out.reply = std::move(r);
    } else if (path == "/version") {
        out.reply = tokenizer_route(path, in, ServedModel{});
    } else if (!ctx.model) {
        out.reply = error_reply(503, "the model is still loading; retry when GET /health answers 200");
        out.reply->headers.emplace_back("Retry-After", "5");
    } else if (hit->path.ends_with("_lora_adapter")) {
        if (!ctx.model->loras) {
            out.reply = error_reply(404, "this server serves no LoRA adapters", "", "not_found");
        } else {
            out.reply = lora_admin_reply(hit->path == "/v1/load_lora_adapter", in.body, !ctx.api_key.empty(),
                                         *ctx.model->loras);
        }
    } else if (hit->path.starts_with("/v1/models")) {
        out.reply = model_reply(path, *hit, *ctx.model);
    } else if (!hit->path.starts_with("/v1/")) {  // /tokenize, /detokenize, /tokenizer_info
        out.reply = tokenizer_route(path, in, *ctx.model);
    } else if (ctx.draining) {
        out.reply = error_reply(503, "the server is shutting down and takes no new requests");
    } else {
        completion_route(in, ctx, path == "/v1/chat/completions", out);
    }
    return out;
}

}  // namespace lattice::serve
