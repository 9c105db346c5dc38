// Engine: continuous batching over a paged KV cache, driven by a leader rank.
//
// World rank 0 is the leader: it alone holds requests and the Scheduler (scheduler.h). Each step it
// builds a StepPlan (which sequences, which tokens, positions, block tables, sampling params) and
// sends it to every other rank in one message (without waiting for busy ones, and with the block
// tables as changes: step_plan.h, send_plan); every rank runs the plan through its part of the
// model (TP shard, pipeline stage: the first stage embeds, each stage passes its hidden rows to the
// next, the last computes logits); the sampler rank (last stage, TP rank 0) samples and returns the
// tokens to the leader. No rank but the leader ever sees a request.
// With P pipeline stages the leader keeps up to P steps in flight (it computes stage 0 of step k+1
// while stage 1 works on step k ...), so stages overlap whenever the running sequences split into
// P micro-batches; prefill chunks of one prompt pipeline the same way.
// Followers run follow() (plans until the leader's shutdown); an idle leader sends a heartbeat at
// least every heartbeat_s, so a follower's deadline (the communicator's) only fires on a dead leader.
//
// The fronts (`lattice generate`, `batch`, `serve`) drive step() on the leader. generate_batch(),
// generate() and score() are the every-rank conveniences for tools and tests.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "parallel/communicator.h"
#include "runtime/backend/sim/sim_device.h"
#include "runtime/engine/block_pool.h"
#include "runtime/engine/sampler.h"
#include "runtime/engine/scheduler.h"
#include "runtime/engine/step_plan.h"
#include "runtime/model/model.h"

namespace lattice {

struct PipelineLinks {
    Communicator* pipe = nullptr;   // this rank's pipeline group (one rank per stage); null: one stage
    int prev = -1;                  // pipe rank of the previous stage, -1 on the first
    int next = -1;                  // pipe rank of the next stage, -1 on the last
    Communicator* world = nullptr;  // all ranks (host memory); null: a single rank
    Communicator* plans = nullptr;  // all ranks, the step plans only (a deep send queue); null: world
    Communicator* tp = nullptr;     // this stage's TP group: the simulated device's all-reduces
    int sampler = 0;                // world rank that samples
};

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
};

// The every-rank convenience API (tools, tests) takes the engine's own request: ignore_eos lets the
// model's eos pass, stop_ids still end the sequence (runtime/engine/client.h adds the tokenizer's
// end-of-generation ids unless ignore_eos).
using GenerateRequest = EngineRequest;

// Where one rank's wall time went over a run (seconds; the five parts sum to wall):
//   compute          inside the model (embed, layers, head) but not in its TP communicator;
//   communication    in the TP communicator (all-reduces, the logits' all-gather; Model::comm_seconds);
//   pipeline_bubble  blocked on a peer: the previous stage's activations, the sampler's tokens
//                    (leader), the leader's next plan (followers);
//   sampling         the sampler rank's per-sequence sampling and log-softmax;
//   host_overhead    the rest: scheduling, plan encoding, sends, the front's callbacks.
// plan_wait (leader) is the part of host_overhead spent in the plans' send calls, plan_blocked the
// part of that waiting for a follower kPlanQueue plans behind (see send_plan); not parts of the sum.
struct StepBreakdown {
    int rank = 0, tp_rank = 0, pp_rank = 0;
    int64_t steps = 0;  // forwards this rank ran
    double wall = 0, compute = 0, communication = 0, pipeline_bubble = 0, sampling = 0, host_overhead = 0;
    double plan_wait = 0;
    double plan_blocked = 0;  // of plan_wait, waiting for a follower kPlanQueue plans behind
    int64_t plan_bytes = 0;   // leader: encoded plan bytes sent (to each follower)
};

struct GenerateStats {
    int64_t prompt_tokens = 0;     // over all sequences
    double prefill_seconds = 0;    // until every sequence had its first token
    int64_t generated_tokens = 0;  // over all sequences
    double decode_seconds = 0;     // the rest
    double idle_seconds = 0;       // this rank, blocked waiting for peers
    double compute_seconds = 0;    // this rank, inside the model (embed, layers, head) and sampling
    int64_t sequences = 1;
    int64_t preemptions = 0;
    int64_t peak_kv_blocks = 0;
    int64_t cached_prompt_tokens = 0;
    int64_t drafted_tokens = 0;   // speculative decoding: drafts fed
    int64_t accepted_tokens = 0;  // ... and accepted
    std::vector<StepBreakdown> per_rank;  // every world rank's, in rank order (every rank gets all)
};

// generate_batch's per-token callback (leader only): sequence index, token. kNone goes on; any other
// reason ends that sequence now, with that reason (a front's stop string: kStop; a user's
// interrupt: kCancelled). The token is part of the result either way.
using TokenCallback = std::function<FinishReason(int64_t seq, int32_t token)>;

struct GenerateResult {
    std::vector<int32_t> tokens;  // generated ids (the stop token included when one ended the run)
    std::vector<float> logprobs;  // of each generated token: log-softmax of the model's raw logits
                                  // (temperature 1, before penalties, bans and truncation)
    FinishReason finish = FinishReason::kNone;
    GenerateStats stats;
};

// What a rank has done so far (every rank keeps its own).
struct EngineCounters {
    int64_t steps = 0;
    double compute_seconds = 0;  // embed, layers, head and sampling, TP communication included
    double sample_seconds = 0;   // of which sampling (sampler rank)
    double wait_seconds = 0;     // blocked on a peer: pipeline receive, the leader's token receive, the next plan
    int64_t graph_steps = 0;     // of the steps, decode steps run through a step graph (eager warm-ups included)
    int64_t graph_replays = 0;   // of those, replays of a captured graph
    int64_t graphs_captured = 0; // step graphs captured (one per batch-size bucket used)
    double plan_wait_seconds = 0;  // leader: in the plans' send calls (wall: copies, MPI, and waits)
    double plan_blocked_seconds = 0;  // leader: of which waiting for a follower (a full plan queue)
    double plan_cpu_seconds = 0;      // leader: of which its thread ran (the rest: descheduled, or blocked)
    double sim_overrun_seconds = 0;   // simulated device: real work of a step past the step's predicted time
    int64_t plans_sent = 0;        // leader: plans sent (steps, heartbeats, shutdown)
    int64_t plan_bytes = 0;        // leader: their encoded bytes (per follower)
};

class Engine {
public:
    Engine(Model& model, PipelineLinks links, const EngineOptions& opt);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    bool is_leader() const { return rank_ == 0; }
    bool is_sampler() const { return rank_ == links_.sampler; }
    Model& model() { return model_; }

    // ---- leader ----
    // Queues a request; returns its id. Throws Error naming the problem for one that can never run.
    int64_t add(EngineRequest r);
    void cancel(int64_t id);
    bool busy() const;  // requests waiting or running, or steps in flight
    // One round: issues steps while the pipeline has room, then completes the oldest in flight and
    // returns its tokens and finishes. Returns at once (heartbeat if due) when there is nothing to do.
    std::vector<TokenEvent> step();
    // Tells the followers to leave follow(); waits for nothing in flight first.
    void shutdown();
    const Scheduler& scheduler() const { return *sched_; }

    // ---- followers ----
    void follow();

    // ---- every rank ----
    // Runs the requests to completion (leader) / follows (others); results on every rank. Sequence i
    // samples with seed reqs[i].sampling.seed + i (distinct streams, reproducible).
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
    // Logits of every prompt position, [prompt.size(), vocab] row-major, on world rank 0.
    std::vector<float> score(const std::vector<int32_t>& prompt);

    const EngineCounters& counters() const { return counters_; }
    // This rank's breakdown between two snapshots of counters() (and of model().comm_seconds()).
    StepBreakdown breakdown(const EngineCounters& since, double comm_since, double wall_seconds) const;

private:
    struct Results {
        std::vector<SampledToken> tokens;
        std::vector<SampledToken> top;  // per sampled sequence in plan order, its sampling.logprobs best
        std::vector<float> logits;
    };
    // The top alternatives of `r` onto the events of the sequences that asked for them.
    static void attach_top(const StepPlan& p, const Results& r, std::vector<TokenEvent>& events);
    void send_plan(const StepPlan& p);
    StepPlan recv_plan();
    Communicator& plan_comm() const { return links_.plans ? *links_.plans : *links_.world; }
    void execute(const StepPlan& p, Results* out);
    void sim_execute(const StepPlan& p, Results* out);
    void sample_rows(const StepPlan& p, const View& logits, Results* out);
    static void verify_drafts(int32_t n_draft, const int32_t* drafts, float* rows, int64_t V,
                              std::span<const int32_t> bans, Sampler& sampler, SampledToken* out);
    // A decode-only step through the captured graph of its bucket; false when the step is not one.
    bool graph_step(const StepPlan& p, const TokenBatch& b, Results* out, double* waited);
    void issue(const StepPlan& p);
    Results await_oldest(StepPlan* plan);
    void send_results(const StepPlan& p, const Results& r);
    void heartbeat_if_due();
    void observe_step(const StepPlan& p);  // leader: the step's time (issue to results) to the scheduler
    std::vector<StepBreakdown> gather_breakdowns(const StepBreakdown& mine) const;
    void share_results(std::vector<GenerateResult>& res) const;
    void end_follow();

    Model& model_;
    PipelineLinks links_;
    EngineOptions opt_;
    int rank_ = 0, world_ = 1, stages_ = 1;
    std::unique_ptr<BlockPool> pool_;                // leader
    std::unique_ptr<Scheduler> sched_;               // leader
    std::deque<StepPlan> inflight_;                  // leader: issued, results pending (pipelines)
    std::deque<std::pair<StepPlan, Results>> done_;  // leader: completed locally, not yet applied
    std::map<int64_t, std::chrono::steady_clock::time_point> issued_at_;  // leader: plan number -> when it was issued
    int64_t number_ = 0;                             // last plan number sent / received
    PlanTables plan_tables_;  // the block tables the followers know (leader: sent; follower: received)
    std::unordered_map<int64_t, Sampler> samplers_;  // sampler rank: per-sequence state
    std::vector<float> host_rows_;  // sampler rank: logits rows sampled on the host
    std::vector<std::vector<TokenPenalty>> penalties_;  // sampler rank: each backend row's penalty edits
    std::vector<uint8_t> sim_rows_;   // the simulated device's hidden rows (hand-offs, all-reduces)
    // Step graphs: on when opt_.step_graphs and the backend captures steps (any TP x PP layout).
    struct GraphSlot {
        bool warmed = false;  // one eager step of this bucket ran (scratch sized)
        std::unique_ptr<StepGraph> graph;
        View hidden;  // the bucket's hidden rows [bucket, hidden] (a later stage receives into them)
        View logits;  // where the graph leaves the bucket's logits [bucket, vocab] (last stage)
    };
    bool graphs_on_ = false;
    std::vector<int64_t> graph_buckets_;  // increasing batch sizes (EngineOptions::graph_buckets)
    int64_t graph_max_ = 0;               // largest bucket
    int32_t trash_block_ = -1;            // the KV block the padding rows write (never in the pool)
    std::unordered_map<int64_t, GraphSlot> graphs_;
    // The padded batch a step graph replays (capacity fixed at start).
    std::vector<int32_t> graph_tokens_, graph_positions_, graph_seqs_, graph_tables_;
    std::vector<int64_t> graph_rows_;
    std::vector<int32_t> pos_, seq_of_;
    std::chrono::steady_clock::time_point last_sent_;
    EngineCounters counters_;
};

}  // namespace lattice
