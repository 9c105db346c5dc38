// The seam between the HTTP threads and the engine thread of `lattice serve`.
//
//   HTTP thread --(Inbox: submit / cancel)--> engine thread (rank 0's main thread: Engine::step)
//   engine thread --(Ticket::deliver(Delta): a post onto the connection's strand)--> HTTP thread
//
// A Ticket is one API request in flight. The HTTP side creates it with the parsed request and a
// deliver function (which must be cheap and thread-safe: it only posts to the connection's
// executor and holds the connection weakly, so a dead connection makes delivery a no-op), then
// submits it. The engine thread answers with Deltas, in order: kAccepted (admitted to the engine)
// then kTokens* (each for one choice, by `index`; a choice's last one carries its finish_reason),
// then exactly one kFinish (every choice ended: usage); or a single kError instead (refused, queue
// full, drain), also after some kTokens (a drain cut the request).
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

#include "launch/openai_request.h"

namespace lattice::serve {

using Clock = std::chrono::steady_clock;

struct Delta {
    enum class Kind { kAccepted, kTokens, kFinish, kError };
    Kind kind = Kind::kTokens;
    int64_t index = 0;              // kTokens: the sequence (choice_requests order: prompt * best_of + i)
    bool echo = false;              // kTokens: the prompt itself (echo), its logprobs (first: NaN, no context)
    std::string text;               // kTokens: newly visible text (stop strings held back)
    std::vector<int32_t> tokens;    // kTokens: the new token ids
    std::vector<float> logprobs;    // kTokens: each token's log-softmax
    std::vector<std::vector<SampledToken>> top;  // kTokens, when logprobs are asked: each token's most likely
    std::string finish_reason;      // kTokens: on a choice's last delta, "stop" | "length"
    int64_t prompt_tokens = 0;      // kAccepted, kFinish (every prompt once)
    int64_t completion_tokens = 0;  // kFinish (every sequence's)
    int status = 0;                 // kError: HTTP status (400, 503 ...)
    std::string message;            // kError
};

struct Ticket {
    ApiRequest request;                        // parsed body (the engine thread moves its prompt out)
    std::function<void(Delta&&)> deliver;      // thread-safe, never blocks
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
