// One run's accounting on every rank (see engine.h): mark_run, finish_run (the leader's statistics and
// error to every rank, every rank's breakdown to every rank) and share_results (the leader's results:
// counts and finishes as int64, tokens as int32, logprobs as f32, one broadcast each).
#include <algorithm>

#include "base/clock.h"
#include "base/error.h"
#include "runtime/engine/client.h"
#include "runtime/engine/engine.h"

namespace lattice {

namespace {
using Clock = SteadyClock;
constexpr auto since = seconds_since;
}  // namespace

Engine::RunMark Engine::mark_run() const {
    RunMark m;
    m.start = Clock::now();
    m.counters = counters_;
    m.comm_seconds = model_.comm_seconds();
    if (is_leader()) m.sched = core_->scheduler().stats();
    return m;
}

GenerateStats Engine::finish_run(const RunMark& m, int64_t sequences, double prefill_seconds,
                                 const std::string& error) {
    const double wall_s = since(m.start);  // this rank's run (the stats' broadcast not counted)
    // The leader's numbers, to every rank: 9 stats and the error's length, then the error's bytes.
    std::vector<int64_t> meta;
    std::vector<int32_t> text;
    if (is_leader()) {
        const SchedulerStats& s1 = core_->scheduler().stats();
        meta = {s1.prompt_tokens - m.sched.prompt_tokens,
                s1.generated_tokens - m.sched.generated_tokens,
                int64_t(prefill_seconds * 1e9),
                int64_t((wall_s - prefill_seconds) * 1e9),
                s1.preemptions - m.sched.preemptions,
                s1.peak_blocks,
                s1.cached_tokens - m.sched.cached_tokens,
                s1.drafted_tokens - m.sched.drafted_tokens,
                s1.accepted_tokens - m.sched.accepted_tokens,
                int64_t(error.size())};
        text.assign(error.begin(), error.end());
    }
    exec_.broadcast(meta);
    exec_.broadcast(text);
    LATTICE_CHECK(meta.size() == 10, "engine: {} run statistics from the leader, expected 10", meta.size());
    if (meta[9] > 0) {
        const std::string msg(text.begin(), text.end());
        if (is_leader()) LATTICE_FAIL("{}", msg);
        LATTICE_FAIL("the leader (rank 0) failed: {}", msg);
    }
    GenerateStats stats;
    stats.sequences = sequences;
    stats.prompt_tokens = meta[0];
    stats.generated_tokens = meta[1];
    stats.prefill_seconds = double(meta[2]) * 1e-9;
    stats.decode_seconds = double(meta[3]) * 1e-9;
    stats.preemptions = meta[4];
    stats.peak_kv_blocks = meta[5];
    stats.cached_prompt_tokens = meta[6];
    stats.drafted_tokens = meta[7];
    stats.accepted_tokens = meta[8];
    stats.idle_seconds = counters_.wait_seconds - m.counters.wait_seconds;
    stats.compute_seconds = counters_.compute_seconds - m.counters.compute_seconds;
    stats.per_rank = exec_.gather_breakdowns(breakdown(m.counters, m.comm_seconds, wall_s));
    return stats;
}

// The leader's results to every rank: per result its token count and finish (int64), then all
// tokens (int32) and logprobs (f32), one broadcast each.
void Engine::share_results(std::vector<GenerateResult>& res) const {
    if (exec_.world() == 1) return;
    std::vector<int64_t> meta;
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    if (is_leader())
        for (const GenerateResult& r : res) {
            meta.push_back(int64_t(r.tokens.size()));
            meta.push_back(int64_t(r.finish));
            tokens.insert(tokens.end(), r.tokens.begin(), r.tokens.end());
            logprobs.insert(logprobs.end(), r.logprobs.begin(), r.logprobs.end());
        }
    exec_.broadcast(meta);
    exec_.broadcast(tokens);
    exec_.broadcast(logprobs);
    LATTICE_CHECK(meta.size() == 2 * res.size() && tokens.size() == logprobs.size(),
                  "generate: {} result fields for {} requests", meta.size(), res.size());
    size_t off = 0;
    for (size_t i = 0; i < res.size(); ++i) {
        const int64_t n = meta[2 * i];
        LATTICE_CHECK(n >= 0 && off + size_t(n) <= tokens.size(), "generate: result {} claims {} tokens", i, n);
        res[i].tokens.assign(tokens.begin() + int64_t(off), tokens.begin() + int64_t(off) + n);
        res[i].logprobs.assign(logprobs.begin() + int64_t(off), logprobs.begin() + int64_t(off) + n);
        res[i].finish = FinishReason(meta[2 * i + 1]);
        off += size_t(n);
    }
}

// The every-rank conveniences are EngineClient's (client_batch.cpp); these forward to it for the
// callers that hold an Engine only.
std::vector<GenerateResult> Engine::generate_batch(const std::vector<GenerateRequest>& reqs,
                                                   const TokenCallback& on_token, GenerateStats* total) {
    return EngineClient(*this, nullptr, true).generate_batch(reqs, on_token, total);
}

GenerateResult Engine::generate(const GenerateRequest& req, const std::function<void(int32_t)>& on_token) {
    return EngineClient(*this, nullptr, true).generate(req, on_token);
}

std::vector<float> Engine::score(const std::vector<int32_t>& prompt) {
    return EngineClient(*this, nullptr, true).score(prompt);
}

}  // namespace lattice
