// EngineClient's every-rank runs of the engine's own requests (see client.h): generate_batch,
// generate and score. The leader drives the steps while the other ranks follow; generate_batch then
// sends the results to every rank (Engine::share_results).
#include <algorithm>
#include <unordered_map>

#include "base/clock.h"
#include "base/error.h"
#include "runtime/engine/client.h"

namespace lattice {

namespace {
using Clock = SteadyClock;
constexpr auto since = seconds_since;
}  // namespace

std::vector<GenerateResult> EngineClient::generate_batch(const std::vector<GenerateRequest>& reqs,
                                                   const TokenCallback& on_token, GenerateStats* total) {
    LATTICE_CHECK(!reqs.empty(), "generate: no sequences");
    const Engine::RunMark mark = engine_.mark_run();
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
                added.push_back(engine_.add(std::move(r)));
                index[added.back()] = i;
            }
        } catch (const Error& e) {
            for (int64_t id : added) engine_.cancel(id);  // nothing of them ran yet
            engine_.core().scheduler().take_finished();
            error = e.what();
        }
        size_t started = 0;
        std::vector<bool> has_first(reqs.size(), false);
        std::vector<bool> ended(reqs.size(), false);  // by on_token: what the engine says after is moot
        while (error.empty() && engine_.busy()) {
            for (const TokenEvent& ev : engine_.step()) {
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
                        if (ev.finish == FinishReason::kNone) engine_.cancel(ev.id);  // (a finished one is gone already)
                        r.finish = why;
                    }
                }
                if (!has_first[i] && (ev.token >= 0 || ev.finish != FinishReason::kNone)) {
                    has_first[i] = true;
                    if (++started == reqs.size()) prefill_s = since(mark.start);
                }
            }
        }
        engine_.shutdown();
    } else {
        engine_.follow();
    }
    const GenerateStats stats = engine_.finish_run(mark, int64_t(reqs.size()), prefill_s, error);
    engine_.share_results(res);
    for (GenerateResult& r : res) r.stats = stats;
    if (total) *total = stats;
    return res;
}

GenerateResult EngineClient::generate(const GenerateRequest& req, const std::function<void(int32_t)>& on_token) {
    std::vector<GenerateResult> r = generate_batch({req}, on_token ? [&](int64_t, int32_t id) {
        on_token(id);
        return FinishReason::kNone;
    } : TokenCallback{});
    return std::move(r[0]);
}

std::vector<float> EngineClient::score(const std::vector<int32_t>& prompt, const std::string& lora) {
    if (!is_leader()) {
        engine_.follow();
        return {};
    }
    const Model& model = engine_.model();
    const AttentionShape& a = model.attention_shape();
    const int64_t T = int64_t(prompt.size()), V = model.config().vocab;
    EngineCore& core = engine_.core();
    BlockPool& pool = core.pool();
    std::vector<float> out;
    std::vector<int32_t> blocks;
    int32_t slot = 0;
    try {
        LATTICE_CHECK(!engine_.busy(), "score: the engine is busy with requests");
        if (!lora.empty()) slot = engine_.loras().acquire(lora).slot;
        LATTICE_CHECK(T >= 1, "empty prompt: give at least one token");
        LATTICE_CHECK(T <= model.max_seq(),
                      "prompt of {} tokens is longer than the model's context ({} positions per sequence)", T,
                      model.max_seq());
        for (int64_t i = 0; i < T; ++i)
            LATTICE_CHECK(prompt[size_t(i)] >= 0 && prompt[size_t(i)] < V,
                          "prompt token {} (at index {}) is outside the vocab of {}", prompt[size_t(i)], i, V);
        const int64_t need = (T + a.block_size - 1) / a.block_size;
        LATTICE_CHECK(pool.allocate(need, blocks), "score: {} tokens need {} KV blocks, the cache holds {}", T, need,
                      pool.num_blocks());
        std::vector<int32_t> row(size_t(a.table_width), -1);
        std::copy(blocks.begin(), blocks.end(), row.begin());
        out = score_chunks(prompt, row, slot);
    } catch (...) {
        if (slot) engine_.loras().release(slot);
        if (!blocks.empty()) pool.release(blocks);
        core.abandon();
        engine_.shutdown();
        throw;
    }
    pool.release(blocks);
    if (slot) engine_.loras().release(slot, T);
    engine_.shutdown();
    return out;
}

// The prompt in kScore plans of up to max_batch_tokens tokens (as many in flight as there are stages),
// their logits into one [tokens, vocab] array.
std::vector<float> EngineClient::score_chunks(const std::vector<int32_t>& prompt, const std::vector<int32_t>& table,
                                              int32_t lora) {
    EngineCore& core = engine_.core();
    const int64_t T = int64_t(prompt.size()), V = engine_.model().config().vocab;
    const int64_t chunk = std::min(engine_.model().options().max_batch_tokens, T);
    std::vector<float> out(size_t(T * V));
    int64_t issued = 0, received = 0;
    while (received < T) {
        while (issued < T && core.has_room()) {
            StepPlan p;
            p.kind = StepPlan::Kind::kScore;
            const int64_t n = std::min(chunk, T - issued);
            p.tokens.assign(prompt.begin() + issued, prompt.begin() + issued + n);
            PlanSeq ps;
            ps.id = -1;
            ps.start = int32_t(issued);
            ps.count = int32_t(n);
            ps.lora = lora;
            p.seqs.push_back(ps);
            p.width = int32_t(table.size());
            p.tables = table;
            core.issue(std::move(p));
            issued += n;
        }
        const auto [p, r] = core.take_oldest();
        const int64_t n = p.seqs[0].count;
        LATTICE_CHECK(int64_t(r.logits.size()) == n * V, "score: {} logits for {} tokens", r.logits.size(), n);
        std::copy(r.logits.begin(), r.logits.end(), out.begin() + int64_t(p.seqs[0].start) * V);
        received += n;
    }
    return out;
}

}  // namespace lattice
