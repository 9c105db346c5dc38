// The engine thread of `lattice serve` (rank 0's main thread, which owns MPI and the model):
//   loop: take submissions and cancels from the Inbox (waiting up to 20 ms when the engine is
//         idle) -> EngineClient::poll() (one engine round; also the idle heartbeat to the
//         followers) -> its events as Deltas to the tickets -> the engine's gauges to Metrics.
// Text, stop strings, the context budget and finish reasons are the engine client's
// (runtime/engine/client.h); this loop only maps them to tickets and HTTP statuses.
// A request with n / best_of > 1 or a list of prompts is one client request of several choices
// (choice_requests, launch/openai/request.h; EngineClient::submit runs each prompt's siblings once its first
// sequence has a token, so the prefix cache serves them); its Deltas carry the choice index.
// A request whose prompts are scored (echo, with logprobs or max_tokens 0; prompt_logprobs) is scored
// (EngineClient::score) between engine rounds once no request runs (such requests wait while the engine
// is busy); its prompt deltas come first, then, unless max_tokens is 0, it runs as any other.
// Admission: a submission is refused with 503 when --max-queue requests already wait in the
// engine, with 400 when the client refuses it (a prompt that fills the context, more KV blocks
// than the pool holds ...).
// Drain: when drain_signal() turns non-zero, on_drain() is called once (the server answers /health
// with 503 and refuses new requests, its listener still open) and the client drains: new submissions get 503; running requests finish until
// --drain-seconds have passed, then the client cancels them and their clients get a 503 error (an
// error event on a stream). run() returns once nothing is left in the engine.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>

#include "launch/server/exchange.h"
#include "launch/server/lora_catalog.h"
#include "launch/server/metrics.h"
#include "runtime/engine/client.h"

namespace lattice::serve {

struct LoopOptions {
    int64_t max_queue = 256;    // requests waiting in the engine at most; more: 503
    double drain_seconds = 30;  // after a drain signal, how long running requests may go on
    double log_every_s = 10;    // a status line while requests run (0: never)
    LoraCatalog* loras = nullptr;  // the adapters' runtime loads and unloads (applied before submissions)
};

struct LoopTotals {
    int64_t requests = 0, refused = 0, cancelled = 0, cut_by_drain = 0, tokens = 0;
};

class EngineLoop {
public:
    EngineLoop(EngineClient& client, Inbox& inbox, Metrics& metrics, LoopOptions opt);
    void run(const std::function<int()>& drain_signal, const std::function<void()>& on_drain);
    const LoopTotals& totals() const { return totals_; }

private:
    void take(const Inbox::Item& it);
    void apply(const ClientEvent& ev);
    void admit(const std::shared_ptr<Ticket>& t, std::vector<openai::Delta> prompt_deltas);
    void score(const std::shared_ptr<Ticket>& t);  // echo, prompt_logprobs: the prompts' logprobs
    // Delivers the error (OpenAI's "param" / "code" when given) and counts the request refused.
    void refuse(Ticket& t, int status, std::string message, std::string param = "", std::string code = "");
    std::optional<std::string> request_adapter(Ticket& t);
    void publish();
    void log_status(bool force);

    EngineClient& client_;
    Inbox& inbox_;
    Metrics& metrics_;
    LoopOptions opt_;
    std::unordered_map<int64_t, std::shared_ptr<Ticket>> live_;  // by the client's request id
    std::deque<std::shared_ptr<Ticket>> scores_;  // echo with max_tokens 0, scored once the engine is idle
    LoopTotals totals_;
    Clock::time_point last_log_ = Clock::now();
    int64_t logged_tokens_ = 0;
};

}  // namespace lattice::serve
