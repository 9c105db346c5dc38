// EngineCore (see engine_core.h).
#include "runtime/engine/engine_core.h"

#include <unordered_map>

#include "base/clock.h"
#include "base/error.h"

namespace lattice {

namespace {
using Clock = SteadyClock;
constexpr auto since = seconds_since;
}  // namespace

EngineCore::EngineCore(const EngineCoreOptions& opt, RankExecutor& exec, ModelRunner& runner)
    : opt_(opt),
      exec_(exec),
      runner_(runner),
      pool_(opt.kv_blocks, opt.block_size, opt.prefix_caching),
      sched_(opt.sched, pool_),
      loras_(opt.model, opt.max_loras, opt.max_lora_rank) {
    LATTICE_CHECK(opt_.stages >= 1, "engine: {} pipeline stages", opt_.stages);
}

void EngineCore::issue(StepPlan p) {
    p.loras = loras_.take_loads();
    exec_.number(p);
    if (p.kind == StepPlan::Kind::kStep) issued_at_[p.number] = Clock::now();
    exec_.send_plan(p);
    StepResults r;
    runner_.execute(p, &r);
    if (exec_.is_sampler())
        done_.emplace_back(std::move(p), std::move(r));
    else
        inflight_.push_back(std::move(p));
}

std::pair<StepPlan, StepResults> EngineCore::take_oldest() {
    LATTICE_CHECK(!done_.empty() || !inflight_.empty(), "engine: no step in flight");
    if (!done_.empty()) {
        auto out = std::move(done_.front());
        done_.pop_front();
        return out;
    }
    StepPlan p = std::move(inflight_.front());
    inflight_.pop_front();
    StepResults r = exec_.recv_results(p, opt_.sched.vocab);
    return {std::move(p), std::move(r)};
}

std::vector<TokenEvent> EngineCore::complete_oldest() {
    auto [p, r] = take_oldest();
    if (const auto it = issued_at_.find(p.number); it != issued_at_.end()) {
        sched_.observe_step(int64_t(p.tokens.size()), since(it->second));
        issued_at_.erase(it);
    }
    std::vector<TokenEvent> ev = sched_.complete(p, r.tokens);
    attach_top(p, r, ev);
    return ev;
}

std::vector<int64_t> EngineCore::take_released() {
    std::vector<int64_t> released = sched_.take_released();
    if (exec_.is_sampler()) runner_.release(released);
    return released;
}

std::vector<TokenEvent> EngineCore::step() {
    std::vector<TokenEvent> out = sched_.take_finished();
    while (has_room()) {
        StepPlan p = sched_.next(0);
        if (p.empty()) break;
        issue(std::move(p));
        if (!done_.empty()) break;  // one stage: one step per call
    }
    if (!done_.empty() || !inflight_.empty()) {
        std::vector<TokenEvent> ev = complete_oldest();
        out.insert(out.end(), ev.begin(), ev.end());
    } else {
        exec_.heartbeat_if_due(take_released(), opt_.heartbeat_s);
    }
    return out;
}

void EngineCore::shutdown() {
    while (!done_.empty() || !inflight_.empty()) {
        auto [p, r] = take_oldest();
        if (p.kind == StepPlan::Kind::kStep) sched_.complete(p, r.tokens);
    }
    issued_at_.clear();
    exec_.send_shutdown(take_released());
}

void EngineCore::attach_top(const StepPlan& p, const StepResults& r, std::vector<TokenEvent>& events) {
    if (r.top.empty()) return;
    std::unordered_map<int64_t, std::pair<size_t, int32_t>> at;  // sequence -> (offset, count) in r.top
    size_t off = 0;
    for (const PlanSeq& ps : p.seqs) {
        if (!ps.sample || ps.sampling.logprobs == 0) continue;
        at[ps.id] = {off, ps.sampling.logprobs};
        off += size_t(ps.sampling.logprobs);
    }
    LATTICE_CHECK(off == r.top.size(), "step {}: {} top logprobs for {} asked", p.number, r.top.size(), off);
    for (TokenEvent& e : events) {
        const auto it = at.find(e.id);
        if (it == at.end() || e.token < 0) continue;
        const auto first = r.top.begin() + int64_t(it->second.first);
        e.top.assign(first, first + it->second.second);
    }
}

}  // namespace lattice
