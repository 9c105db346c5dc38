// EngineLoop (see engine_loop.h).
#include "launch/server/engine_loop.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/error.h"
#include "base/log.h"

namespace lattice::serve {

namespace {

double seconds(Clock::duration d) {
    return std::chrono::duration<double>(d).count();
}

openai::Delta error_delta(int status, std::string message, std::string param = "", std::string code = "") {
    openai::Delta d;
    d.kind = openai::Delta::Kind::kError;
    d.status = status;
    d.message = std::move(message);
    d.error_param = std::move(param);
    d.error_code = std::move(code);
    return d;
}

}  // namespace

EngineLoop::EngineLoop(EngineClient& client, Inbox& inbox, Metrics& metrics, LoopOptions opt)
    : client_(client), inbox_(inbox), metrics_(metrics), opt_(opt) {
    LATTICE_CHECK(client_.is_leader(), "the serve loop runs on the leader (world rank 0)");
    publish();
}

void EngineLoop::refuse(Ticket& t, int status, std::string message, std::string param, std::string code) {
    t.deliver(error_delta(status, std::move(message), std::move(param), std::move(code)));
    ++totals_.refused;
}

// The adapter the request runs with ("" for the base model), after the loads and unloads answered so far; none
// (refused with a 404 naming the model) when it names an adapter unloaded after its route accepted the name:
// never run on the base model.
std::optional<std::string> EngineLoop::request_adapter(Ticket& t) {
    const std::string& m = t.request.model;
    if (opt_.loras) opt_.loras->apply(client_.loras());  // a load answered before this request arrived
    if (m.empty() || client_.loras().has(m)) return m;
    if (!opt_.loras || m == opt_.loras->base()) return "";
    refuse(t, 404, fmt::format("the model '{}' does not exist (its LoRA adapter was unloaded)", m), "model",
           "model_not_found");
    return std::nullopt;
}

void EngineLoop::take(const Inbox::Item& it) {
    Ticket& t = *it.ticket;
    if (it.cancel) {
        const auto queued = std::find(scores_.begin(), scores_.end(), it.ticket);
        const auto running = live_.find(t.request_id);
        if (queued != scores_.end()) {
            scores_.erase(queued);
        } else if (t.request_id >= 0 && running != live_.end() && running->second == it.ticket) {
            client_.cancel(t.request_id);  // its last events are ignored: it is gone from live_
            live_.erase(running);
        } else {
            return;  // finished, or never admitted
        }
        metrics_.count_finish("cancelled");
        ++totals_.cancelled;
        return;
    }
    if (client_.draining()) return refuse(t, 503, "the server is shutting down and takes no new requests");
    const int64_t waiting = client_.scheduler().waiting() + client_.lora_waiting();  // (for a LoRA slot too)
    if (waiting >= opt_.max_queue)
        return refuse(t, 503, fmt::format("too many requests are waiting ({}, --max-queue); retry later", waiting));
    const openai::ApiRequest& r = t.request;
    const bool scored = openai::scores_prompt(r) || (r.echo && r.client.max_tokens == 0);
    if (scored) {  // the prompts scored when idle
        scores_.push_back(it.ticket);
        return;
    }
    admit(it.ticket, {});
}

// Into the engine, after the prompts' own deltas (echo, prompt_logprobs) when it has them.
void EngineLoop::admit(const std::shared_ptr<Ticket>& tp, std::vector<openai::Delta> prompt_deltas) {
    Ticket& t = *tp;
    if (client_.draining()) return refuse(t, 503, "the server is shutting down and takes no new requests");
    int64_t prompt_tokens = 0;
    for (const auto& p : t.request.prompts) prompt_tokens += int64_t(p.size());
    std::vector<ClientRequest> choices = openai::choice_requests(t.request);
    const std::optional<std::string> lora = request_adapter(t);
    if (!lora) return;
    for (ClientRequest& c : choices) c.lora = *lora;
    t.last_token.assign(choices.size(), Clock::time_point{});
    try {
        t.request_id = client_.submit(std::move(choices), t.request.best_of);
    } catch (const Error& e) {
        return refuse(t, 400, e.message());
    }
    ++totals_.requests;
    openai::Delta d;
    d.kind = openai::Delta::Kind::kAccepted;
    d.prompt_tokens = prompt_tokens;
    t.deliver(std::move(d));
    for (openai::Delta& p : prompt_deltas) t.deliver(std::move(p));
    live_.emplace(t.request_id, tp);
}

// The prompts' logprobs (EngineClient::prompt_logprobs, which needs an idle engine): echo's and
// prompt_logprobs' deltas; with max_tokens 0 they are the whole answer, else the request runs after them.
void EngineLoop::score(const std::shared_ptr<Ticket>& tp) {
    Ticket& t = *tp;
    const openai::ApiRequest& r = t.request;
    const Tokenizer* tok = client_.tokenizer();
    const bool only = r.client.max_tokens == 0;
    int64_t prompt_tokens = 0;
    std::vector<openai::Delta> choices;
    const std::optional<std::string> lora = request_adapter(t);  // scored with it
    if (!lora) return;
    try {
        for (size_t p = 0; p < r.prompts.size(); ++p) {
            const std::vector<int32_t>& ids = r.prompts[p];
            PromptLogprobs lp = client_.prompt_logprobs(ids, std::max(r.logprobs, r.prompt_logprobs), *lora);
            openai::Delta d;
            d.echo = true;
            d.text = tok ? tok->decode(ids) : "";
            d.tokens = ids;
            if (only) d.finish_reason = "length";
            d.logprobs = std::move(lp.logprobs);
            d.top = std::move(lp.top);
            d.ranks = std::move(lp.ranks);
            prompt_tokens += int64_t(ids.size());
            for (int64_t i = 0; i < r.best_of; ++i) {
                d.index = int64_t(p) * r.best_of + i;
                choices.push_back(d);
            }
        }
    } catch (const Error& e) {
        return refuse(t, 400, e.message());
    }
    if (!only) return admit(tp, std::move(choices));
    ++totals_.requests;
    openai::Delta a;
    a.kind = openai::Delta::Kind::kAccepted;
    a.prompt_tokens = prompt_tokens;
    t.deliver(std::move(a));
    for (openai::Delta& d : choices) t.deliver(std::move(d));
    openai::Delta f;
    f.kind = openai::Delta::Kind::kFinish;
    f.prompt_tokens = prompt_tokens;
    t.deliver(std::move(f));
    metrics_.count_finish("length");
}

void EngineLoop::apply(const ClientEvent& ev) {
    auto it = live_.find(ev.id);
    if (it == live_.end()) return;  // cancelled by its client
    const std::shared_ptr<Ticket> t = it->second;
    if (ev.finish == FinishReason::kCancelled) {  // not by its client (that one left live_): a drain
        live_.erase(it);
        client_.cancel(ev.id);  // the request as a whole is cut
        t->deliver(error_delta(503, ev.drained ? "the server shut down before this request finished (--drain-seconds)"
                                               : "the engine cancelled this request"));
        metrics_.count_finish("cancelled");
        totals_.cut_by_drain += ev.drained;
        return;
    }
    openai::Delta d = openai::token_delta(ev, t->request.logprobs >= 0);
    if (ev.token >= 0) {
        const Clock::time_point now = Clock::now();
        Clock::time_point& last = t->last_token[size_t(ev.index)];
        if (!t->first_token)
            metrics_.observe_ttft(seconds(now - t->arrived));
        else if (last != Clock::time_point{})
            metrics_.observe_itl(seconds(now - last));
        t->first_token = true;
        if (ev.queue_seconds >= 0) metrics_.observe_queue(ev.queue_seconds);
        last = now;
        ++totals_.tokens;
    }
    if (ev.finish == FinishReason::kNone) {
        if (!d.text.empty() || !d.tokens.empty()) t->deliver(std::move(d));
        return;
    }
    const std::string reason = d.finish_reason;
    t->deliver(std::move(d));
    if (!ev.last_of_request) return;
    live_.erase(it);
    openai::Delta f = openai::finish_delta(ev);
    metrics_.observe_finished(reason, seconds(Clock::now() - t->arrived), f.prompt_tokens, f.completion_tokens);
    t->deliver(std::move(f));
}

void EngineLoop::publish() {
    const Scheduler& s = client_.scheduler();
    EngineGauges g;
    g.running = s.running();
    g.waiting = s.waiting();
    g.blocks_used = s.pool().num_used();
    g.blocks_total = s.pool().num_blocks();
    g.preemptions = s.stats().preemptions;
    g.prompt_tokens = s.stats().prompt_tokens;
    g.generated_tokens = s.stats().generated_tokens;
    g.cached_tokens = s.stats().cached_tokens;
    g.drafted_tokens = s.stats().drafted_tokens;
    g.accepted_tokens = s.stats().accepted_tokens;
    for (const LoraInfo& i : client_.loras().list())
        g.loras.push_back(LoraGauge{i.name, i.requests, i.tokens, i.active, i.resident});
    g.max_loras = client_.loras().max_loras();
    metrics_.set_engine(g);
}

void EngineLoop::log_status(bool force) {
    if (opt_.log_every_s <= 0) return;
    const double dt = seconds(Clock::now() - last_log_);
    if (!force && (dt < opt_.log_every_s || totals_.tokens == logged_tokens_)) return;
    const EngineGauges g = metrics_.engine();
    LOG_INFO("serve: {} running, {} waiting, KV blocks {}/{}, {:.1f} tok/s, {} requests so far", g.running, g.waiting,
             g.blocks_used, g.blocks_total, dt > 0 ? double(totals_.tokens - logged_tokens_) / dt : 0.0,
             totals_.requests);
    last_log_ = Clock::now();
    logged_tokens_ = totals_.tokens;
}

void EngineLoop::run(const std::function<int()>& drain_signal, const std::function<void()>& on_drain) {
    for (;;) {
        if (!client_.draining() && drain_signal()) {
            LOG_INFO("serve: signal {}: not accepting; finishing {} request(s) (up to {:.0f} s)", drain_signal(),
                     live_.size(), opt_.drain_seconds);
            client_.drain(opt_.drain_seconds);
            on_drain();
        }
        if (opt_.loras) opt_.loras->apply(client_.loras());
        const bool busy = client_.busy();
        for (const Inbox::Item& it : inbox_.take(std::chrono::milliseconds(busy ? 0 : 20))) take(it);
        for (const ClientEvent& ev : client_.poll()) apply(ev);
        while (!scores_.empty() && !client_.busy()) {
            const std::shared_ptr<Ticket> t = scores_.front();
            scores_.pop_front();
            score(t);
        }
        publish();
        log_status(false);
        if (client_.draining() && live_.empty() && scores_.empty() && !client_.busy()) {
            for (const Inbox::Item& it : inbox_.take(std::chrono::milliseconds(0))) take(it);  // refused: draining
            break;
        }
    }
    log_status(true);
}

}  // namespace lattice::serve
