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

}  // namespace

EngineLoop::EngineLoop(Engine& engine, const Tokenizer* tok, Inbox& inbox, Metrics& metrics, LoopOptions opt)
    : engine_(engine), tok_(tok), inbox_(inbox), metrics_(metrics), opt_(opt) {
    LATTICE_CHECK(engine_.is_leader(), "the serve loop runs on the leader (world rank 0)");
    publish();
}

void EngineLoop::refuse(Ticket& t, int status, std::string message) {
    Delta d;
    d.kind = Delta::Kind::kError;
    d.status = status;
    d.message = std::move(message);
    t.deliver(std::move(d));
    ++totals_.refused;
}

void EngineLoop::take(const Inbox::Item& it) {
    Ticket& t = *it.ticket;
    if (it.cancel) {
        auto found = live_.find(t.engine_id);
        if (t.engine_id < 0 || found == live_.end() || found->second.ticket != it.ticket) return;
        engine_.cancel(t.engine_id);
        live_.erase(found);
        metrics_.count_finish("cancelled");
        ++totals_.cancelled;
        return;
    }
    if (draining_) return refuse(t, 503, "the server is shutting down and takes no new requests");
    if (engine_.scheduler().waiting() >= opt_.max_queue)
        return refuse(
            t, 503,
            fmt::format("too many requests are waiting ({}, --max-queue); retry later", engine_.scheduler().waiting()));
    Live l;
    l.ticket = it.ticket;
    l.prompt_tokens = int64_t(t.request.engine.prompt.size());
    if (tok_) l.text = std::make_unique<TextStream>(*tok_, t.request.stop);
    try {
        t.engine_id = engine_.add(std::move(t.request.engine));
    } catch (const Error& e) {
        return refuse(t, 400, e.message());
    }
    ++totals_.requests;
    Delta d;
    d.kind = Delta::Kind::kAccepted;
    d.prompt_tokens = l.prompt_tokens;
    t.deliver(std::move(d));
    live_.emplace(t.engine_id, std::move(l));
}

void EngineLoop::apply(const TokenEvent& ev) {
    auto it = live_.find(ev.id);
    if (it == live_.end()) return;  // cancelled by its client, or cut by a stop string
    Live& l = it->second;
    Delta d;
    d.kind = Delta::Kind::kTokens;
    bool stopped = false;
    if (ev.token >= 0) {
        const Clock::time_point now = Clock::now();
        if (l.completion_tokens == 0)
            metrics_.observe_ttft(seconds(now - l.ticket->arrived));
        else
            metrics_.observe_itl(seconds(now - l.last_token));
        l.last_token = now;
        ++l.completion_tokens;
        ++totals_.tokens;
        d.tokens.push_back(ev.token);
        if (l.text) {
            TextStream::Piece p = l.text->push(ev.token);
            d.text = std::move(p.text);
            stopped = p.stop;
        }
    }
    std::string reason;
    if (stopped) {
        engine_.cancel(ev.id);
        reason = "stop";
    } else if (ev.finish == FinishReason::kStop) {
        reason = "stop";
    } else if (ev.finish == FinishReason::kLength || ev.finish == FinishReason::kContextFull) {
        reason = "length";
    } else if (ev.finish == FinishReason::kCancelled) {  // not by us (we forget what we cancel): report it
        Delta e;
        e.kind = Delta::Kind::kError;
        e.status = 500;
        e.message = "the engine cancelled this request";
        l.ticket->deliver(std::move(e));
        metrics_.count_finish("cancelled");
        live_.erase(it);
        return;
    }
    if (reason.empty()) {
        if (!d.text.empty() || !d.tokens.empty()) l.ticket->deliver(std::move(d));
        return;
    }
    if (l.text && !stopped) d.text += l.text->finish();  // whatever was held back
    d.kind = Delta::Kind::kFinish;
    d.finish_reason = reason;
    d.prompt_tokens = l.prompt_tokens;
    d.completion_tokens = l.completion_tokens;
    l.ticket->deliver(std::move(d));
    metrics_.count_finish(reason);
    live_.erase(it);
}

void EngineLoop::publish() {
    const Scheduler& s = engine_.scheduler();
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
    Clock::time_point deadline{};
    for (;;) {
        if (!draining_ && drain_signal()) {
            draining_ = true;
            deadline = Clock::now() + std::chrono::milliseconds(int64_t(opt_.drain_seconds * 1000));
            LOG_INFO("serve: signal {}: not accepting; finishing {} request(s) (up to {:.0f} s)", drain_signal(),
                     live_.size(), opt_.drain_seconds);
            on_drain();
        }
        if (draining_ && !live_.empty() && Clock::now() >= deadline) {
            for (auto& [id, l] : live_) {
                engine_.cancel(id);
                Delta e;
                e.kind = Delta::Kind::kError;
                e.status = 503;
                e.message = "the server shut down before this request finished (--drain-seconds)";
                l.ticket->deliver(std::move(e));
                metrics_.count_finish("cancelled");
                ++totals_.cut_by_drain;
            }
            live_.clear();
        }
        const bool busy = engine_.busy();
        for (const Inbox::Item& it : inbox_.take(std::chrono::milliseconds(busy ? 0 : 20))) take(it);
        for (const TokenEvent& ev : engine_.step()) apply(ev);
        publish();
        log_status(false);
        if (draining_ && live_.empty() && !engine_.busy()) {
            for (const Inbox::Item& it : inbox_.take(std::chrono::milliseconds(0))) take(it);  // refused: draining
            break;
        }
    }
    log_status(true);
}

}  // namespace lattice::serve
