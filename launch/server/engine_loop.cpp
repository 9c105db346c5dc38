// EngineLoop (see engine_loop.h).
#include "launch/server/engine_loop.h"

#include <fmt/format.h>

#include "base/error.h"
#include "base/log.h"

namespace lattice::serve {

namespace {

double seconds(Clock::duration d) {
    return std::chrono::duration<double>(d).count();
}

Delta error_delta(int status, std::string message) {
    Delta d;
    d.kind = Delta::Kind::kError;
    d.status = status;
    d.message = std::move(message);
    return d;
}

}  // namespace

EngineLoop::EngineLoop(EngineClient& client, Inbox& inbox, Metrics& metrics, LoopOptions opt)
    : client_(client), inbox_(inbox), metrics_(metrics), opt_(opt) {
    LATTICE_CHECK(client_.is_leader(), "the serve loop runs on the leader (world rank 0)");
    publish();
}

void EngineLoop::refuse(Ticket& t, int status, std::string message) {
    t.deliver(error_delta(status, std::move(message)));
    ++totals_.refused;
}

void EngineLoop::take(const Inbox::Item& it) {
    Ticket& t = *it.ticket;
    if (it.cancel) {
        auto found = live_.find(t.engine_id);
        if (t.engine_id < 0 || found == live_.end() || found->second.ticket != it.ticket) return;
        client_.cancel(t.engine_id);  // its last event is ignored: the ticket is gone from live_
        live_.erase(found);
        metrics_.count_finish("cancelled");
        ++totals_.cancelled;
        return;
    }
    if (client_.draining()) return refuse(t, 503, "the server is shutting down and takes no new requests");
    if (client_.scheduler().waiting() >= opt_.max_queue)
        return refuse(t, 503,
                      fmt::format("too many requests are waiting ({}, --max-queue); retry later",
                                  client_.scheduler().waiting()));
    const int64_t prompt_tokens = int64_t(t.request.client.prompt.size());
    try {
        t.engine_id = client_.submit(std::move(t.request.client));
    } catch (const Error& e) {
        return refuse(t, 400, e.message());
    }
    ++totals_.requests;
    Delta d;
    d.kind = Delta::Kind::kAccepted;
    d.prompt_tokens = prompt_tokens;
    t.deliver(std::move(d));
    live_.emplace(t.engine_id, Live{it.ticket, 0, {}});
}

void EngineLoop::apply(const ClientEvent& ev) {
    auto it = live_.find(ev.id);
    if (it == live_.end()) return;  // cancelled by its client
    Live& l = it->second;
    if (ev.finish == FinishReason::kCancelled) {  // not by its client (that one left live_): a drain
        l.ticket->deliver(error_delta(
            503, ev.drained ? "the server shut down before this request finished (--drain-seconds)"
                            : "the engine cancelled this request"));
        metrics_.count_finish("cancelled");
        totals_.cut_by_drain += ev.drained;
        live_.erase(it);
        return;
    }
    Delta d;
    d.kind = Delta::Kind::kTokens;
    d.text = ev.text;
    if (ev.token >= 0) {
        const Clock::time_point now = Clock::now();
        if (l.completion_tokens == 0)
            metrics_.observe_ttft(seconds(now - l.ticket->arrived));
        else
            metrics_.observe_itl(seconds(now - l.last_token));
        if (ev.queue_seconds >= 0) metrics_.observe_queue(ev.queue_seconds);
        l.last_token = now;
        ++l.completion_tokens;
        ++totals_.tokens;
        d.tokens.push_back(ev.token);
    }
    if (ev.finish == FinishReason::kNone) {
        if (!d.text.empty() || !d.tokens.empty()) l.ticket->deliver(std::move(d));
        return;
    }
    const std::string reason(finish_reason_name(ev.finish));
    d.kind = Delta::Kind::kFinish;
    d.finish_reason = reason;
    d.prompt_tokens = ev.prompt_tokens;
    d.completion_tokens = ev.completion_tokens;
    l.ticket->deliver(std::move(d));
    metrics_.observe_finished(reason, seconds(Clock::now() - l.ticket->arrived), ev.prompt_tokens,
                              ev.completion_tokens);
    live_.erase(it);
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
        const bool busy = client_.busy();
        for (const Inbox::Item& it : inbox_.take(std::chrono::milliseconds(busy ? 0 : 20))) take(it);
        for (const ClientEvent& ev : client_.poll()) apply(ev);
        publish();
        log_status(false);
        if (client_.draining() && live_.empty() && !client_.busy()) {
            for (const Inbox::Item& it : inbox_.take(std::chrono::milliseconds(0))) take(it);  // refused: draining
            break;
        }
    }
    log_status(true);
}

}  // namespace lattice::serve
