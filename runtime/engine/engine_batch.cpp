// The every-rank conveniences over the engine (see engine.h): generate_batch, generate, score.
// The leader drives the steps while the other ranks follow; generate_batch then sends the results
// to every rank (counts and stats as int64, tokens as int32, logprobs as f32, one broadcast each).
#include <algorithm>
#include <unordered_map>

#include "base/clock.h"
#include "base/error.h"
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

std::vector<GenerateResult> Engine::generate_batch(const std::vector<GenerateRequest>& reqs,
                                                   const TokenCallback& on_token, GenerateStats* total) {
    LATTICE_CHECK(!reqs.empty(), "generate: no sequences");
    const RunMark mark = mark_run();
    std::vector<GenerateResult> res(reqs.size());
    std::string error;
    double prefill_s = 0;
    if (is_leader()) {
        // A request that cannot run is refused before anything runs: the followers are told (with
        // the message) and leave cleanly. A failure while stepping (a dead peer) propagates: the
        // process ends and the launcher stops the job.
        std::unordered_map<int64_t, size_t> index;
        std::vector<int64_t> added;
        try {
            for (size_t i = 0; i < reqs.size(); ++i) {
                EngineRequest r = reqs[i];
                r.sampling.seed += uint64_t(i);  // distinct streams per sequence, reproducible
                added.push_back(add(std::move(r)));
                index[added.back()] = i;
            }
        } catch (const Error& e) {
            for (int64_t id : added) core_->cancel(id);  // nothing of them ran yet
            core_->scheduler().take_finished();
            error = e.what();
        }
        size_t started = 0;
        std::vector<bool> has_first(reqs.size(), false);
        std::vector<bool> ended(reqs.size(), false);  // by on_token: what the engine says after is moot
        while (error.empty() && busy()) {
            for (const TokenEvent& ev : step()) {
                const size_t i = index.at(ev.id);
                if (ended[i]) continue;
                GenerateResult& r = res[i];
                if (ev.finish != FinishReason::kNone) r.finish = ev.finish;
                if (ev.token >= 0) {
                    r.tokens.push_back(ev.token);
                    r.logprobs.push_back(ev.logprob);
                    const FinishReason why = on_token ? on_token(int64_t(i), ev.token) : FinishReason::kNone;
                    if (why != FinishReason::kNone) {
                        ended[i] = true;
                        if (ev.finish == FinishReason::kNone) cancel(ev.id);  // (a finished one is gone already)
                        r.finish = why;
                    }
                }
                if (!has_first[i] && (ev.token >= 0 || ev.finish != FinishReason::kNone)) {
                    has_first[i] = true;
                    if (++started == reqs.size()) prefill_s = since(mark.start);
                }
            }
        }
        shutdown();
    } else {
        follow();
    }
    const GenerateStats stats = finish_run(mark, int64_t(reqs.size()), prefill_s, error);
    share_results(res);
    for (GenerateResult& r : res) r.stats = stats;
    if (total) *total = stats;
    return res;
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

GenerateResult Engine::generate(const GenerateRequest& req, const std::function<void(int32_t)>& on_token) {
    std::vector<GenerateResult> r = generate_batch({req}, on_token ? [&](int64_t, int32_t id) {
        on_token(id);
        return FinishReason::kNone;
    } : TokenCallback{});
    return std::move(r[0]);
}

std::vector<float> Engine::score(const std::vector<int32_t>& prompt) {
    if (!is_leader()) {
        follow();
        return {};
    }
    const AttentionShape& a = model_.attention_shape();
    const int64_t T = int64_t(prompt.size()), V = model_.config().vocab;
    BlockPool& pool = core_->pool();
    std::vector<float> out;
    std::vector<int32_t> blocks;
    try {
        LATTICE_CHECK(!busy(), "score: the engine is busy with requests");
        LATTICE_CHECK(T >= 1, "empty prompt: give at least one token");
        LATTICE_CHECK(T <= model_.max_seq(),
                      "prompt of {} tokens is longer than the model's context ({} positions per sequence)", T,
                      model_.max_seq());
        for (int64_t i = 0; i < T; ++i)
            LATTICE_CHECK(prompt[size_t(i)] >= 0 && prompt[size_t(i)] < V,
                          "prompt token {} (at index {}) is outside the vocab of {}", prompt[size_t(i)], i, V);
        const int64_t need = (T + a.block_size - 1) / a.block_size;
        LATTICE_CHECK(pool.allocate(need, blocks), "score: {} tokens need {} KV blocks, the cache holds {}", T, need,
                      pool.num_blocks());
        std::vector<int32_t> row(size_t(a.table_width), -1);
        std::copy(blocks.begin(), blocks.end(), row.begin());
        out = score_chunks(prompt, row);
    } catch (...) {
        if (!blocks.empty()) pool.release(blocks);
        core_->abandon();
        shutdown();
        throw;
    }
    pool.release(blocks);
    shutdown();
    return out;
}

// The prompt in kScore plans of up to max_batch_tokens tokens (as many in flight as there are stages),
// their logits into one [tokens, vocab] array.
std::vector<float> Engine::score_chunks(const std::vector<int32_t>& prompt, const std::vector<int32_t>& table) {
    const int64_t T = int64_t(prompt.size()), V = model_.config().vocab;
    const int64_t chunk = std::min(model_.options().max_batch_tokens, T);
    std::vector<float> out(size_t(T * V));
    int64_t issued = 0, received = 0;
    while (received < T) {
        while (issued < T && core_->has_room()) {
            StepPlan p;
            p.kind = StepPlan::Kind::kScore;
            const int64_t n = std::min(chunk, T - issued);
            p.tokens.assign(prompt.begin() + issued, prompt.begin() + issued + n);
            PlanSeq ps;
            ps.id = -1;
            ps.start = int32_t(issued);
            ps.count = int32_t(n);
            p.seqs.push_back(ps);
            p.width = int32_t(table.size());
            p.tables = table;
            core_->issue(std::move(p));
            issued += n;
        }
        const auto [p, r] = core_->take_oldest();
        const int64_t n = p.seqs[0].count;
        LATTICE_CHECK(int64_t(r.logits.size()) == n * V, "score: {} logits for {} tokens", r.logits.size(), n);
        std::copy(r.logits.begin(), r.logits.end(), out.begin() + int64_t(p.seqs[0].start) * V);
        received += n;
    }
    return out;
}

}  // namespace lattice
