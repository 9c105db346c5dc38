// EngineCore: the leader's loop, schedule -> execute -> update (vLLM v1's EngineCore.step()), and
// nothing else. Each round it asks the Scheduler for steps while the pipeline has room (one step in
// flight per stage), hands each to every rank (RankExecutor) and runs it on its own rank
// (ModelRunner), then completes the oldest step: its sampled tokens, from this rank's runner when the
// leader samples or from the sampler rank otherwise, go to the Scheduler, which turns them into
// TokenEvents (appended tokens, stop rules, finishes). An idle round sends a heartbeat when due.
// Plans from outside the scheduler (score's logits) go through issue() / take_oldest().
// Invariants: steps complete in the order they were issued; a step's time from issue to results feeds
// the scheduler's cost model (kStep only); sequences that ended are released on the sampler rank
// before any later plan runs there; shutdown() waits out every step in flight before the followers
// are told to leave.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <utility>
#include <vector>

#include "runtime/engine/block_pool.h"
#include "runtime/engine/lora_registry.h"
#include "runtime/engine/model_runner.h"
#include "runtime/engine/rank_executor.h"
#include "runtime/engine/scheduler.h"

namespace lattice {

struct EngineCoreOptions {
    SchedulerOptions sched;      // (sched.vocab also sizes a score's logits)
    int64_t kv_blocks = 0;       // blocks of the pool (the model's, less the runner's reserved ones)
    int64_t block_size = 16;
    bool prefix_caching = true;
    int stages = 1;              // pipeline stages: steps in flight at most
    double heartbeat_s = 5.0;    // an idle leader pings the followers at least this often
    ModelConfig model;           // the base (LoRA adapters are checked against it)
    int64_t max_loras = 4, max_lora_rank = 64;  // LoraRegistry's
};

class EngineCore {
public:
    EngineCore(const EngineCoreOptions& opt, RankExecutor& exec, ModelRunner& runner);

    int64_t add(EngineRequest r) { return sched_.add(std::move(r)); }
    void cancel(int64_t id) { sched_.cancel(id); }
    bool busy() const { return !sched_.idle() || !inflight_.empty() || !done_.empty(); }
    // One round: issues steps while the pipeline has room, then completes the oldest in flight and
    // returns its tokens and finishes. Returns at once (heartbeat if due) when there is nothing to do.
    std::vector<TokenEvent> step();
    // Completes what is in flight, then tells the followers to leave follow().
    void shutdown();

    Scheduler& scheduler() { return sched_; }
    const Scheduler& scheduler() const { return sched_; }
    BlockPool& pool() { return pool_; }
    // The LoRA adapters on offer; their loads ride on the next issued plan.
    LoraRegistry& loras() { return loras_; }

    // Plans the scheduler did not make (score): issue while has_room(), take the results in order.
    bool has_room() const { return int64_t(inflight_.size() + done_.size()) < opt_.stages; }
    void issue(StepPlan p);
    std::pair<StepPlan, StepResults> take_oldest();
    void abandon() {  // forgets what is in flight (an error path: the followers are told to leave next)
        inflight_.clear();
        done_.clear();
    }

private:
    // The top alternatives of `r` onto the events of the sequences that asked for them.
    static void attach_top(const StepPlan& p, const StepResults& r, std::vector<TokenEvent>& events);
    std::vector<TokenEvent> complete_oldest();
    std::vector<int64_t> take_released();  // the scheduler's, released on this rank's runner too

    EngineCoreOptions opt_;
    RankExecutor& exec_;
    ModelRunner& runner_;
    BlockPool pool_;
    Scheduler sched_;
    LoraRegistry loras_;
    std::deque<StepPlan> inflight_;                       // issued, results pending from the sampler rank
    std::deque<std::pair<StepPlan, StepResults>> done_;  // completed on this rank (it samples), not applied
    std::map<int64_t, std::chrono::steady_clock::time_point> issued_at_;  // plan number -> when issued
};

}  // namespace lattice
