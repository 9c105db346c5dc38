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

template <typename T>
void broadcast_vec(Communicator& c, std::vector<T>& v, DType dt) {
    int64_t n = int64_t(v.size());
    c.broadcast(View::contiguous(&n, DType::kI64, {1}), 0);
    v.resize(size_t(n));
    if (n > 0) c.broadcast(View::contiguous(v.data(), dt, {n}), 0);
}

}  // namespace

// Every rank's breakdown to every rank: 10 int64 each (ids, steps, then the seconds in ns).
std::vector<StepBreakdown> Engine::gather_breakdowns(const StepBreakdown& mine) const {
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

Engine::RunMark Engine::mark_run() const {
    RunMark m;
    m.start = Clock::now();
    m.counters = counters_;
    m.comm_seconds = model_.comm_seconds();
    if (is_leader()) m.sched = sched_->stats();
    return m;
}

GenerateStats Engine::finish_run(const RunMark& m, int64_t sequences, double prefill_seconds,
                                 const std::string& error) {
    const double wall_s = since(m.start);  // this rank's run (the stats' broadcast not counted)
    // The leader's numbers, to every rank: 9 stats and the error's length, then the error's bytes.
    std::vector<int64_t> meta;
    std::vector<int32_t> text;
    if (is_leader()) {
        const SchedulerStats& s1 = sched_->stats();
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
    if (world_ > 1) {
        broadcast_vec(*links_.world, meta, DType::kI64);
        broadcast_vec(*links_.world, text, DType::kI32);
    }
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
    stats.per_rank = gather_breakdowns(breakdown(m.counters, m.comm_seconds, wall_s));
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
            for (int64_t id : added) sched_->cancel(id);  // nothing of them ran yet
            sched_->take_finished();
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
    if (world_ == 1) return;
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
    broadcast_vec(*links_.world, meta, DType::kI64);
    broadcast_vec(*links_.world, tokens, DType::kI32);
    broadcast_vec(*links_.world, logprobs, DType::kF32);
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
    const ModelConfig& c = model_.config();
    const AttentionShape& a = model_.attention_shape();
    const int64_t T = int64_t(prompt.size()), V = c.vocab;
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
        LATTICE_CHECK(pool_->allocate(need, blocks), "score: {} tokens need {} KV blocks, the cache holds {}", T, need,
                      pool_->num_blocks());
        std::vector<int32_t> row(size_t(a.table_width), -1);
        std::copy(blocks.begin(), blocks.end(), row.begin());
        const int64_t chunk = std::min(model_.options().max_batch_tokens, T);
        out.resize(size_t(T * V));
        int64_t issued = 0, received = 0;
        auto collect = [&](const StepPlan& p, const Results& r) {
            const int64_t n = p.seqs[0].count;
            LATTICE_CHECK(int64_t(r.logits.size()) == n * V, "score: {} logits for {} tokens", r.logits.size(), n);
            std::copy(r.logits.begin(), r.logits.end(), out.begin() + int64_t(p.seqs[0].start) * V);
            received += n;
        };
        while (received < T) {
            while (issued < T && int64_t(inflight_.size() + done_.size()) < stages_) {
                StepPlan p;
                p.kind = StepPlan::Kind::kScore;
                const int64_t n = std::min(chunk, T - issued);
                p.tokens.assign(prompt.begin() + issued, prompt.begin() + issued + n);
                PlanSeq ps;
                ps.id = -1;
                ps.start = int32_t(issued);
                ps.count = int32_t(n);
                p.seqs.push_back(ps);
                p.width = int32_t(a.table_width);
                p.tables = row;
                issue(p);
                issued += n;
            }
            if (!done_.empty()) {
                auto [p, r] = std::move(done_.front());
                done_.pop_front();
                collect(p, r);
            } else {
                StepPlan p;
                Results r = await_oldest(&p);
                collect(p, r);
            }
        }
    } catch (...) {
        if (!blocks.empty()) pool_->release(blocks);
        inflight_.clear();
        done_.clear();
        shutdown();
        throw;
    }
    pool_->release(blocks);
    shutdown();
    return out;
}

}  // namespace lattice
