// The request validation serve and batch share (see call.h).
#include "launch/openai/call.h"

#include <fmt/format.h>

#include "base/error.h"

namespace lattice::openai {

namespace {

void replace_all(std::string& s, const std::string& from, const std::string& to) {
    if (from.empty()) return;
    for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
        s.replace(at, from.size(), to);
}

}  // namespace

std::string without_paths(std::string message, const ModelInfo& m) {
    if (!m.tokenizer || m.tokenizer->source().empty()) return message;
    std::string file = m.tokenizer->source();
    replace_all(message, file, m.name);
    const size_t slash = file.rfind('/');
    if (slash != std::string::npos && slash > 0) replace_all(message, file.substr(0, slash), m.name);
    return message;
}

Prepared prepare_call(const nlohmann::json& body, bool chat, const ModelInfo& m, std::string id, int64_t created) {
    Prepared out;
    if (body.is_object() && body.contains("model") && body["model"].is_string() &&
        body["model"].get<std::string>() != m.name && !(m.is_adapter && m.is_adapter(body["model"].get<std::string>()))) {
        out.refusal = Refusal{404,
                              fmt::format("model \"{}\" does not exist; this server serves \"{}\"",
                                          body["model"].get<std::string>(), m.name),
                              "model", "model_not_found"};
        return out;
    }
    try {
        ApiCall call;
        call.request = parse_api_request(body, chat, m.tokenizer, m.limits);
        check_context(call.request, m.context);
        call.tokenizer = m.tokenizer;
        call.return_token_ids = parse_return_token_ids(body, m.tokenizer);
        call.id = std::move(id);
        call.created = created;
        call.model = call.request.model.empty() ? m.name : call.request.model;  // the base's, or the adapter's
        out.call = std::move(call);
    } catch (const Error& e) {
        const std::string msg = without_paths(e.message(), m);
        out.refusal = Refusal{400, msg, error_param(msg), {}};
    }
    return out;
}

}  // namespace lattice::openai
