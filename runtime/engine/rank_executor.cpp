// RankExecutor (see rank_executor.h).
#include "runtime/engine/rank_executor.h"

#include <algorithm>
#include <cstring>

#include "base/clock.h"
#include "base/error.h"
#include "parallel/communicator.h"

namespace lattice {

namespace {

using Clock = SteadyClock;
constexpr auto since = seconds_since;

template <typename T>
View host_view(T* p, DType dt, int64_t n) {
    return View::contiguous(const_cast<std::remove_const_t<T>*>(p), dt, {n});
}

template <typename T>
void broadcast_vec(Communicator& c, std::vector<T>& v, DType dt) {
    int64_t n = int64_t(v.size());
    c.broadcast(View::contiguous(&n, DType::kI64, {1}), 0);
    v.resize(size_t(n));
    if (n > 0) c.broadcast(View::contiguous(v.data(), dt, {n}), 0);
}

}  // namespace

RankExecutor::RankExecutor(PipelineLinks links, EngineCounters& counters)
    : links_(links), counters_(counters), last_sent_(Clock::now()) {
    if (links_.world) {
        rank_ = links_.world->rank();
        world_ = links_.world->size();
    }
}

Communicator& RankExecutor::plan_comm() const {
    return links_.plans ? *links_.plans : *links_.world;
}

// One encoding (every follower knows the same tables), framed as a head of kPlanHead bytes (the plan's
// size, then its first bytes) and, for a longer plan, one message with the rest: most plans are one
// send per follower.
void RankExecutor::send_plan(const StepPlan& p) {
    last_sent_ = Clock::now();
    if (world_ == 1) return;
    std::vector<uint8_t> head(kPlanHead, 0);
    const std::vector<uint8_t> bytes = encode_plan(p, plan_tables_);
    const int64_t n = int64_t(bytes.size()), first = std::min<int64_t>(n, kPlanHead - 8);
    std::memcpy(head.data(), &n, 8);
    std::memcpy(head.data() + 8, bytes.data(), size_t(first));
    Communicator& c = plan_comm();
    const auto t0 = Clock::now();
    const double cpu0 = thread_cpu_seconds(), blocked0 = c.send_wait_seconds();
    for (int r = 0; r < world_; ++r) {
        if (r == rank_) continue;
        c.send(host_view(head.data(), DType::kU8, kPlanHead), r);
        if (n > first) c.send(host_view(bytes.data() + first, DType::kU8, n - first), r);
    }
    counters_.plan_wait_seconds += since(t0);
    counters_.plan_blocked_seconds += c.send_wait_seconds() - blocked0;
    counters_.plan_cpu_seconds += thread_cpu_seconds() - cpu0;
    ++counters_.plans_sent;
    counters_.plan_bytes += n;
}

StepPlan RankExecutor::recv_plan() {
    int64_t n = 0;
    const auto t0 = Clock::now();
    Communicator& c = plan_comm();
    std::vector<uint8_t> head(kPlanHead);
    c.recv(host_view(head.data(), DType::kU8, kPlanHead), 0);
    std::memcpy(&n, head.data(), 8);
    LATTICE_CHECK(n > 0 && n < (int64_t(1) << 30), "rank {}: step plan of {} bytes from the leader", rank_, n);
    const int64_t first = std::min<int64_t>(n, kPlanHead - 8);
    std::vector<uint8_t> bytes(static_cast<size_t>(n));
    std::memcpy(bytes.data(), head.data() + 8, size_t(first));
    if (n > first) c.recv(host_view(bytes.data() + first, DType::kU8, n - first), 0);
    counters_.wait_seconds += since(t0);
    StepPlan p = decode_plan(bytes.data(), n, plan_tables_);
    LATTICE_CHECK(p.number == number_ + 1, "rank {}: step plan {} arrived after {} (out of order)", rank_, p.number,
                  number_);
    number_ = p.number;
    return p;
}

void RankExecutor::send_results(const StepPlan& p, const StepResults& r) {
    if (p.kind == StepPlan::Kind::kScore) {
        links_.world->send(host_view(r.logits.data(), DType::kF32, int64_t(r.logits.size())), 0);
        return;
    }
    std::vector<SampledToken> buf;  // {slots, 0}, a token per slot (plan.sample_slots()), the top logprobs
    buf.reserve(r.tokens.size() + 1 + r.top.size());
    buf.push_back(SampledToken{int32_t(r.tokens.size()), 0});
    buf.insert(buf.end(), r.tokens.begin(), r.tokens.end());
    buf.insert(buf.end(), r.top.begin(), r.top.end());  // as many as the plan's sampled sequences ask for
    links_.world->send(
        host_view(reinterpret_cast<const uint8_t*>(buf.data()), DType::kU8, int64_t(buf.size() * sizeof(SampledToken))),
        0);
}

StepResults RankExecutor::recv_results(const StepPlan& p, int64_t vocab) {
    StepResults r;
    const auto t0 = Clock::now();
    if (p.kind == StepPlan::Kind::kScore) {
        r.logits.resize(p.tokens.size() * size_t(vocab));
        links_.world->recv(host_view(r.logits.data(), DType::kF32, int64_t(r.logits.size())), links_.sampler);
    } else {
        const int64_t n = p.sample_slots();
        int64_t top = 0;
        for (const PlanSeq& ps : p.seqs)
            if (ps.sample) top += ps.sampling.logprobs;
        std::vector<SampledToken> buf(static_cast<size_t>(n + 1 + top));
        links_.world->recv(
            host_view(reinterpret_cast<uint8_t*>(buf.data()), DType::kU8, int64_t(buf.size() * sizeof(SampledToken))),
            links_.sampler);
        LATTICE_CHECK(buf[0].token == n, "leader: step {} came back with {} token slots for {}", p.number,
                      buf[0].token, n);
        r.tokens.assign(buf.begin() + 1, buf.begin() + 1 + n);
        r.top.assign(buf.begin() + 1 + n, buf.end());
    }
    counters_.wait_seconds += since(t0);
    return r;
}

void RankExecutor::heartbeat_if_due(std::vector<int64_t> released, double heartbeat_s) {
    if (world_ == 1 || (released.empty() && since(last_sent_) < heartbeat_s)) return;
    StepPlan hb;
    hb.kind = StepPlan::Kind::kHeartbeat;
    hb.released = std::move(released);
    number(hb);
    send_plan(hb);
}

void RankExecutor::send_shutdown(std::vector<int64_t> released) {
    StepPlan s;
    s.kind = StepPlan::Kind::kShutdown;
    s.released = std::move(released);
    number(s);
    send_plan(s);
}

void RankExecutor::follow(ModelRunner& runner) {
    LATTICE_CHECK(!is_leader(), "follow() on the leader");
    for (;;) {
        StepPlan p = recv_plan();
        if (p.kind == StepPlan::Kind::kShutdown || p.kind == StepPlan::Kind::kHeartbeat) {
            if (is_sampler()) runner.release(p.released);
            if (p.kind == StepPlan::Kind::kShutdown) return;
            continue;
        }
        StepResults r;
        runner.execute(p, &r);
        if (is_sampler()) send_results(p, r);
    }
}

// Every rank's breakdown to every rank: 13 int64 each (ids, steps, the seconds in ns, plan bytes).
std::vector<StepBreakdown> RankExecutor::gather_breakdowns(const StepBreakdown& mine) const {
    constexpr int kFields = 13;
    auto ns = [](double s) { return int64_t(s * 1e9); };
    const int64_t enc[kFields] = {mine.rank,          mine.tp_rank,       mine.pp_rank,
                                  mine.steps,         ns(mine.wall),      ns(mine.compute),
                                  ns(mine.communication), ns(mine.pipeline_bubble), ns(mine.sampling),
                                  ns(mine.host_overhead), ns(mine.plan_wait), mine.plan_bytes,
                                  ns(mine.plan_blocked)};
    std::vector<int64_t> all(size_t(kFields) * size_t(world_));
    if (world_ > 1)
        links_.world->all_gather(View::contiguous(all.data(), DType::kI64, {int64_t(all.size())}),
                                 View::contiguous(const_cast<int64_t*>(enc), DType::kI64, {kFields}));
    else
        std::copy(enc, enc + kFields, all.begin());
    std::vector<StepBreakdown> out(static_cast<size_t>(world_));
    for (int r = 0; r < world_; ++r) {
        const int64_t* e = all.data() + size_t(r) * kFields;
        StepBreakdown& b = out[size_t(r)];
        b.rank = int(e[0]);
        b.tp_rank = int(e[1]);
        b.pp_rank = int(e[2]);
        b.steps = e[3];
        b.wall = double(e[4]) * 1e-9;
        b.compute = double(e[5]) * 1e-9;
        b.communication = double(e[6]) * 1e-9;
        b.pipeline_bubble = double(e[7]) * 1e-9;
        b.sampling = double(e[8]) * 1e-9;
        b.host_overhead = double(e[9]) * 1e-9;
        b.plan_wait = double(e[10]) * 1e-9;
        b.plan_bytes = e[11];
        b.plan_blocked = double(e[12]) * 1e-9;
    }
    return out;
}

void RankExecutor::broadcast(std::vector<int64_t>& v) const {
    if (world_ > 1) broadcast_vec(*links_.world, v, DType::kI64);
}
void RankExecutor::broadcast(std::vector<int32_t>& v) const {
    if (world_ > 1) broadcast_vec(*links_.world, v, DType::kI32);
}
void RankExecutor::broadcast(std::vector<float>& v) const {
    if (world_ > 1) broadcast_vec(*links_.world, v, DType::kF32);
}

}  // namespace lattice
