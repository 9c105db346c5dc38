// SimRunner: the ModelRunner (model_runner.h) of the simulated device (`--device sim`,
// runtime/backend/sim/sim_device.h); in vLLM v1's terms a ModelRunner whose forward is a timer.
// A step: the previous stage's hidden rows (16-bit, the real byte count), one TP all-reduce of a
// layer's real byte count, then a sleep until the predicted time of the whole stage step has passed
// since the rows arrived, the hand-off to the next stage, and on the sampler one pseudo-token per
// sampled sequence (its drafts refused). The model is shape-only: no weights, no logits to score.
// Invariant: every rank takes the same branches (they depend on the plan only), so the collectives
// match; the step counts as compute, and the real work that runs past the predicted time as
// sim_overrun_seconds.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/backend/sim/sim_device.h"
#include "runtime/engine/model_runner.h"
#include "runtime/model/model.h"

namespace lattice {

class SimRunner final : public ModelRunner {
public:
    SimRunner(const Model& model, std::shared_ptr<const SimDevice> sim, PipelineLinks links, int rank,
              EngineCounters& counters);
    void execute(const StepPlan& p, StepResults* out) override;
    void release(std::span<const int64_t>) override {}  // no per-sequence state

private:
    const Model& model_;
    std::shared_ptr<const SimDevice> sim_;
    PipelineLinks links_;
    int rank_ = 0;
    EngineCounters& counters_;
    std::vector<uint8_t> rows_;  // the simulated hidden rows (hand-offs, all-reduces)
};

}  // namespace lattice
