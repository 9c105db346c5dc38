// RankExecutor (runtime/engine/rank_executor.h) alone: the plan transport between a leader and a
// follower over an in-memory communicator (no MPI, no model). Plans arrive whole and in order (a plan
// over one head message travels as two), block tables as changes against what the follower knows; an
// out-of-order plan is refused; the sampler's answer carries its token slots and top logprobs; a
// follower runs the step plans through its runner, answers each, drops released sequences, and leaves
// at the shutdown; heartbeats go only when due; with one rank nothing is sent.
#include <doctest/doctest.h>

#include <memory>
#include <vector>

#include "base/error.h"
#include "runtime/engine/rank_executor.h"
#include "tests/runtime/engine/fake_comm.h"

using namespace lattice;
using namespace lattice::testing;

namespace {

// A kStep plan of `n` sequences (ids first_id ..), each feeding `count` tokens and sampling.
StepPlan make_plan(int n, int count, int32_t width, int64_t first_id = 0) {
    StepPlan p;
    p.width = width;
    for (int i = 0; i < n; ++i) {
        PlanSeq ps;
        ps.id = first_id + i;
        ps.start = 3;
        ps.count = count;
        ps.sample = true;
        p.seqs.push_back(ps);
        for (int j = 0; j < count; ++j) p.tokens.push_back(int32_t(100 * i + j));
        for (int32_t b = 0; b < width; ++b) p.tables.push_back(b < 2 ? int32_t(10 * i + b) : -1);
    }
    return p;
}

struct Pair {
    std::shared_ptr<Mailboxes> boxes = std::make_shared<Mailboxes>();
    FakeComm c0{boxes, 0, 2}, c1{boxes, 1, 2};
    EngineCounters k0, k1;
    RankExecutor leader{PipelineLinks{nullptr, -1, -1, &c0, nullptr, nullptr, 1}, k0};
    RankExecutor follower{PipelineLinks{nullptr, -1, -1, &c1, nullptr, nullptr, 1}, k1};
};

}  // namespace

TEST_CASE("rank executor: plans arrive whole and in order; a long plan is a head and one more message") {
    Pair x;
    CHECK(x.leader.is_leader());
    CHECK_FALSE(x.leader.is_sampler());
    CHECK(x.follower.is_sampler());
    StepPlan small = make_plan(2, 1, 4);
    x.leader.number(small);
    x.leader.send_plan(small);
    CHECK(x.boxes->pending(0, 1) == 1);
    StepPlan big = make_plan(3, 1200, 4, 10);  // 3600 tokens: over one head message
    x.leader.number(big);
    x.leader.send_plan(big);
    CHECK(x.boxes->pending(0, 1) == 3);
    CHECK(x.k0.plans_sent == 2);
    CHECK(x.k0.plan_bytes > RankExecutor::kPlanHead);
    const StepPlan a = x.follower.recv_plan();
    CHECK(a.number == 1);
    CHECK(a.tokens == small.tokens);
    CHECK(a.tables == small.tables);
    const StepPlan b = x.follower.recv_plan();
    CHECK(b.number == 2);
    CHECK(b.tokens == big.tokens);
    REQUIRE(b.seqs.size() == 3);
    CHECK(b.seqs[2].id == 12);
    CHECK(b.tables == big.tables);
    CHECK(x.boxes->pending(0, 1) == 0);
}

TEST_CASE("rank executor: a plan out of order is refused") {
    Pair x;
    StepPlan p = make_plan(1, 1, 2);
    p.number = 2;  // plan 1 never came
    x.leader.send_plan(p);
    CHECK_THROWS_AS(x.follower.recv_plan(), Error);
}

TEST_CASE("rank executor: the sampler's answer carries the token slots and the top logprobs") {
    Pair x;
    StepPlan p = make_plan(2, 1, 2);
    p.seqs[0].sampling.logprobs = 2;
    StepResults r;
    r.tokens = {{5, -0.1f}, {6, -0.2f}};
    r.top = {{5, -0.1f}, {9, -2.0f}};
    x.follower.send_results(p, r);
    const StepResults got = x.leader.recv_results(p, 32);
    REQUIRE(got.tokens.size() == 2);
    CHECK(got.tokens[1].token == 6);
    REQUIRE(got.top.size() == 2);
    CHECK(got.top[1].token == 9);
    StepPlan s = make_plan(1, 3, 2);
    s.kind = StepPlan::Kind::kScore;
    StepResults lg;
    lg.logits.assign(3 * 4, 0.25f);
    x.follower.send_results(s, lg);
    CHECK(x.leader.recv_results(s, 4).logits == lg.logits);
    StepResults wrong;  // one token slot (and a top logprob) where the plan has two: the same bytes
    wrong.tokens = {{5, 0.0f}};
    wrong.top = {{5, 0.0f}};
    x.follower.send_results(make_plan(1, 1, 2), wrong);
    CHECK_THROWS_AS(x.leader.recv_results(make_plan(2, 1, 2), 32), Error);
}

TEST_CASE("rank executor: a follower runs the steps, answers each, drops released sequences and leaves at shutdown") {
    Pair x;
    for (int i = 0; i < 3; ++i) {
        StepPlan p = make_plan(2, 1, 2, 10 * i);
        x.leader.number(p);
        x.leader.send_plan(p);
    }
    x.leader.heartbeat_if_due({10, 11}, 1e9);  // released ids: sent whatever the time
    x.leader.send_shutdown({20});
    FakeRunner runner;
    x.follower.follow(runner);
    REQUIRE(runner.plans.size() == 3);  // the heartbeat and the shutdown run nothing
    CHECK(runner.plans[2].number == 3);
    CHECK(runner.released == std::vector<int64_t>{10, 11, 20});
    for (int i = 0; i < 3; ++i) {
        const StepResults r = x.leader.recv_results(runner.plans[size_t(i)], 32);
        REQUIRE(r.tokens.size() == 2);
        CHECK(r.tokens[1].token == fake_token(10 * i + 1, 4));
    }
    CHECK(x.boxes->pending(1, 0) == 0);
}

TEST_CASE("rank executor: heartbeats only when due; one rank sends nothing") {
    Pair x;
    x.leader.heartbeat_if_due({}, 1e9);  // nothing released, just sent (construction): not due
    CHECK(x.boxes->pending(0, 1) == 0);
    x.leader.heartbeat_if_due({}, 0.0);  // due
    CHECK(x.boxes->pending(0, 1) == 1);
    CHECK(x.follower.recv_plan().kind == StepPlan::Kind::kHeartbeat);

    EngineCounters k;
    RankExecutor alone(PipelineLinks{}, k);
    CHECK(alone.world() == 1);
    CHECK(alone.is_leader());
    CHECK(alone.is_sampler());
    StepPlan p = make_plan(1, 1, 2);
    alone.number(p);
    alone.send_plan(p);
    alone.heartbeat_if_due({1}, 0.0);
    CHECK(k.plans_sent == 0);
    std::vector<int64_t> v = {1, 2};
    alone.broadcast(v);
    CHECK(v == std::vector<int64_t>{1, 2});
    StepBreakdown mine;
    mine.steps = 7;
    const std::vector<StepBreakdown> all = alone.gather_breakdowns(mine);
    REQUIRE(all.size() == 1);
    CHECK(all[0].steps == 7);
}
