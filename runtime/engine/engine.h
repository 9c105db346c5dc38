// Engine: one rank's engine, assembled from vLLM v1's parts (each in its own file):
//   EngineCore (engine_core.h)       the leader's schedule -> execute -> update loop over the
//                                    Scheduler and its KvCacheManager (world rank 0 only);
//   RankExecutor (rank_executor.h)   the plan transport, the followers' loop, the heartbeat and the
//                                    run's collectives: the only part that talks to the communicators;
//   ModelRunner (model_runner.h)     what runs a plan on this rank: BackendRunner (the model on its
//                                    CPU or CUDA backend, step graphs, sampling and draft verification)
//                                    or SimRunner (the simulated device), chosen here once.
// World rank 0 is the leader: it alone holds requests. Each step it builds a StepPlan (which
// sequences, which tokens, positions, block tables, sampling params) and sends it to every other
// rank in one message; every rank runs the plan through its part of the model (TP shard, pipeline
// stage); the sampler rank (last stage, TP rank 0) samples and returns the tokens to the leader.
// With P pipeline stages the leader keeps up to P steps in flight, so stages overlap whenever the
// running sequences split into P micro-batches; prefill chunks of one prompt pipeline the same way.
// The fronts drive the leader through EngineClient (client.h), which also holds the every-rank
// runs (generate_batch, generate, score); the other ranks follow().
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "runtime/backend/sim/sim_device.h"
#include "runtime/engine/engine_core.h"
#include "runtime/engine/engine_stats.h"
#include "runtime/engine/model_runner.h"
#include "runtime/engine/rank_executor.h"
#include "runtime/engine/scheduler.h"
#include "runtime/model/model.h"

namespace lattice {

inline constexpr int64_t kMaxSpeculativeTokens = 16;  // drafts per sequence per step at most

struct EngineOptions {
    int64_t kv_blocks = 0;  // blocks of the paged cache (the model's allocate_kv size)
    bool prefix_caching = true;
    int64_t max_seqs = 64;     // running sequences at most
    // Prompt tokens per step (0: the model's max_batch_tokens); a step also holds one decode token
    // per running sequence of its micro-batch, all within the model's max_batch_tokens rows (the
    // builder sizes them: the budget plus ceil(max_seqs / stages)).
    int64_t step_tokens = 0;
    // Latency target of a step with decodes in it (seconds; 0: none): the scheduler takes fewer prompt
    // tokens into such a step, by a cost model fitted to the measured steps (--max-itl-ms).
    double max_itl_s = 0;
    double heartbeat_s = 5.0;  // an idle leader pings the followers at least this often
    // Speculative decoding by prompt lookup (runtime/engine/speculative.h): drafts per decoding sequence
    // per step, checked in the same step (0: off). The builder adds rows for them
    // (--speculative ngram --num-speculative-tokens k).
    int64_t speculative_tokens = 0;
    // Their proposer (leader): null is prompt lookup (runtime/engine/scheduler.h SchedulerOptions::proposer).
    DraftProposer draft_proposer;
    // Decode steps as captured step graphs (CUDA graphs) on a backend that has them, one per
    // batch-size bucket, padded with dummy sequences on a reserved KV block; every layout (with
    // pipeline stages each stage captures its own part; the hand-offs run between the graphs).
    // false: every step eager (--enforce-eager).
    bool step_graphs = true;
    // The buckets, increasing (empty: 1, 2, 4, then every multiple of 8 up to min(max_seqs, the
    // model's max_batch_tokens), which is the last); a decode step of T sequences runs the smallest
    // bucket >= T. Sizes above that cap are dropped; T above the last bucket runs eagerly.
    std::vector<int64_t> graph_buckets;
    // The simulated device (runtime/backend/sim/sim_device.h): set, each forward waits out its
    // predicted time instead of running the (shape-only) model, and the sampler returns pseudo-tokens.
    std::shared_ptr<const SimDevice> sim;
    // LoRA (runtime/engine/lora_registry.h): adapters resident at once (--max-loras) and the largest
    // rank accepted (--max-lora-rank).
    int64_t max_loras = 4;
    int64_t max_lora_rank = 64;
};

class Engine {
public:
    Engine(Model& model, PipelineLinks links, const EngineOptions& opt);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    bool is_leader() const { return exec_.is_leader(); }
    bool is_sampler() const { return exec_.is_sampler(); }
    Model& model() { return model_; }

    // ---- leader (EngineCore) ----
    // Queues a request; returns its id. Throws Error naming the problem for one that can never run.
    int64_t add(EngineRequest r);
    void cancel(int64_t id);
    bool busy() const;  // requests waiting or running, or steps in flight
    // One round: issues steps while the pipeline has room, then completes the oldest in flight and
    // returns its tokens and finishes. Returns at once (heartbeat if due) when there is nothing to do.
    std::vector<TokenEvent> step();
    // Completes what is in flight, then tells the followers to leave follow().
    void shutdown();
    const Scheduler& scheduler() const;
    EngineCore& core();
    LoraRegistry& loras() { return core().loras(); }

    // ---- followers ----
    void follow();

    // ---- every rank ----
    // EngineClient's generate_batch / generate / score (client.h), for the callers that hold an Engine
    // only: each builds a client without a tokenizer and forwards.
    std::vector<GenerateResult> generate_batch(const std::vector<GenerateRequest>& reqs,
                                               const TokenCallback& on_token = {}, GenerateStats* total = nullptr);
    GenerateResult generate(const GenerateRequest& req, const std::function<void(int32_t)>& on_token = {});
    // One run's accounting, shared by generate_batch and the engine client's run(): mark it on every
    // rank before, then finish_run (a collective: every rank calls it) returns the run's stats on
    // every rank. `error` is the leader's ("" when none; the followers' is ignored): every rank then
    // throws it, the followers naming the leader. `prefill_seconds`: the leader's, until every
    // sequence had its first token.
    struct RunMark {
        std::chrono::steady_clock::time_point start;
        EngineCounters counters;
        double comm_seconds = 0;
        SchedulerStats sched;  // leader
    };
    RunMark mark_run() const;
    GenerateStats finish_run(const RunMark& mark, int64_t sequences, double prefill_seconds, const std::string& error);
    // The leader's results to every rank (a collective).
    void share_results(std::vector<GenerateResult>& res) const;
    std::vector<float> score(const std::vector<int32_t>& prompt);

    const EngineCounters& counters() const { return counters_; }
    // This rank's breakdown between two snapshots of counters() (and of model().comm_seconds()).
    StepBreakdown breakdown(const EngineCounters& since, double comm_since, double wall_seconds) const;

private:
    Model& model_;
    PipelineLinks links_;
    EngineOptions opt_;
    EngineCounters counters_;              // (before the parts: they hold a reference)
    RankExecutor exec_;
    std::unique_ptr<ModelRunner> runner_;  // BackendRunner or SimRunner
    std::unique_ptr<EngineCore> core_;     // leader
};

}  // namespace lattice
