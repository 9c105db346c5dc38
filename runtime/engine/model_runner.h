// ModelRunner: what runs a step plan on one rank (vLLM v1's ModelRunner, the Worker's part that
// executes a SchedulerOutput). Two implementations:
//   BackendRunner (backend_runner.h)  the model on its Backend (CPU or CUDA): embed or receive the
//                                     previous stage's rows, the layers, the hand-off or the head,
//                                     decode steps through captured step graphs, sampling and draft
//                                     verification on the sampler rank (StepSampler);
//   SimRunner (sim_runner.h)          the simulated device: the same hand-offs and one TP all-reduce
//                                     of the real byte counts, the predicted step time waited out,
//                                     pseudo-tokens on the sampler rank.
// The engine chooses one when it is built; its loops never ask which (no `if (sim)` in them).
// Invariants: execute() takes the same branches on every rank for the same plan (they depend on the
// plan only), so the collectives and hand-offs inside match across ranks; only the sampler rank fills
// the results; the runner adds its time to the EngineCounters it was given (compute, wait, sampling,
// steps, graph counts).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/engine/engine_stats.h"
#include "runtime/engine/sampler.h"
#include "runtime/engine/step_plan.h"

namespace lattice {

class Communicator;

// A step's results, filled on the sampler rank.
struct StepResults {
    std::vector<SampledToken> tokens;  // kStep: plan.sample_slots() slots (a sequence's accepted drafts,
                                       // one more token, then -1s)
    std::vector<SampledToken> top;     // per sampled sequence in plan order, its sampling.logprobs best
    std::vector<float> logits;         // kScore: [tokens, vocab]
};

// The links of this rank to the others (from the builder's ParallelContext).
struct PipelineLinks {
    Communicator* pipe = nullptr;   // this rank's pipeline group (one rank per stage); null: one stage
    int prev = -1;                  // pipe rank of the previous stage, -1 on the first
    int next = -1;                  // pipe rank of the next stage, -1 on the last
    Communicator* world = nullptr;  // all ranks (host memory); null: a single rank
    Communicator* plans = nullptr;  // all ranks, the step plans only (a deep send queue); null: world
    Communicator* tp = nullptr;     // this stage's TP group: the simulated device's all-reduces
    int sampler = 0;                // world rank that samples
};

class ModelRunner {
public:
    virtual ~ModelRunner() = default;
    // Runs `p` through this rank's part of the model; on the sampler rank fills *out (tokens for a
    // kStep plan, logits for a kScore one).
    virtual void execute(const StepPlan& p, StepResults* out) = 0;
    // Sequences that ended: their per-sequence state (the sampler rank's samplers) is dropped.
    virtual void release(std::span<const int64_t> ids) = 0;
    // KV blocks of the model's cache the runner keeps for itself (the step graphs' padding block, the
    // last one); the leader's pool holds the others.
    virtual int64_t reserved_blocks() const { return 0; }
};

}  // namespace lattice
