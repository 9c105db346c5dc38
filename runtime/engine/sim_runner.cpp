// SimRunner (see sim_runner.h).
#include "runtime/engine/sim_runner.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "base/clock.h"
#include "base/error.h"
#include "parallel/communicator.h"

namespace lattice {

namespace {
using Clock = SteadyClock;
constexpr auto since = seconds_since;
}  // namespace

SimRunner::SimRunner(const Model& model, std::shared_ptr<const SimDevice> sim, PipelineLinks links, int rank,
                     EngineCounters& counters)
    : model_(model), sim_(std::move(sim)), links_(links), rank_(rank), counters_(counters) {
    LATTICE_CHECK(sim_, "SimRunner without a simulated device");
}

void SimRunner::execute(const StepPlan& p, StepResults* out) {
    LATTICE_CHECK(p.kind == StepPlan::Kind::kStep, "the simulated device has no logits to score (step {})", p.number);
    const SimDevice& sim = *sim_;
    const ModelOptions& o = model_.options();
    const int64_t T = int64_t(p.tokens.size());
    double attended = 0;  // positions each token attends to, summed
    for (const PlanSeq& ps : p.seqs)
        attended += double(ps.count) * double(ps.start) + double(ps.count) * double(ps.count + 1) / 2.0;
    const int64_t sampled = p.sampled();
    rows_.resize(size_t(sim.hidden_bytes(T)));
    const View rows = View::contiguous(rows_.data(), DType::kU8, {int64_t(rows_.size())});
    double waited = 0;
    if (!o.first_stage) {
        const auto w0 = Clock::now();
        links_.pipe->recv(rows, links_.prev);
        waited = since(w0);
    }
    const auto t0 = Clock::now();
    if (sim.tp() > 1) {  // (as f32 words: the same bytes)
        LATTICE_CHECK(links_.tp, "simulated device: tp {} without a TP communicator", sim.tp());
        links_.tp->all_reduce_sum(View::contiguous(rows_.data(), DType::kF32, {int64_t(rows_.size() / 4)}));
    }
    const double step_s = sim.step_seconds(T, T > 0 ? attended / double(T) : 0.0, o.last_stage ? sampled : 0);
    // The real all-reduce counts against the step's predicted time (which includes the link): what
    // runs past it (a machine with fewer cores than ranks) is the simulation's overrun.
    counters_.sim_overrun_seconds += std::max(0.0, since(t0) - step_s);
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(step_s)));
    if (!o.last_stage) links_.pipe->send(rows, links_.next);
    if (rank_ == links_.sampler) {
        out->tokens.clear();
        for (const PlanSeq& ps : p.seqs) {
            if (!ps.sample) continue;
            out->tokens.push_back(SampledToken{
                SimDevice::pseudo_token(ps.id, ps.start + ps.count - ps.n_draft, model_.config().vocab,
                                        model_.config().eos_ids),
                0.0f});
            out->tokens.insert(out->tokens.end(), size_t(ps.n_draft), SampledToken{-1, 0.0f});  // drafts refused
        }
    }
    counters_.compute_seconds += since(t0);
    counters_.wait_seconds += waited;
    ++counters_.steps;
}

}  // namespace lattice
