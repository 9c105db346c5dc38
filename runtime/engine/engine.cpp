// Engine (see engine.h): the parts assembled, and the leader / follower entry points.
#include "runtime/engine/engine.h"

#include <algorithm>

#include "base/error.h"
#include "runtime/engine/backend_runner.h"
#include "runtime/engine/sim_runner.h"

namespace lattice {

namespace {

// The scheduler's options for `model` under `opt`: a step holds the decode tokens of its running
// sequences, then up to step_tokens prompt tokens, all within the model's rows (the builder sizes them
// for max_seqs decodes beside the budget, so the budget never caps how many sequences run).
SchedulerOptions scheduler_options(const Model& model, const EngineOptions& opt, int stages) {
    LATTICE_CHECK(opt.speculative_tokens >= 0 && opt.speculative_tokens <= kMaxSpeculativeTokens,
                  "speculative tokens {}: must be in [0, {}]", opt.speculative_tokens, kMaxSpeculativeTokens);
    SchedulerOptions so;
    const int64_t mbt = model.options().max_batch_tokens;
    so.step_tokens = opt.step_tokens > 0 ? std::min(opt.step_tokens, mbt) : mbt;
    so.step_capacity = mbt;
    so.max_itl_s = opt.max_itl_s;
    so.max_seqs = opt.max_seqs;
    so.max_seq = model.max_seq();
    so.micro_batches = stages;
    so.vocab = model.config().vocab;
    so.eos_ids = model.config().eos_ids;
    so.spec_tokens = opt.speculative_tokens;
    so.proposer = opt.draft_proposer;
    return so;
}

}  // namespace

Engine::Engine(Model& model, PipelineLinks links, const EngineOptions& opt)
    : model_(model), links_(links), opt_(opt), exec_(links, counters_) {
    LATTICE_CHECK(model_.kv_blocks() > 0, "Engine: the model has no KV cache (Model::allocate_kv first)");
    if (opt_.sim) {
        runner_ = std::make_unique<SimRunner>(model_, opt_.sim, links_, exec_.rank(), counters_);
    } else {
        BackendRunnerOptions ro;
        ro.step_graphs = opt_.step_graphs;
        ro.graph_buckets = opt_.graph_buckets;
        ro.max_seqs = opt_.max_seqs;
        runner_ = std::make_unique<BackendRunner>(model_, links_, exec_.rank(), ro, counters_);
    }
    if (!is_leader()) return;
    EngineCoreOptions co;
    co.stages = links_.pipe ? links_.pipe->size() : 1;
    co.sched = scheduler_options(model_, opt_, co.stages);
    co.kv_blocks = model_.kv_blocks() - runner_->reserved_blocks();
    co.block_size = model_.attention_shape().block_size;
    co.prefix_caching = opt_.prefix_caching;
    co.heartbeat_s = opt_.heartbeat_s;
    co.model = model_.config();
    co.max_loras = opt_.max_loras;
    co.max_lora_rank = opt_.max_lora_rank;
    core_ = std::make_unique<EngineCore>(co, exec_, *runner_);
}

Engine::~Engine() = default;

EngineCore& Engine::core() {
    LATTICE_CHECK(core_, "Engine on rank {}: the engine core runs on the leader (rank 0)", exec_.rank());
    return *core_;
}

const Scheduler& Engine::scheduler() const {
    LATTICE_CHECK(core_, "Engine::scheduler on rank {}: the scheduler is the leader's", exec_.rank());
    return core_->scheduler();
}

int64_t Engine::add(EngineRequest r) {
    LATTICE_CHECK(is_leader(), "Engine::add on rank {}: requests go to the leader (rank 0)", exec_.rank());
    return core_->add(std::move(r));
}

void Engine::cancel(int64_t id) {
    LATTICE_CHECK(is_leader(), "Engine::cancel on rank {}", exec_.rank());
    core_->cancel(id);
}

bool Engine::busy() const {
    return core_ && core_->busy();
}

std::vector<TokenEvent> Engine::step() {
    LATTICE_CHECK(is_leader(), "Engine::step on rank {}: followers run follow()", exec_.rank());
    return core_->step();
}

void Engine::shutdown() {
    LATTICE_CHECK(is_leader(), "Engine::shutdown on rank {}", exec_.rank());
    core_->shutdown();
}

void Engine::follow() {
    LATTICE_CHECK(!is_leader(), "Engine::follow on the leader");
    exec_.follow(*runner_);
}

StepBreakdown Engine::breakdown(const EngineCounters& c0, double comm0, double wall) const {
    StepBreakdown b;
    b.rank = exec_.rank();
    b.tp_rank = model_.options().tp_rank;
    b.pp_rank = links_.pipe ? links_.pipe->rank() : 0;
    b.steps = counters_.steps - c0.steps;
    b.wall = wall;
    b.communication = model_.comm_seconds() - comm0;
    b.sampling = counters_.sample_seconds - c0.sample_seconds;
    b.compute = std::max(0.0, counters_.compute_seconds - c0.compute_seconds - b.communication - b.sampling);
    b.pipeline_bubble = counters_.wait_seconds - c0.wait_seconds;
    b.host_overhead = std::max(0.0, wall - b.compute - b.communication - b.sampling - b.pipeline_bubble);
    b.plan_wait = counters_.plan_wait_seconds - c0.plan_wait_seconds;
    b.plan_blocked = counters_.plan_blocked_seconds - c0.plan_blocked_seconds;
    b.plan_bytes = counters_.plan_bytes - c0.plan_bytes;
    return b;
}

}  // namespace lattice
