// The engine's result and accounting types (vLLM v1's IterationStats / SchedulerStats in spirit),
// shared by its parts and its fronts: the every-rank
// run's request and results (GenerateRequest, GenerateResult, GenerateStats), where a rank's time
// went (StepBreakdown) and the counters each rank keeps (EngineCounters: the runner adds compute,
// waits and sampling, the executor the plans' sends).
// Invariant: a StepBreakdown's five parts (compute, communication, pipeline_bubble, sampling,
// host_overhead) sum to its wall time.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/engine/scheduler.h"

namespace lattice {

// The every-rank convenience API (tools, tests) takes the engine's own request: ignore_eos lets the
// model's eos pass, stop_ids still end the sequence (runtime/engine/client.h adds the tokenizer's
// end-of-generation ids unless ignore_eos).
using GenerateRequest = EngineRequest;

// Where one rank's wall time went over a run (seconds; the five parts sum to wall):
//   compute          inside the model (embed, layers, head) but not in its TP communicator;
//   communication    in the TP communicator (all-reduces, the logits' all-gather; Model::comm_seconds);
//   pipeline_bubble  blocked on a peer: the previous stage's activations, the sampler's tokens
//                    (leader), the leader's next plan (followers);
//   sampling         the sampler rank's per-sequence sampling and log-softmax;
//   host_overhead    the rest: scheduling, plan encoding, sends, the front's callbacks.
// plan_wait (leader) is the part of host_overhead spent in the plans' send calls, plan_blocked the
// part of that waiting for a follower kPlanQueue plans behind (see send_plan); not parts of the sum.
struct StepBreakdown {
    int rank = 0, tp_rank = 0, pp_rank = 0;
    int64_t steps = 0;  // forwards this rank ran
    double wall = 0, compute = 0, communication = 0, pipeline_bubble = 0, sampling = 0, host_overhead = 0;
    double plan_wait = 0;
    double plan_blocked = 0;  // of plan_wait, waiting for a follower kPlanQueue plans behind
    int64_t plan_bytes = 0;   // leader: encoded plan bytes sent (to each follower)
};

struct GenerateStats {
    int64_t prompt_tokens = 0;     // over all sequences
    double prefill_seconds = 0;    // until every sequence had its first token
    int64_t generated_tokens = 0;  // over all sequences
    double decode_seconds = 0;     // the rest
    double idle_seconds = 0;       // this rank, blocked waiting for peers
    double compute_seconds = 0;    // this rank, inside the model (embed, layers, head) and sampling
    int64_t sequences = 1;
    int64_t preemptions = 0;
    int64_t peak_kv_blocks = 0;
    int64_t cached_prompt_tokens = 0;
    int64_t drafted_tokens = 0;   // speculative decoding: drafts fed
    int64_t accepted_tokens = 0;  // ... and accepted
    std::vector<StepBreakdown> per_rank;  // every world rank's, in rank order (every rank gets all)
};

// generate_batch's per-token callback (leader only): sequence index, token. kNone goes on; any other
// reason ends that sequence now, with that reason (a front's stop string: kStop; a user's
// interrupt: kCancelled). The token is part of the result either way.
using TokenCallback = std::function<FinishReason(int64_t seq, int32_t token)>;

struct GenerateResult {
    std::vector<int32_t> tokens;  // generated ids (the stop token included when one ended the run)
    std::vector<float> logprobs;  // of each generated token: log-softmax of the model's raw logits
                                  // (temperature 1, before penalties, bans and truncation)
    FinishReason finish = FinishReason::kNone;
    GenerateStats stats;
};

// What a rank has done so far (every rank keeps its own).
struct EngineCounters {
    int64_t steps = 0;
    double compute_seconds = 0;  // embed, layers, head and sampling, TP communication included
    double sample_seconds = 0;   // of which sampling (sampler rank)
    double wait_seconds = 0;     // blocked on a peer: pipeline receive, the leader's token receive, the next plan
    int64_t graph_steps = 0;     // of the steps, decode steps run through a step graph (eager warm-ups included)
    int64_t graph_replays = 0;   // of those, replays of a captured graph
    int64_t graphs_captured = 0; // step graphs captured (one per batch-size bucket used)
    double plan_wait_seconds = 0;  // leader: in the plans' send calls (wall: copies, MPI, and waits)
    double plan_blocked_seconds = 0;  // leader: of which waiting for a follower (a full plan queue)
    double plan_cpu_seconds = 0;      // leader: of which its thread ran (the rest: descheduled, or blocked)
    double sim_overrun_seconds = 0;   // simulated device: real work of a step past the step's predicted time
    int64_t plans_sent = 0;        // leader: plans sent (steps, heartbeats, shutdown)
    int64_t plan_bytes = 0;        // leader: their encoded bytes (per follower)
};

}  // namespace lattice
