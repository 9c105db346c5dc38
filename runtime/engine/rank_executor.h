// RankExecutor: how the ranks of one engine talk (vLLM v1's Executor and its workers' RPC: the leader
// hands each step to every rank, the sampler rank hands the tokens back). It is the only part of the
// engine that uses the communicators (the model's TP and pipeline traffic stays in ModelRunner).
// Messages on the plans communicator (links.plans, else links.world):
//   leader -> every rank, per plan:  kPlanHead bytes: int64 size, then the encoded StepPlan's first
//                                    bytes (step_plan.h); a longer plan: one more message with the rest.
// On the world communicator:
//   sampler -> leader, per kStep:    SampledToken[1 + slots + top]: {slots, 0}, a token per slot
//                                    (plan.sample_slots()), the top logprobs asked for;
//                      per kScore:   f32 logits [tokens, vocab];
//   every rank, after a run:         the run's statistics and results (broadcasts, gather_breakdowns).
// Plans are numbered 1, 2, ... by the leader (number()); a follower checks they arrive in order. The
// block tables travel as changes against what every follower already knows (PlanTables), so the
// leader encodes once for all. Sends are buffered kPlanQueue plans deep per follower
// (parallel_context.h): the leader blocks only when some follower is that many plans behind (the time
// in the sends is plan_wait, the part of it waiting for such a follower plan_blocked).
// Followers run follow(): plans until the leader's shutdown; an idle leader sends a heartbeat at least
// every heartbeat_s (heartbeat_if_due), so a follower's receive deadline fires only on a dead leader.
// With one rank (no world communicator) nothing is sent and every rank-collective is the identity.
// Invariants: plan numbers have no gaps (a heartbeat or a shutdown takes one too); the leader's and
// every follower's PlanTables stay equal plan after plan; the sampler answers the step plans in the
// order it received them, and the leader reads the answers in the order it sent the plans.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "runtime/engine/engine_stats.h"
#include "runtime/engine/model_runner.h"
#include "runtime/engine/step_plan.h"

namespace lattice {

class RankExecutor {
public:
    static constexpr int64_t kPlanHead = 8192;  // a plan's first message: its size and up to 8184 of its bytes

    RankExecutor(PipelineLinks links, EngineCounters& counters);

    int rank() const { return rank_; }
    int world() const { return world_; }
    bool is_leader() const { return rank_ == 0; }
    bool is_sampler() const { return rank_ == links_.sampler; }

    // ---- leader ----
    void number(StepPlan& p) { p.number = ++number_; }  // the plan's place in the sequence followers check
    void send_plan(const StepPlan& p);
    // The sampler rank's results of `p` (the oldest plan it has not answered yet); `vocab` sizes a kScore's.
    StepResults recv_results(const StepPlan& p, int64_t vocab);
    // An idle leader's heartbeat, carrying `released`: sent when there are released ids or heartbeat_s
    // passed since the last plan (never with one rank).
    void heartbeat_if_due(std::vector<int64_t> released, double heartbeat_s);
    // Tells the followers to leave follow().
    void send_shutdown(std::vector<int64_t> released);

    // ---- followers ----
    StepPlan recv_plan();
    void send_results(const StepPlan& p, const StepResults& r);
    // Runs the leader's plans through `runner` (the sampler rank answers each step) until its shutdown.
    void follow(ModelRunner& runner);

    // ---- every rank (collectives) ----
    std::vector<StepBreakdown> gather_breakdowns(const StepBreakdown& mine) const;
    // The leader's vector to every rank (its size first).
    void broadcast(std::vector<int64_t>& v) const;
    void broadcast(std::vector<int32_t>& v) const;
    void broadcast(std::vector<float>& v) const;

private:
    Communicator& plan_comm() const;

    PipelineLinks links_;
    EngineCounters& counters_;
    int rank_ = 0, world_ = 1;
    int64_t number_ = 0;      // last plan number sent / received
    PlanTables plan_tables_;  // the block tables the followers know (leader: sent; follower: received)
    std::chrono::steady_clock::time_point last_sent_;
};

}  // namespace lattice
