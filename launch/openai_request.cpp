// parse_api_request (see openai_request.h).
#include "launch/openai_request.h"

#include <cmath>
#include <random>

#include "base/error.h"

namespace lattice {

namespace {

using nlohmann::json;

double number(const json& b, const char* key, double lo, double hi, double dflt) {
    if (!b.contains(key) || b[key].is_null()) return dflt;
    const json& v = b[key];
    LATTICE_CHECK(v.is_number(), "\"{}\" must be a number", key);
    const double x = v.get<double>();
    LATTICE_CHECK(std::isfinite(x) && x >= lo && x <= hi, "\"{}\" must be in [{}, {}], got {}", key, lo, hi, x);
    return x;
}

int64_t integer(const json& b, const char* key, int64_t lo, int64_t hi, int64_t dflt) {
    if (!b.contains(key) || b[key].is_null()) return dflt;
    const json& v = b[key];
    LATTICE_CHECK(v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()),
                  "\"{}\" must be an integer", key);
    const double x = v.get<double>();
    LATTICE_CHECK(x >= double(lo) && x <= double(hi), "\"{}\" must be in [{}, {}], got {}", key, lo, hi, v.dump());
    return v.is_number_integer() && v.is_number_unsigned() ? int64_t(v.get<uint64_t>()) : int64_t(x);
}

bool boolean(const json& b, const char* key, bool dflt) {
    if (!b.contains(key) || b[key].is_null()) return dflt;
    LATTICE_CHECK(b[key].is_boolean(), "\"{}\" must be true or false", key);
    return b[key].get<bool>();
}

std::vector<int32_t> token_ids(const json& a, const char* what, int64_t vocab) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < a.size(); ++i) {
        LATTICE_CHECK(a[i].is_number_integer(), "\"{}\"[{}] must be a token id (an integer)", what, i);
        // The value as sent (an unsigned one above INT64_MAX must not wrap into a negative id).
        const bool fits = !a[i].is_number_unsigned() || a[i].get<uint64_t>() <= uint64_t(INT64_MAX);
        const int64_t t = fits ? a[i].get<int64_t>() : -1;
        LATTICE_CHECK(fits && t >= 0 && t < vocab, "\"{}\"[{}] = {} is outside the vocab of {}", what, i, a[i].dump(),
                      vocab);
        ids.push_back(int32_t(t));
    }
    return ids;
}

std::string message_text(const json& content, size_t i) {
    if (content.is_string()) return content.get<std::string>();
    LATTICE_CHECK(content.is_array(), "\"messages\"[{}].content must be a string or an array of text parts", i);
    std::string text;
    for (const json& part : content) {
        LATTICE_CHECK(
            part.is_object() && part.value("type", "") == "text" && part.contains("text") && part["text"].is_string(),
            "\"messages\"[{}].content: only {{\"type\": \"text\", \"text\": ...}} parts are supported", i);
        text += part["text"].get<std::string>();
    }
    return text;
}

// The prompt's ids: "messages" through the chat template, or "prompt" (text or ids).
std::vector<int32_t> api_prompt(const json& b, bool chat, const Tokenizer* tok, const ApiLimits& lim) {
    std::vector<int32_t> prompt;
    if (chat) {
        LATTICE_CHECK(b.contains("messages"), "\"messages\" is required");
        const json& m = b["messages"];
        LATTICE_CHECK(m.is_array() && !m.empty(), "\"messages\" must be a non-empty array");
        LATTICE_CHECK(tok != nullptr, "this model has no tokenizer, so it cannot take \"messages\"");
        LATTICE_CHECK(tok->chat_template_kind() != ChatTemplateKind::kNone,
                      "this model's tokenizer has no recognised chat template");
        std::vector<ChatMessage> msgs;
        for (size_t i = 0; i < m.size(); ++i) {
            LATTICE_CHECK(m[i].is_object() && m[i].contains("role") && m[i]["role"].is_string(),
                          "\"messages\"[{}] must be an object with a string \"role\"", i);
            const std::string role = m[i]["role"].get<std::string>();
            LATTICE_CHECK(role == "system" || role == "user" || role == "assistant",
                          "\"messages\"[{}].role \"{}\" is not system, user or assistant", i, role);
            LATTICE_CHECK(m[i].contains("content"), "\"messages\"[{}].content is required", i);
            msgs.push_back({role, message_text(m[i]["content"], i)});
        }
        prompt = tok->encode(tok->chat_template().render(msgs, true), false, true);
    } else {
        LATTICE_CHECK(b.contains("prompt"), "\"prompt\" is required");
        json p = b["prompt"];
        if (p.is_array() && p.size() == 1 && p[0].is_string()) p = p[0];  // ["text"]
        if (p.is_string()) {
            LATTICE_CHECK(tok != nullptr, "this model has no tokenizer: give \"prompt\" as token ids");
            const std::string text = p.get<std::string>();
            LATTICE_CHECK(!text.empty(), "\"prompt\" is empty");
            prompt = tok->encode(text, tok->add_bos_default(), false);
        } else if (p.is_array()) {
            prompt = token_ids(p, "prompt", lim.vocab);
        } else {
            LATTICE_FAIL("\"prompt\" must be a string or an array of token ids");
        }
    }
    LATTICE_CHECK(!prompt.empty(), "the prompt is empty");
    return prompt;
}

// "stop": a string or up to 4 non-empty strings (they need a tokenizer: they apply to the text).
std::vector<std::string> stop_strings(const json& b, const Tokenizer* tok) {
    std::vector<std::string> stop;
    if (!b.contains("stop") || b["stop"].is_null()) return stop;
    const json& s = b["stop"];
    if (s.is_string()) {
        stop.push_back(s.get<std::string>());
    } else {
        LATTICE_CHECK(s.is_array() && s.size() <= 4, "\"stop\" must be a string or an array of up to 4 strings");
        for (size_t i = 0; i < s.size(); ++i) {
            LATTICE_CHECK(s[i].is_string(), "\"stop\"[{}] must be a string", i);
            stop.push_back(s[i].get<std::string>());
        }
    }
    for (const std::string& x : stop) LATTICE_CHECK(!x.empty(), "\"stop\" strings must not be empty");
    LATTICE_CHECK(stop.empty() || tok != nullptr, "\"stop\" strings need a model with a tokenizer");
    return stop;
}

// Fields lattice does not implement yet are refused, never accepted and ignored: a client asking for
// logprobs or a JSON schema must not get a 200 that silently lacks them. Their neutral values pass
// (null, false, 0-length, {"type": "text"}).
void refuse_unsupported(const json& b) {
    auto given = [&](const char* key) { return b.contains(key) && !b[key].is_null(); };
    for (const char* key : {"logprobs", "echo"})
        LATTICE_CHECK(!given(key) || b[key] == false, "\"{}\" is not supported yet", key);
    LATTICE_CHECK(!given("top_logprobs"), "\"top_logprobs\" is not supported yet");
    for (const char* key : {"logit_bias", "tools", "functions"})
        LATTICE_CHECK(!given(key) || b[key].empty(), "\"{}\" is not supported yet", key);
    const json text_format = {{"type", "text"}};
    LATTICE_CHECK(!given("response_format") || b["response_format"] == text_format,
                  "\"response_format\" other than {{\"type\": \"text\"}} is not supported yet");
}

}  // namespace

ApiRequest parse_api_request(const json& b, bool chat, const Tokenizer* tok, const ApiLimits& lim) {
    LATTICE_CHECK(b.is_object(), "the request body must be a JSON object");
    ApiRequest r;
    r.chat = chat;
    if (b.contains("model") && !b["model"].is_null()) {
        LATTICE_CHECK(b["model"].is_string(), "\"model\" must be a string");
        r.model = b["model"].get<std::string>();
    }
    refuse_unsupported(b);
    ClientRequest& q = r.client;
    q.prompt = api_prompt(b, chat, tok, lim);
    int64_t max_tokens = chat ? ClientRequest::kRestOfContext : 16;
    if (chat && b.contains("max_completion_tokens") && !b["max_completion_tokens"].is_null())
        max_tokens = integer(b, "max_completion_tokens", 1, INT32_MAX, max_tokens);
    else
        max_tokens = integer(b, "max_tokens", 1, INT32_MAX, max_tokens);
    q.max_tokens = max_tokens;
    q.min_tokens = integer(b, "min_tokens", 0, INT32_MAX, 0);
    q.ignore_eos = boolean(b, "ignore_eos", false);
    q.priority = integer(b, "priority", INT32_MIN, INT32_MAX, 0);
    q.sampling.temperature = float(number(b, "temperature", 0.0, 100.0, 1.0));
    q.sampling.top_p = float(number(b, "top_p", 1e-9, 1.0, 1.0));
    const int64_t top_k = integer(b, "top_k", -1, INT32_MAX, 0);
    q.sampling.top_k = top_k < 0 ? 0 : top_k;
    if (b.contains("seed") && !b["seed"].is_null()) {
        q.sampling.seed = uint64_t(integer(b, "seed", INT64_MIN, INT64_MAX, 0));
        r.seed_given = true;
    } else {
        q.sampling.seed = std::random_device{}() * 0x9e3779b97f4a7c15ull ^ std::random_device{}();
    }
    LATTICE_CHECK(integer(b, "n", 1, 1, 1) == 1, "\"n\" must be 1");
    q.stop = stop_strings(b, tok);
    // The same SamplingParams (and Sampler) as the CLI's --presence-penalty, --frequency-penalty,
    // --min-p, --repeat-penalty / --repeat-last-n (runtime/engine/sampler.h).
    q.sampling.presence_penalty = float(number(b, "presence_penalty", -2.0, 2.0, 0.0));
    q.sampling.frequency_penalty = float(number(b, "frequency_penalty", -2.0, 2.0, 0.0));
    q.sampling.min_p = float(number(b, "min_p", 0.0, 1.0, 0.0));
    q.sampling.repeat_penalty = float(number(b, "repetition_penalty", 1e-6, 1e6, 1.0));
    q.sampling.repeat_last_n = integer(b, "repeat_last_n", -1, INT32_MAX, -1);
    r.stream = boolean(b, "stream", false);
    if (b.contains("stream_options") && !b["stream_options"].is_null()) {
        LATTICE_CHECK(b["stream_options"].is_object(), "\"stream_options\" must be an object");
        r.include_usage = boolean(b["stream_options"], "include_usage", false);
    }
    return r;
}

}  // namespace lattice
