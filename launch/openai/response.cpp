// The response JSON of the OpenAI protocol (see response.h).
#include "launch/openai/response.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "base/error.h"

namespace lattice::openai {

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

// Responses keep their fields in the order written (OpenAI's; a completions top_logprobs dict most
// likely first).
using ojson = nlohmann::ordered_json;

std::string dump(const json& j) {
    // Generated text may hold bytes that never form UTF-8: they become U+FFFD, not an exception.
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string dump(const ojson& j) {
    return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

}  // namespace

std::string json_text(const json& j) { return dump(j); }

std::string error_json(int status, std::string_view message, std::string_view param, std::string_view code) {
    json e = {{"message", std::string(message)},
              {"type", std::string(error_type(status))},
              {"param", param.empty() ? json(nullptr) : json(std::string(param))},
              {"code", code.empty() ? json(nullptr) : json(std::string(code))}};
    return dump(json{{"error", e}});
}

Delta token_delta(const ClientEvent& ev, bool top) {
    Delta d;
    d.kind = Delta::Kind::kTokens;
    d.index = ev.index;
    d.text = ev.text;
    if (ev.token >= 0) {
        d.tokens.push_back(ev.token);
        d.logprobs.push_back(ev.logprob);
        if (top) d.top.push_back(ev.top);
    }
    if (ev.finish != FinishReason::kNone && ev.finish != FinishReason::kCancelled)
        d.finish_reason = finish_reason_name(ev.finish);
    return d;
}

Delta finish_delta(const ClientEvent& ev) {
    Delta f;
    f.kind = Delta::Kind::kFinish;
    f.prompt_tokens = ev.request_prompt_tokens;
    f.completion_tokens = ev.request_completion_tokens;
    f.cached_tokens = ev.request_cached_tokens;
    return f;
}

std::string error_param(std::string_view msg) {
    const size_t a = msg.find('"');
    if (a == std::string_view::npos) return {};
    const size_t b = msg.find('"', a + 1);
    if (b == std::string_view::npos || b == a + 1 || b - a > 40) return {};
    return std::string(msg.substr(a + 1, b - a - 1));
}

ResponseShaper::ResponseShaper(const ApiCall& c)
    : chat_(c.request.chat),
      stream_(c.request.stream),
      include_usage_(c.request.include_usage),
      token_ids_(c.return_token_ids),
      logprobs_(c.request.logprobs),
      prompt_logprobs_(c.request.prompt_logprobs),
      echo_(c.request.echo),
      n_(c.request.n),
      best_of_(c.request.best_of),
      tok_(c.tokenizer),
      id_(c.id),
      model_(c.model),
      created_(c.created),
      tools_(c.request.tools),
      choices_(std::max<size_t>(1, c.request.prompts.size()) * size_t(c.request.best_of)) {
    if (echo_)
        for (const auto& p : c.request.prompts) prompt_texts_.push_back(tok_ ? tok_->decode(p) : std::string());
    for (Choice& ch : choices_) ch.tool_stream = ToolCallStream(tools_.format, tools_.forced);
}

ojson ResponseShaper::chunk_base() const {
    ojson j = {{"id", id_},
              {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
              {"created", created_},
              {"model", model_}};
    if (include_usage_) j["usage"] = nullptr;
    return j;
}

std::string ResponseShaper::event(const ojson& j) {
    return "data: " + dump(j) + "\n\n";
}

std::string ResponseShaper::token_string(int32_t id) const {
    return tok_ ? tok_->token_bytes(id) : fmt::format("token_id:{}", id);
}

namespace {

// JSON has no infinity (and NaN, a prompt's first token, is written null).
ojson logprob_value(float lp) {
    if (std::isnan(lp)) return nullptr;
    return std::isinf(lp) ? -9999.0 : double(lp);
}

ojson bytes_of(const std::string& s) {
    ojson b = ojson::array();
    for (unsigned char ch : s) b.push_back(int(ch));
    return b;
}

}  // namespace

// The logprobs of c's tokens from index `from` on, in the endpoint's shape.
ojson ResponseShaper::logprobs_json(Choice& c, size_t from) const {
    if (logprobs_ < 0) return nullptr;
    ojson content = ojson::array(), tokens = ojson::array(), lps = ojson::array(), tops = ojson::array(),
         offsets = ojson::array();
    for (size_t i = from; i < c.ids.size(); ++i) {
        const std::string t = token_string(c.ids[i]);
        const bool has_top = i < c.top.size() && !(std::isnan(c.logprobs[i]));
        if (chat_) {
            ojson alts = ojson::array();
            if (has_top)
                for (const SampledToken& a : c.top[i]) {  // (chat has no echo: k entries)
                    const std::string at = token_string(a.token);
                    alts.push_back({{"token", at}, {"logprob", logprob_value(a.logprob)}, {"bytes", bytes_of(at)}});
                }
            content.push_back(
                {{"token", t}, {"logprob", logprob_value(c.logprobs[i])}, {"bytes", bytes_of(t)}, {"top_logprobs", alts}});
            continue;
        }
        tokens.push_back(t);
        lps.push_back(logprob_value(c.logprobs[i]));
        if (has_top) {
            ojson alts = ojson::object();
            for (size_t k = 0; k < c.top[i].size() && k < size_t(logprobs_); ++k)
                alts[token_string(c.top[i][k].token)] = logprob_value(c.top[i][k].logprob);
            alts[t] = logprob_value(c.logprobs[i]);  // the chosen token too (vLLM's)
            tops.push_back(alts);
        } else {
            tops.push_back(nullptr);
        }
        offsets.push_back(c.offset);
        c.offset += t.size();
    }
    if (chat_) return {{"content", content}};
    return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

// echo with generated tokens: the prompt's text before the choice's first.
std::string ResponseShaper::echo_text(Choice& c, int64_t index, const Delta& d) {
    if (!echo_ || c.echoed) return {};
    c.echoed = true;
    if (d.echo) return {};  // the delta is the prompt itself
    return prompt_texts_[size_t(index / best_of_)];
}

std::string ResponseShaper::accepted() {
    if (!stream_ || !chat_) return {};
    std::string out;
    for (int64_t i = 0; i < int64_t(choices_.size()); ++i) {
        ojson j = chunk_base();
        j["choices"] = ojson::array({{{"index", i},
                                     {"delta", {{"role", "assistant"}, {"content", ""}}},
                                     {"logprobs", nullptr},
                                     {"finish_reason", nullptr}}});
        out += event(j);
    }
    return out;
}

// vLLM's prompt_logprobs of a prompt delta: [null, {"ID": {"logprob", "rank", "decoded_token"}}, ...].
ojson ResponseShaper::prompt_logprobs_json(const Delta& d) const {
    ojson out = ojson::array();
    for (size_t i = 0; i < d.tokens.size(); ++i) {
        if (i == 0 || i >= d.logprobs.size() || std::isnan(d.logprobs[i])) {
            out.push_back(nullptr);
            continue;
        }
        ojson row = ojson::object();
        const auto entry = [&](int32_t id, float lp, int64_t rank) {
            row[std::to_string(id)] = {
                {"logprob", logprob_value(lp)}, {"rank", rank}, {"decoded_token", token_string(id)}};
        };
        entry(d.tokens[i], d.logprobs[i], i < d.ranks.size() ? d.ranks[i] : 0);
        if (i < d.top.size())
            for (size_t k = 0; k < d.top[i].size() && k < size_t(prompt_logprobs_); ++k)
                if (d.top[i][k].token != d.tokens[i]) entry(d.top[i][k].token, d.top[i][k].logprob, int64_t(k) + 1);
        out.push_back(std::move(row));
    }
    return out;
}

std::string ResponseShaper::tokens(const Delta& d) {
    LATTICE_CHECK(d.index >= 0 && d.index < int64_t(choices_.size()), "response: choice {} of {}", d.index,
                  choices_.size());
    Choice& c = choices_[size_t(d.index)];
    if (d.echo && prompt_logprobs_ >= 0) c.prompt_lps = prompt_logprobs_json(d);
    if (d.echo && !echo_) return {};  // prompt_logprobs alone: the prompt is not part of the choice
    const std::string text = echo_text(c, d.index, d) + d.text;
    const size_t from = c.ids.size();
    c.text += text;
    c.ids.insert(c.ids.end(), d.tokens.begin(), d.tokens.end());
    c.logprobs.insert(c.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
    c.top.insert(c.top.end(), d.top.begin(), d.top.end());
    if (!d.echo)
        for (float lp : d.logprobs) c.sum += double(lp);
    if (!d.finish_reason.empty()) c.finish = d.finish_reason;
    if (!stream_) return {};
    if (chat_ && tools_.parse) return tool_chunk(c, d);
    // Held back (a possible stop string) with nothing else to say: no chunk yet.
    if (text.empty() && !token_ids_ && (logprobs_ < 0 || d.tokens.empty()) && d.finish_reason.empty()) return {};
    ojson choice = {{"index", d.index},
                   {"logprobs", logprobs_json(c, from)},
                   {"finish_reason", d.finish_reason.empty() ? ojson(nullptr) : ojson(d.finish_reason)}};
    if (chat_)
        choice["delta"] = d.finish_reason.empty() || !text.empty() ? ojson{{"content", text}} : ojson::object();
    else
        choice["text"] = text;
    if (token_ids_) choice["token_ids"] = d.tokens;
    ojson j = chunk_base();
    j["choices"] = ojson::array({choice});
    return event(j);
}

std::string ResponseShaper::finish(const Delta& d) {
    const ojson usage = {{"prompt_tokens", d.prompt_tokens},
                         {"completion_tokens", d.completion_tokens},
                         {"total_tokens", d.prompt_tokens + d.completion_tokens},
                         {"prompt_tokens_details", {{"cached_tokens", d.cached_tokens}}}};
    if (!stream_) {
        ojson choices = ojson::array();
        for (size_t p = 0; p * size_t(best_of_) < choices_.size(); ++p) {
            // best_of > n: the n with the highest cumulative logprob (a stable order: ties by sequence).
            std::vector<size_t> order(static_cast<size_t>(best_of_));
            for (size_t i = 0; i < order.size(); ++i) order[i] = p * size_t(best_of_) + i;
            std::stable_sort(order.begin(), order.end(),
                             [&](size_t a, size_t b) { return choices_[a].sum > choices_[b].sum; });
            if (best_of_ == n_) std::sort(order.begin(), order.end());
            for (int64_t j = 0; j < n_; ++j) {
                Choice& c = choices_[order[size_t(j)]];
                c.offset = 0;
                ojson choice = {{"index", int64_t(p) * n_ + j},
                               {"logprobs", logprobs_json(c, 0)},
                               {"finish_reason", c.finish}};
                if (chat_ && tools_.parse)
                    choice["message"] = tool_message(c, int64_t(p) * n_ + j, choice["finish_reason"], false);
                else if (chat_)
                    choice["message"] = {{"role", "assistant"}, {"content", c.text}};
                else
                    choice["text"] = c.text;
                if (token_ids_) choice["token_ids"] = c.ids;
                if (!chat_ && prompt_logprobs_ >= 0) choice["prompt_logprobs"] = c.prompt_lps;
                choices.push_back(choice);
            }
        }
        ojson body = {{"id", id_},           {"object", chat_ ? "chat.completion" : "text_completion"},
                      {"created", created_}, {"model", model_},
                      {"choices", choices},  {"usage", usage}};
        if (chat_ && prompt_logprobs_ >= 0)
            body["prompt_logprobs"] = choices_.empty() ? nullptr : choices_[0].prompt_lps;
        return dump(body);
    }
    std::string out;
    if (include_usage_) {
        ojson u = chunk_base();
        u["choices"] = ojson::array();
        u["usage"] = usage;
        out += event(u);
    }
    return out + "data: [DONE]\n\n";
}

ToolCallOutput ResponseShaper::tool_calls_of(const Choice& c) const {
    ToolCallOutput out = tools_.forced ? parse_forced_call(c.text, tools_.format)
                                       : parse_tool_calls(c.text, tools_.format, tools_.names);
    if (!tools_.parallel && out.calls.size() > 1) out.calls.resize(1);  // parallel_tool_calls: false
    return out;
}

std::string ResponseShaper::call_id_prefix(int64_t index) const {
    return fmt::format("call_{}_{}_", id_.substr(id_.find('-') + 1), index);
}

// A streamed chat with tools: the calls as they are written (tool_stream.h), the rest at the end.
std::string ResponseShaper::tool_chunk(Choice& c, const Delta& d) {
    const bool last = !d.finish_reason.empty();
    ToolCallStream::Piece piece = c.tool_stream.push(c.text, tools_.names, call_id_prefix(d.index));
    ojson finish = nullptr;
    if (last) {
        const ToolCallOutput out = tool_calls_of(c);
        const ToolCallStream::Piece rest = c.tool_stream.finish(out, call_id_prefix(d.index));
        piece.content += rest.content;
        for (const ojson& x : rest.calls) piece.calls.push_back(x);
        finish = out.calls.empty() ? c.finish : "tool_calls";
    }
    if (!tools_.parallel) {  // parallel_tool_calls false: the first call only
        ojson first = ojson::array();
        for (const ojson& x : piece.calls)
            if (x["index"] == 0) first.push_back(x);
        piece.calls = std::move(first);
    }
    if (piece.empty() && !last) return {};
    ojson delta = ojson::object();
    if (!piece.content.empty()) delta["content"] = piece.content;
    if (!piece.calls.empty()) delta["tool_calls"] = piece.calls;
    ojson choice = {
        {"index", d.index}, {"delta", delta}, {"logprobs", logprobs_json(c, c.sent)}, {"finish_reason", finish}};
    if (token_ids_) choice["token_ids"] = std::vector<int32_t>(c.ids.begin() + std::ptrdiff_t(c.sent), c.ids.end());
    c.sent = c.ids.size();
    ojson j = chunk_base();
    j["choices"] = ojson::array({choice});
    return event(j);
}

// A chat message whose text is parsed for tool calls (runtime/tokenizer/tool_calls.h): content (null
// when there is none) and tool_calls (`streamed`: each led by its "index", as a stream's deltas
// carry them); with calls, `finish` becomes "tool_calls".
ojson ResponseShaper::tool_message(const Choice& c, int64_t index, ojson& finish, bool streamed) const {
    const ToolCallOutput out = tool_calls_of(c);
    ojson m = {{"role", "assistant"}, {"content", out.content.empty() && !out.calls.empty() ? ojson(nullptr)
                                                                                            : ojson(out.content)}};
    if (out.calls.empty()) {
        finish = c.finish;
        return m;
    }
    ojson calls = ojson::array();
    for (size_t k = 0; k < out.calls.size(); ++k) {
        ojson call = streamed ? ojson{{"index", int64_t(k)}} : ojson::object();
        call["id"] = call_id_prefix(index) + std::to_string(k);
        call["type"] = "function";
        call["function"] = {{"name", out.calls[k].name}, {"arguments", out.calls[k].arguments}};
        calls.push_back(std::move(call));
    }
    m["tool_calls"] = calls;
    finish = "tool_calls";
    return m;
}

std::string ResponseShaper::stream_error(int status, std::string_view message) {
    return "data: " + error_json(status, message) + "\n\n";
}

}  // namespace lattice::openai
