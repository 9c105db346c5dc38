// The simulated device (`--device sim`): the engine at scale without the hardware.
//
// Everything above the kernels runs for real over MPI: the leader's scheduler, the plan exchange,
// the pipeline hand-offs (hidden rows of the real byte count, [tokens, hidden] in 16 bits) and a TP
// all-reduce of the real per-layer byte count each step; what a forward computes is replaced by
// waiting out the time parallel/plan_model predicts for that step on the named GPU and link (its
// roofline, all-reduces included), or a fixed --sim-step-ms. No weights exist: the model is built
// shape-only (ModelOptions::shape_only), so `--random-weights --config llama-2-70b` starts in
// seconds on 8 ranks of a laptop. The sampler rank returns pseudo-tokens, a hash of the sequence id
// and the position (never an eos id), so a request runs to its max_tokens.
//
// Why here and shaped so: the engine runs the simulated device as one of its two ModelRunners
// (runtime/engine/sim_runner.h, beside the BackendRunner of the real model), chosen when the engine is
// built, because what is simulated is the model's forward, not a backend's kernels (a Backend with
// no-op kernels would still need the weights to be allocated and "uploaded", 140 GB for a 70B model);
// this file holds the device's step-time model so that the runner only asks "how long does this step
// take here". The wait is a sleep, not a busy-wait: the ranks of a simulated 8-GPU job share a few
// cores, and a spinning rank would steal the time the others need to run the
// real scheduler and communication (sleep overshoot is tens of microseconds against steps of
// milliseconds; the engine counts the whole step as compute either way).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/plan_model.h"

namespace lattice {

struct SimDeviceOptions {
    std::string gpu = "a100-pcie-40gb";  // a device_table() name
    std::string link = "pcie4";          // a link_table() name
    double step_ms = 0;                  // > 0: every stage step takes this long instead
};

class SimDevice {
public:
    // This rank's stage of a tp x pp layout of a model of shape `dims`, weights as `quant`.
    SimDevice(const SimDeviceOptions& o, const ModelDims& dims, int tp, int pp, int stage, PlanQuant quant,
              int64_t max_batch_tokens);
    // Seconds this stage's forward of `tokens` tokens takes, attending to `positions` cached ones
    // on average, with `sampled` rows through the head.
    double step_seconds(int64_t tokens, double positions, int64_t sampled) const;
    // Bytes of one TP all-reduce of `tokens` hidden rows (16-bit activations).
    int64_t hidden_bytes(int64_t tokens) const { return tokens * hidden_ * 2; }
    int tp() const { return tp_; }
    std::string describe() const;

    // The sampled token of sequence `seq` at `position`: a hash, never one of `eos`.
    static int32_t pseudo_token(int64_t seq, int64_t position, int64_t vocab, const std::vector<int64_t>& eos);

private:
    SimDeviceOptions opt_;
    PlanRequest req_;
    int tp_ = 1, pp_ = 1, stage_ = 0;
    int64_t hidden_ = 0;
};

}  // namespace lattice
