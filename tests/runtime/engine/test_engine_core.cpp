// EngineCore (runtime/engine/engine_core.h) with a fake runner and one rank (no MPI, no model): the
// leader's schedule -> execute -> update loop. Requests run to their limits with the runner's tokens
// in order; plans are numbered in issue order and a long prompt goes in chunks; a pool too small for
// every sequence preempts and recomputes without changing any output; cancel and stop ids end a
// sequence; top logprobs reach the events; released sequences reach the runner; every block returns.
#include <doctest/doctest.h>

#include <map>
#include <vector>

#include "runtime/engine/engine_core.h"
#include "tests/runtime/engine/fake_comm.h"

// The file's own namespace: its test compiles as unity files (tests/CMakeLists.txt), whose files'
// local names must not meet.
namespace test_engine_core {

using namespace lattice;
using namespace lattice::testing;

namespace {

EngineCoreOptions core_options(int64_t blocks, int64_t step_tokens = 8, int64_t max_seqs = 4) {
    EngineCoreOptions o;
    o.sched.step_tokens = step_tokens;
    o.sched.max_seqs = max_seqs;
    o.sched.max_seq = 64;
    o.sched.vocab = 64;
    o.sched.eos_ids = {0};
    o.kv_blocks = blocks;
    o.block_size = 4;
    o.prefix_caching = false;
    return o;
}

EngineRequest request(int prompt_len, int64_t max_new) {
    EngineRequest r;
    for (int i = 0; i < prompt_len; ++i) r.prompt.push_back(int32_t(1 + i % 60));
    r.max_new_tokens = max_new;
    return r;
}

struct Run {
    std::map<int64_t, std::vector<int32_t>> tokens;
    std::map<int64_t, FinishReason> finish;
    std::map<int64_t, size_t> tops;
};

void absorb(Run& out, const std::vector<TokenEvent>& events) {
    for (const TokenEvent& e : events) {
        if (e.token >= 0) out.tokens[e.id].push_back(e.token);
        if (e.finish != FinishReason::kNone) out.finish[e.id] = e.finish;
        out.tops[e.id] += e.top.size();
    }
}

Run run_all(EngineCore& core, Run out = {}) {
    for (int guard = 0; core.busy() && guard < 1000; ++guard) absorb(out, core.step());
    return out;
}

std::vector<int32_t> expected(int64_t id, int prompt_len, int64_t n) {
    std::vector<int32_t> t;
    for (int64_t k = 0; k < n; ++k) t.push_back(fake_token(id, prompt_len + k));
    return t;
}

}  // namespace

TEST_CASE("engine core: requests run to their limits with the runner's tokens; every block returns") {
    EngineCounters k;
    RankExecutor exec(PipelineLinks{}, k);
    FakeRunner runner;
    EngineCore core(core_options(32), exec, runner);
    const std::vector<int> lens = {3, 5, 20};
    for (int len : lens) core.add(request(len, 6));
    const Run r = run_all(core);
    for (int64_t id = 0; id < 3; ++id) {
        CHECK(r.tokens.at(id) == expected(id, lens[size_t(id)], 6));
        CHECK(r.finish.at(id) == FinishReason::kLength);
    }
    for (size_t i = 0; i < runner.plans.size(); ++i) CHECK(runner.plans[i].number == int64_t(i + 1));
    // The 20-token prompt came in chunks of the 8-token budget.
    int64_t chunks = 0;
    for (const StepPlan& p : runner.plans)
        for (const PlanSeq& ps : p.seqs) chunks += ps.id == 2 && ps.start < 20;
    CHECK(chunks >= 3);
    core.shutdown();
    CHECK(runner.released.size() == 3);
    CHECK(core.pool().num_free() == 32);
    CHECK_FALSE(core.busy());
}

TEST_CASE("engine core: a pool too small for every sequence preempts and recomputes; the outputs do not change") {
    EngineCounters k1, k2;
    RankExecutor e1(PipelineLinks{}, k1), e2(PipelineLinks{}, k2);
    FakeRunner r1, r2;
    EngineCore roomy(core_options(64), e1, r1), tight(core_options(10), e2, r2);
    for (EngineCore* c : {&roomy, &tight})
        for (int i = 0; i < 4; ++i) c->add(request(6, 10));  // 16 positions each: 4 blocks, 16 in all
    const Run a = run_all(roomy), b = run_all(tight);
    CHECK(a.tokens == b.tokens);
    CHECK(b.tokens.size() == 4);
    CHECK(roomy.scheduler().stats().preemptions == 0);
    CHECK(tight.scheduler().stats().preemptions > 0);
    CHECK(tight.pool().num_free() == 10);
}

TEST_CASE("engine core: cancel and stop ids end a sequence; top logprobs reach the events") {
    EngineCounters k;
    RankExecutor exec(PipelineLinks{}, k);
    FakeRunner runner;
    EngineCore core(core_options(32), exec, runner);
    EngineRequest stopping = request(4, 20);
    stopping.stop_ids = {fake_token(0, 4 + 2)};  // its third token
    stopping.sampling.logprobs = 2;
    const int64_t a = core.add(stopping);
    const int64_t b = core.add(request(4, 20));
    Run first;
    absorb(first, core.step());  // both prompts in, first tokens out
    CHECK(first.tokens.at(b).size() == 1);
    core.cancel(b);
    const Run r = run_all(core, first);
    CHECK(r.finish.at(a) == FinishReason::kStop);
    CHECK(r.tokens.at(a) == expected(a, 4, 3));  // the stop id is the last token
    CHECK(r.tops.at(a) == 3 * 2);
    CHECK(r.tokens.at(b).size() == 1);
    CHECK(r.finish.at(b) == FinishReason::kCancelled);
    core.shutdown();
    CHECK(core.pool().num_free() == 32);
}

TEST_CASE("engine core: plans from outside the scheduler come back in order") {
    EngineCounters k;
    RankExecutor exec(PipelineLinks{}, k);
    FakeRunner runner;
    EngineCore core(core_options(8), exec, runner);
    CHECK(core.has_room());
    StepPlan p;
    p.kind = StepPlan::Kind::kScore;
    p.tokens = {1, 2, 3};
    p.seqs.push_back(PlanSeq{});
    p.seqs[0].count = 3;
    core.issue(p);
    CHECK_FALSE(core.has_room());  // one stage: one plan in flight
    const auto [plan, res] = core.take_oldest();
    CHECK(plan.number == 1);
    CHECK(res.logits.size() == 3 * 4);
    CHECK(core.has_room());
    CHECK_THROWS_AS(core.take_oldest(), Error);
}

}  // namespace test_engine_core
