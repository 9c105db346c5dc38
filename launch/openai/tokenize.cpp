// /tokenize, /detokenize, /tokenizer_info and /version (see tokenize.h).
#include "launch/openai/tokenize.h"

#include <fmt/format.h>

#include "base/error.h"
#include "launch/openai/messages.h"

namespace lattice::openai {

namespace {

using nlohmann::json;

constexpr std::string_view kVersion = "0.1.0";  // CMakeLists.txt project(... VERSION), `lattice --version`

bool flag(const json& b, const char* key, bool dflt) {
    if (!field_given(b, key)) return dflt;
    LATTICE_CHECK(b[key].is_boolean(), "\"{}\" must be true or false", key);
    return b[key].get<bool>();
}

// The body parsed, its "model" checked (404) and the tokenizer required; else the refusal.
std::optional<Refusal> check_body(const json& b, const ModelInfo& m) {
    if (!b.is_object()) return Refusal{400, "the request body must be a JSON object", "", ""};
    if (field_given(b, "model") && (!b["model"].is_string() || b["model"].get<std::string>() != m.name))
        return Refusal{404,
                       fmt::format("model {} does not exist; this server serves \"{}\"", b["model"].dump(), m.name),
                       "model", "model_not_found"};
    if (!m.tokenizer) return Refusal{400, "this model has no tokenizer", "", ""};
    return std::nullopt;
}

Answer refused(const Refusal& r) {
    return {r.status, r.body()};
}

std::vector<int32_t> tokens_of(const json& b, const ModelInfo& m) {
    const Tokenizer& tok = *m.tokenizer;
    if (b.contains("messages")) {
        LATTICE_CHECK(tok.chat_template_kind() != ChatTemplateKind::kNone,
                      "this model's tokenizer has no recognised chat template");
        const ToolUse use = parse_tool_use(b, tok);
        const std::string text =
            render_chat(normalize_messages(b["messages"]), b, tok, use, flag(b, "add_generation_prompt", true));
        const bool special = flag(b, "add_special_tokens", false);
        return tok.encode(text, special && tok.add_bos_default(), true);
    }
    LATTICE_CHECK(b.contains("prompt") && b["prompt"].is_string(), "\"prompt\" (a string) or \"messages\" is required");
    const bool special = flag(b, "add_special_tokens", true);
    return tok.encode(b["prompt"].get<std::string>(), special && tok.add_bos_default(), false);
}

}  // namespace

Answer tokenize_answer(std::string_view text, const ModelInfo& m) {
    try {
        const json b = parse_body(text);
        if (const auto r = check_body(b, m)) return refused(*r);
        const std::vector<int32_t> ids = tokens_of(b, m);
        json strs = nullptr;
        if (flag(b, "return_token_strs", false)) {
            strs = json::array();
            for (int32_t id : ids) strs.push_back(m.tokenizer->token_text(id));
        }
        const json out = {{"count", ids.size()}, {"max_model_len", m.context}, {"tokens", ids}, {"token_strs", strs}};
        return {200, json_text(out)};
    } catch (const Error& e) {
        const std::string msg = without_paths(e.message(), m);
        return refused(Refusal{400, msg, error_param(msg), ""});
    }
}

Answer detokenize_answer(std::string_view text, const ModelInfo& m) {
    try {
        const json b = parse_body(text);
        if (const auto r = check_body(b, m)) return refused(*r);
        LATTICE_CHECK(b.contains("tokens") && b["tokens"].is_array(), "\"tokens\" (an array of token ids) is required");
        std::vector<int32_t> ids;
        for (size_t i = 0; i < b["tokens"].size(); ++i) {
            const json& t = b["tokens"][i];
            LATTICE_CHECK(t.is_number_integer() && t.get<int64_t>() >= 0 && t.get<int64_t>() < m.limits.vocab,
                          "\"tokens\"[{}] = {} is not a token id of this model (vocab {})", i, t.dump(),
                          m.limits.vocab);
            ids.push_back(int32_t(t.get<int64_t>()));
        }
        return {200, json_text(json{{"prompt", m.tokenizer->decode(ids)}})};
    } catch (const Error& e) {
        return refused(Refusal{400, e.message(), error_param(e.message()), ""});
    }
}

Answer tokenizer_info_answer(const ModelInfo& m) {
    if (!m.tokenizer) return refused(Refusal{404, "this model has no tokenizer", "", "not_found"});
    const Tokenizer& t = *m.tokenizer;
    const auto text = [&](int32_t id) { return id >= 0 ? json(t.token_text(id)) : json(nullptr); };
    const json out = {{"tokenizer_class", "lattice"},
                      {"bos_token", text(t.bos_id())},
                      {"eos_token", text(t.eos_id())},
                      {"pad_token", nullptr},
                      {"chat_template", t.chat_template_text().empty() ? json(nullptr) : json(t.chat_template_text())},
                      {"model_max_length", m.context}};
    return {200, json_text(out)};
}

Answer version_answer() {
    return {200, json_text(json{{"version", std::string(kVersion)}})};
}

}  // namespace lattice::openai
