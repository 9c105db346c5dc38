// parse_api_request and the request checks of the OpenAI protocol (see request.h).
#include "launch/openai/request.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <list>
#include <mutex>
#include <random>
#include <set>

#include "base/error.h"
#include "base/json_limits.h"
#include "launch/openai/messages.h"
#include "launch/openai/tools.h"

namespace lattice::openai {

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
        LATTICE_CHECK(a[i].is_number_integer(), "{}[{}] must be a token id (an integer)", what, i);
        // The value as sent (an unsigned one above INT64_MAX must not wrap into a negative id).
        const bool fits = !a[i].is_number_unsigned() || a[i].get<uint64_t>() <= uint64_t(INT64_MAX);
        const int64_t t = fits ? a[i].get<int64_t>() : -1;
        LATTICE_CHECK(fits && t >= 0 && t < vocab, "{}[{}] = {} is outside the vocab of {}", what, i, a[i].dump(),
                      vocab);
        ids.push_back(int32_t(t));
    }
    return ids;
}

std::vector<int32_t> prompt_text(const json& p, const Tokenizer* tok, const std::string& what) {
    LATTICE_CHECK(tok != nullptr, "this model has no tokenizer: give {} as token ids", what);
    const std::string text = p.get<std::string>();
    LATTICE_CHECK(!text.empty(), "{} is empty", what);
    return tok->encode(text, tok->add_bos_default(), false);
}

std::vector<int32_t> chat_prompt(const json& b, const Tokenizer* tok, ToolUse& use) {
    LATTICE_CHECK(b.contains("messages"), "\"messages\" is required");
    const json& m = b["messages"];
    LATTICE_CHECK(m.is_array() && !m.empty(), "\"messages\" must be a non-empty array");
    LATTICE_CHECK(tok != nullptr, "this model has no tokenizer, so it cannot take \"messages\"");
    LATTICE_CHECK(tok->chat_template_kind() != ChatTemplateKind::kNone,
                  "this model's tokenizer has no recognised chat template");
    use = parse_tool_use(b, *tok);
    return tok->encode(render_chat(normalize_messages(m), b, *tok, use), false, true);
}

// The prompts' ids: "messages" through the chat template (one prompt), or "prompt": a string, token
// ids, or a list of either (one prompt each).
std::vector<std::vector<int32_t>> api_prompts(const json& b, bool chat, const Tokenizer* tok, const ApiLimits& lim,
                                              ToolUse& tools) {
    std::vector<std::vector<int32_t>> prompts;
    if (chat) {
        prompts.push_back(chat_prompt(b, tok, tools));
    } else {
        LATTICE_CHECK(b.contains("prompt"), "\"prompt\" is required");
        const json& p = b["prompt"];
        const bool list = p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array());
        if (p.is_string()) {
            prompts.push_back(prompt_text(p, tok, "\"prompt\""));
        } else if (list) {
            LATTICE_CHECK(int64_t(p.size()) <= ApiRequest::kMaxChoices, "\"prompt\": {} prompts, at most {}", p.size(),
                          ApiRequest::kMaxChoices);
            for (size_t i = 0; i < p.size(); ++i) {
                const std::string what = fmt::format("\"prompt\"[{}]", i);
                LATTICE_CHECK(p[i].is_string() == p[0].is_string() && (p[i].is_string() || p[i].is_array()),
                              "{} must be a {} like \"prompt\"[0]", what,
                              p[0].is_string() ? "string" : "token-id array");
                prompts.push_back(p[i].is_string() ? prompt_text(p[i], tok, what)
                                                   : token_ids(p[i], what.c_str(), lim.vocab));
            }
        } else if (p.is_array()) {
            prompts.push_back(token_ids(p, "\"prompt\"", lim.vocab));
        } else {
            LATTICE_FAIL("\"prompt\" must be a string, an array of token ids, or an array of either");
        }
    }
    for (const auto& q : prompts) LATTICE_CHECK(!q.empty(), "the prompt is empty");
    return prompts;
}

// "stop": a string or up to 4 non-empty strings (they need a tokenizer: they apply to the text).
std::vector<std::string> stop_strings(const json& b, const Tokenizer* tok) {
    std::vector<std::string> stop;
    if (!field_given(b, "stop")) return stop;
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

// Every field is known or refused (null is the same as absent): a client asking for something lattice does not do (a JSON schema,
// tools, a misspelt field) must not get a 200 that silently lacks it. Unimplemented fields pass with
// their neutral values (null, false, empty, {"type": "text"}).
void refuse_unknown(const json& b, bool chat) {
    static const std::set<std::string, std::less<>> kCommon = {
        "model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "stream_options", "n",
        "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "user", "metadata", "store",
        "service_tier", "response_format", "min_tokens", "ignore_eos", "priority", "min_p", "repetition_penalty",
        "repeat_last_n", "return_token_ids", "prompt_logprobs", "guided_json", "guided_regex", "guided_choice",
        "guided_grammar", "guided_decoding_backend", "guided_whitespace_pattern"};
    static const std::set<std::string, std::less<>> kCompletions = {"prompt", "best_of", "echo", "suffix"};
    static const std::set<std::string, std::less<>> kChat = {
        "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "functions", "function_call",
        "parallel_tool_calls", "modalities", "audio", "prediction"};
    for (const auto& [key, value] : b.items())
        LATTICE_CHECK(value.is_null() || kCommon.count(key) || (chat ? kChat : kCompletions).count(key),
                      "\"{}\" is not a field of {} requests that lattice knows", key,
                      chat ? "chat completion" : "completion");
    for (const char* key : {"logit_bias", "functions", "function_call", "suffix", "audio", "modalities",
                            "prediction"})
        LATTICE_CHECK(!field_given(b, key) || b[key].empty() || b[key] == "none" || b[key] == "",
                      "\"{}\" is not supported yet", key);
    LATTICE_CHECK(!field_given(b, "store") || b["store"] == false, "\"store\" is not supported (stored completions)");
    for (const char* key : {"guided_grammar", "guided_whitespace_pattern"})
        LATTICE_CHECK(!field_given(b, key), "\"{}\" is not supported (guided_json, guided_regex, guided_choice and "
                                   "response_format are)", key);
}

// Structured output: OpenAI's response_format (json_object, json_schema) or vLLM's guided_json /
// guided_regex / guided_choice, at most one of them. The spec, compiled later (grammar_of).
GrammarSpec grammar_spec(const json& b, std::string& field) {
    GrammarSpec g;
    std::vector<std::string> named;
    if (field_given(b, "response_format")) {
        const json& f = b["response_format"];
        LATTICE_CHECK(f.is_object() && f.contains("type") && f["type"].is_string(),
                      "\"response_format\" must be an object with a \"type\" (text, json_object or json_schema)");
        const std::string type = f["type"].get<std::string>();
        if (type == "json_object") {
            g.kind = GrammarSpec::Kind::kJsonObject;
        } else if (type == "json_schema") {
            LATTICE_CHECK(f.contains("json_schema") && f["json_schema"].is_object(),
                          "\"response_format\": type json_schema needs a \"json_schema\" object");
            const json& js = f["json_schema"];
            const json schema = js.contains("schema") && !js["schema"].is_null() ? js["schema"] : json::object();
            LATTICE_CHECK(schema.is_object() || schema.is_boolean(),
                          "\"response_format\".json_schema.schema must be a JSON schema (an object)");
            g.kind = GrammarSpec::Kind::kJsonSchema;
            g.source = schema.dump();
        } else {
            LATTICE_CHECK(type == "text",
                          "\"response_format\" type \"{}\" is unknown (text, json_object or json_schema)", type);
        }
        if (g.active()) named.push_back("response_format");
    }
    if (field_given(b, "guided_json")) {
        const json& s = b["guided_json"];
        LATTICE_CHECK(s.is_object() || s.is_string(), "\"guided_json\" must be a JSON schema (an object, or its text)");
        g.kind = GrammarSpec::Kind::kJsonSchema;
        g.source = s.is_string() ? s.get<std::string>() : s.dump();
        named.push_back("guided_json");
    }
    if (field_given(b, "guided_regex")) {
        LATTICE_CHECK(b["guided_regex"].is_string(), "\"guided_regex\" must be a string (a regular expression)");
        g.kind = GrammarSpec::Kind::kRegex;
        g.source = b["guided_regex"].get<std::string>();
        named.push_back("guided_regex");
    }
    if (field_given(b, "guided_choice")) {
        const json& c = b["guided_choice"];
        LATTICE_CHECK(c.is_array() && !c.empty(), "\"guided_choice\" must be a non-empty array of strings");
        g.kind = GrammarSpec::Kind::kChoice;
        for (size_t i = 0; i < c.size(); ++i) {
            LATTICE_CHECK(c[i].is_string(), "\"guided_choice\"[{}] must be a string", i);
            g.choices.push_back(c[i].get<std::string>());
        }
        named.push_back("guided_choice");
    }
    LATTICE_CHECK(named.size() <= 1, "\"{}\" and \"{}\" both constrain the output: give one", named[0], named[1]);
    if (!named.empty()) field = named[0];
    if (field_given(b, "guided_decoding_backend"))
        LATTICE_CHECK(b["guided_decoding_backend"].is_string(), "\"guided_decoding_backend\" must be a string");
    return g;
}

// Compiled grammars by spec: a schema is compiled once, whatever number of requests use it (the
// last kCacheSize specs are kept). Errors name the field the spec came from.
std::shared_ptr<const Grammar> grammar_of(const GrammarSpec& spec, const char* field) {
    constexpr size_t kCacheSize = 64;
    static std::mutex mu;
    static std::list<std::pair<std::string, std::shared_ptr<const Grammar>>> cache;  // most recent first
    const std::string key = spec.key();
    {
        std::lock_guard lock(mu);
        for (auto it = cache.begin(); it != cache.end(); ++it)
            if (it->first == key) {
                cache.splice(cache.begin(), cache, it);
                return it->second;
            }
    }
    std::shared_ptr<const Grammar> g;
    try {
        g = Grammar::compile(spec);
    } catch (const Error& e) {
        throw Error(fmt::format("\"{}\": {}", field, e.message()));
    }
    std::lock_guard lock(mu);
    cache.emplace_front(key, g);
    if (cache.size() > kCacheSize) cache.pop_back();
    return g;
}

// logprobs (completions: k; chat: true plus top_logprobs k), echo, n and best_of.
void parse_choices(const json& b, ApiRequest& r) {
    const int32_t kMax = SamplingParams::kMaxLogprobs;
    if (r.chat) {
        const bool on = boolean(b, "logprobs", false);
        const int64_t k = integer(b, "top_logprobs", 0, kMax, 0);
        LATTICE_CHECK(on || !field_given(b, "top_logprobs"),
                      "\"top_logprobs\" needs \"logprobs\": true");
        r.logprobs = on ? int32_t(k) : -1;
    } else {
        const bool off = !field_given(b, "logprobs") || b["logprobs"] == false;
        LATTICE_CHECK(off || b["logprobs"].is_number(),
                      "\"logprobs\" must be an integer in [0, {}] (the number of most likely tokens)", kMax);
        r.logprobs = off ? -1 : int32_t(integer(b, "logprobs", 0, kMax, -1));
        r.echo = boolean(b, "echo", false);
    }
    r.client.sampling.logprobs = std::max(r.logprobs, 0);
    r.n = integer(b, "n", 1, ApiRequest::kMaxChoices, 1);
    r.best_of = r.chat ? r.n : integer(b, "best_of", 1, ApiRequest::kMaxChoices, r.n);
    LATTICE_CHECK(r.best_of >= r.n, "\"best_of\" ({}) must be at least \"n\" ({})", r.best_of, r.n);
    LATTICE_CHECK(r.best_of == r.n || !r.stream, "\"best_of\" greater than \"n\" cannot be streamed");
    LATTICE_CHECK(int64_t(r.prompts.size()) * r.best_of <= ApiRequest::kMaxChoices,
                  "{} prompts x \"best_of\"/\"n\" {} is more than {} sequences", r.prompts.size(), r.best_of,
                  ApiRequest::kMaxChoices);
    LATTICE_CHECK(r.client.max_tokens != 0 || r.echo, "\"max_tokens\" 0 needs \"echo\": true");
    // vLLM's prompt_logprobs: the prompt's tokens scored, not streamed (vLLM's rule).
    r.prompt_logprobs = int32_t(integer(b, "prompt_logprobs", 0, kMax, -1));
    LATTICE_CHECK(r.prompt_logprobs < 0 || !r.stream, "\"prompt_logprobs\" are not available with \"stream\": true");
}

}  // namespace

ApiRequest parse_api_request(const json& b, bool chat, const Tokenizer* tok, const ApiLimits& lim) {
    LATTICE_CHECK(b.is_object(), "the request body must be a JSON object");
    ApiRequest r;
    r.chat = chat;
    if (field_given(b, "model")) {
        LATTICE_CHECK(b["model"].is_string(), "\"model\" must be a string");
        r.model = b["model"].get<std::string>();
    }
    refuse_unknown(b, chat);
    ClientRequest& q = r.client;
    r.prompts = api_prompts(b, chat, tok, lim, r.tools);
    q.prompt = r.prompts[0];
    const bool echo = !chat && b.contains("echo") && b["echo"] == true;
    int64_t max_tokens = chat ? ClientRequest::kRestOfContext : 16;
    if (chat && field_given(b, "max_completion_tokens"))
        max_tokens = integer(b, "max_completion_tokens", 1, INT32_MAX, max_tokens);
    else
        max_tokens = integer(b, "max_tokens", echo ? 0 : 1, INT32_MAX, max_tokens);
    q.max_tokens = max_tokens;
    q.min_tokens = integer(b, "min_tokens", 0, INT32_MAX, 0);
    // vLLM's rule: a floor above the cap cannot be met (the chat default, the rest of the context, is no cap).
    LATTICE_CHECK(max_tokens == ClientRequest::kRestOfContext || q.min_tokens <= max_tokens,
                  "\"min_tokens\" ({}) must be at most \"max_tokens\" ({})", q.min_tokens, max_tokens);
    q.ignore_eos = boolean(b, "ignore_eos", false);
    q.priority = integer(b, "priority", INT32_MIN, INT32_MAX, 0);
    q.sampling.temperature = float(number(b, "temperature", 0.0, 100.0, 1.0));
    q.sampling.top_p = float(number(b, "top_p", 1e-9, 1.0, 1.0));
    const int64_t top_k = integer(b, "top_k", -1, INT32_MAX, 0);
    q.sampling.top_k = top_k < 0 ? 0 : top_k;
    if (field_given(b, "seed")) {
        q.sampling.seed = uint64_t(integer(b, "seed", INT64_MIN, INT64_MAX, 0));
        r.seed_given = true;
    } else {
        q.sampling.seed = std::random_device{}() * 0x9e3779b97f4a7c15ull ^ std::random_device{}();
    }
    q.stop = stop_strings(b, tok);
    // The same SamplingParams (and Sampler) as the CLI's --presence-penalty, --frequency-penalty,
    // --min-p, --repeat-penalty / --repeat-last-n (runtime/engine/sampler.h).
    q.sampling.presence_penalty = float(number(b, "presence_penalty", -2.0, 2.0, 0.0));
    q.sampling.frequency_penalty = float(number(b, "frequency_penalty", -2.0, 2.0, 0.0));
    q.sampling.min_p = float(number(b, "min_p", 0.0, 1.0, 0.0));
    q.sampling.repeat_penalty = float(number(b, "repetition_penalty", 1e-6, 1e6, 1.0));
    q.sampling.repeat_last_n = integer(b, "repeat_last_n", -1, INT32_MAX, -1);
    r.stream = boolean(b, "stream", false);
    if (field_given(b, "stream_options")) {
        LATTICE_CHECK(b["stream_options"].is_object(), "\"stream_options\" must be an object");
        r.include_usage = boolean(b["stream_options"], "include_usage", false);
    }
    parse_choices(b, r);
    std::string field;
    if (const GrammarSpec spec = grammar_spec(b, field); spec.active()) {
        LATTICE_CHECK(tok != nullptr,
                      "structured output (\"response_format\", \"guided_*\") needs a model with a tokenizer");
        LATTICE_CHECK(!r.tools.forced, "\"tool_choice\" forcing a call cannot be combined with \"{}\"", field);
        q.grammar = grammar_of(spec, field.c_str());
    } else if (r.tools.forced) {
        q.grammar = grammar_of(r.tools.grammar, "tools");
    }
    return r;
}

std::vector<ClientRequest> choice_requests(const ApiRequest& r) {
    std::vector<ClientRequest> out;
    for (const std::vector<int32_t>& p : r.prompts)
        for (int64_t i = 0; i < r.best_of; ++i) {
            ClientRequest q = r.client;
            q.prompt = p;
            q.sampling.seed = r.client.sampling.seed + uint64_t(i);
            out.push_back(std::move(q));
        }
    return out;
}

nlohmann::json parse_body(std::string_view body, int max_depth) {
    JsonLimits lim;
    lim.max_depth = max_depth;
    check_json_limits(body, "the request body", lim);
    nlohmann::json j = nlohmann::json::parse(body.begin(), body.end(), nullptr, false);
    LATTICE_CHECK(!j.is_discarded(), "the body is not valid JSON");
    return j;
}

// max_tokens beyond the room the longest prompt leaves in the context: refused, not clamped (vLLM's).
void check_context(const ApiRequest& r, int64_t context) {
    if (r.client.max_tokens == ClientRequest::kRestOfContext || context <= 0) return;
    for (const auto& p : r.prompts) {
        const int64_t n = int64_t(p.size());
        LATTICE_CHECK(n < context || (n == context && r.client.max_tokens == 0),
                      "\"prompt\": {} tokens, the context holds {} (max_model_len) and the prompt must leave room",
                      n, context);
        LATTICE_CHECK(n + r.client.max_tokens <= context,
                      "\"max_tokens\" is {}, but the prompt has {} tokens and the context holds {} (max_model_len): "
                      "at most {} new tokens",
                      r.client.max_tokens, n, context, context - n);
    }
}

bool parse_return_token_ids(const nlohmann::json& body, const Tokenizer* tok) {
    const auto it = body.find("return_token_ids");
    LATTICE_CHECK(it == body.end() || it->is_null() || it->is_boolean(), "\"return_token_ids\" must be true or false");
    return !tok || (it != body.end() && it->is_boolean() && it->get<bool>());
}

}  // namespace lattice::openai
