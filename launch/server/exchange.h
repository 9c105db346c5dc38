// The seam between the HTTP threads and the engine thread of `lattice serve`.
//
//   HTTP thread --(Inbox: submit / cancel)--> engine thread (rank 0's main thread: Engine::step)
//   engine thread --(Ticket::deliver(Delta): a post onto the connection's strand)--> HTTP thread
//
// A Ticket is one API request in flight. The HTTP side creates it with the parsed request and a
// deliver function (which must be cheap and thread-safe: it only posts to the connection's
// executor and holds the connection weakly, so a dead connection makes delivery a no-op), then
// submits it. The engine thread answers with Deltas (launch/openai/response.h), in their order:
// kAccepted, kTokens*, then one kFinish; or a single kError instead.
// After kFinish / kError nothing more is delivered for that ticket. A cancel for a ticket that has
// already finished (or was never admitted) is ignored.
// Invariants: `request_id` and the request's prompt are touched by the engine thread only once
// submitted; everything else is written before submit() and read-only afterwards.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "launch/openai/response.h"

namespace lattice::serve {

using Clock = std::chrono::steady_clock;

struct Ticket {
    openai::ApiRequest request;                // parsed body (the engine thread moves its prompt out)
    std::function<void(openai::Delta&&)> deliver;  // thread-safe, never blocks
    Clock::time_point arrived = Clock::now();  // for time-to-first-token
    // engine thread only:
    int64_t request_id = -1;                    // the engine client's id, once admitted
    std::vector<Clock::time_point> last_token;  // by choice: its last token's time (inter-token latency)
    bool first_token = false;                   // time-to-first-token observed
};

// Multi-producer (HTTP threads), single-consumer (engine thread) queue of submissions and cancels.
class Inbox {
public:
    struct Item {
        std::shared_ptr<Ticket> ticket;
        bool cancel = false;
    };
    void submit(std::shared_ptr<Ticket> t) { push({std::move(t), false}); }
    void cancel(std::shared_ptr<Ticket> t) { push({std::move(t), true}); }
    // Everything queued, in order; waits up to `wait` when nothing is.
    std::vector<Item> take(std::chrono::milliseconds wait) {
        std::unique_lock lock(mu_);
        if (items_.empty() && wait.count() > 0) cv_.wait_for(lock, wait, [&] { return !items_.empty(); });
        std::vector<Item> out(std::make_move_iterator(items_.begin()), std::make_move_iterator(items_.end()));
        items_.clear();
        return out;
    }
    // Drops what is queued (shutdown: the tickets' connections are gone with the server).
    void clear() {
        std::lock_guard lock(mu_);
        items_.clear();
    }

private:
    void push(Item it) {
        {
            std::lock_guard lock(mu_);
            items_.push_back(std::move(it));
        }
        cv_.notify_one();
    }
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Item> items_;
};

}  // namespace lattice::serve
