// Scheduler: the leader's (world rank 0) view of every request: which sequences run and which tokens
// each step feeds (vLLM v1's Scheduler). Where their K/V go is KvCacheManager's (kv_cache_manager.h,
// over the paged BlockPool): it allocates blocks, finds and registers cached prefixes and picks which
// sequence a shortage preempts; the scheduler asks it and follows.
//
// Policy (continuous batching with chunked prefill, like vLLM's):
//  - a step holds first one decode token for each running sequence waiting for nothing (oldest
//    first; of its micro-batch with a pipeline), then at most `step_tokens` prompt tokens: prefill
//    chunks of running or newly admitted sequences (oldest first: a waiting request is never
//    overtaken), so long prompts share steps with decodes and a small budget bounds the chunks
//    (the stall a decoding sequence sees), never how many sequences run; the whole step stays
//    within `step_capacity` (the builder sizes it for max_seqs / micro_batches decodes beside the
//    budget);
//  - a latency target (max_itl_s > 0, `--max-itl-ms`): a step that holds decodes takes only as many
//    prompt tokens as keep its predicted time within the target (at least min_chunk, so prompts
//    always progress), from a cost model fitted to the measured steps (StepCost: seconds = a + b *
//    tokens); a step without decodes stalls no one and takes the whole budget (Sarathi-Serve's
//    stall-free batching; vLLM's chunked prefill budget is a fixed token count instead);
//  - priority: every pass above goes by (priority, arrival), lower priority values first; a waiting
//    request is never overtaken by one of its own level or below; preemption takes the running
//    sequence of the highest value (the youngest among equals) first;
//  - at most `max_seqs` sequences run; with a pipeline of P stages the running sequences are split
//    into P micro-batches so P steps can be in flight (a sequence is in at most one step awaiting a
//    sample; prefill chunks of one prompt may be in flight back to back): a step takes at most 1/P of
//    the decoding sequences and admits new ones up to 1/P of the active ones, while the chunks of
//    running prompts go in any step (prompt tokens are most of a step's work): the steps in flight
//    stay equal, so no stage idles waiting on a short partner step (vLLM pins sequences to one of P
//    virtual engines instead, each with its own budget);
//  - blocks are allocated as positions are reached; when they run out the youngest running sequence
//    that nothing in flight uses is preempted: its blocks return to the pool, its tokens (prompt and
//    generated so far) are recomputed when it is admitted again. Never a crash, never a truncation;
//  - prefix caching: an admitted prompt reuses cached full blocks of an identical prefix (at least
//    its last token is always computed, for its logits); full blocks are cached as they complete;
//  - structured output: a sequence's next mask is computed on the MaskWorker's thread
//    (grammar_worker.h) from the moment its token is accepted; a step waits for a mask at most
//    kMaskWaitShare of its predicted time, then runs without that sequence (its prompt's last token
//    held back too), so a slow mask delays its own sequence only; a step with nothing else waits for it.
// Speculative decoding (spec_tokens > 0): a decoding sequence's step feeds its last token and up to
// spec_tokens prompt-lookup drafts; the accepted ones and one more come back at once (their K/V stay,
// the rest is overwritten later: computed falls back to the accepted length), each through the stop
// rules in order. Drafts use room a step has beside its prompt budget (step_capacity).
// Stop rules, applied when a sampled token arrives: eos (unless ignore_eos) or a stop id after at
// least min_tokens (before that they are banned from sampling), max_new_tokens, or the context
// (max_seq positions) full. A request that can never run (empty, prompt longer than the context,
// more blocks than the pool holds) is refused by add() with the reason.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/engine/block_pool.h"
#include "runtime/engine/kv_cache_manager.h"
#include "runtime/engine/speculative.h"
#include "runtime/engine/step_plan.h"

namespace lattice {

class GrammarMatcher;
class MaskWorker;

enum class FinishReason : uint8_t {
    kNone = 0,
    kStop,       // eos or a stop id (or, in the engine client, a stop string)
    kLength,     // max_new_tokens reached, or the context (max_seq positions) is full
    kCancelled,  // by its caller (a front's user, a drain)
};
// The one set of words every front prints (OpenAI's): "stop", "length", "cancelled". Inline: the fronts'
// protocol code (launch/openai/, and the fuzz targets built from it) needs it without the scheduler.
inline std::string_view finish_reason_name(FinishReason r) {
    switch (r) {
        case FinishReason::kNone:
            return "none";
        case FinishReason::kStop:
            return "stop";
        case FinishReason::kLength:
            return "length";
        case FinishReason::kCancelled:
            return "cancelled";
    }
    return "?";
}

struct EngineRequest {
    std::vector<int32_t> prompt;
    int64_t max_new_tokens = 16;
    int64_t min_tokens = 0;  // eos / stop ids cannot end the sequence before this many tokens
    SamplingParams sampling;
    bool ignore_eos = false;  // the model's eos does not stop (stop ids still do)
    std::vector<int32_t> stop_ids;
    int64_t priority = 0;     // lower runs first (vLLM's), first come first served within a level
    // Structured output (runtime/engine/grammar.h): the sequence's position in its grammar. Each step
    // that samples it carries the mask of the tokens the grammar allows; each sampled token advances
    // it; the output ends (kStop, the token shown as text) when the grammar is finished, or at an end
    // id (eos, end of turn) once it is complete, ignore_eos or not. Near max_tokens the mask keeps only
    // tokens after which the output can still be completed in the tokens left, so it ends well-formed
    // when max_tokens leaves room for that (grammar_worker.h: mask_for). Masks are computed on the
    // MaskWorker's thread (a sequence whose mask is late sits the step out). One matcher per sequence.
    std::shared_ptr<GrammarMatcher> grammar = nullptr;
    // LoRA: the slot of the request's adapter on every rank (Model::set_lora; 0: the base) and its
    // identity in the prefix cache (unique per adapter load, so a slot reused by another adapter never
    // shares K/V; 0: the base). Set by the engine client from the adapter's name.
    int32_t lora = 0;
    uint64_t lora_key = 0;
};

struct TokenEvent {
    int64_t id = 0;
    int32_t token = -1;  // -1: no token (a finish without one: cancelled, or nothing to generate)
    float logprob = 0;
    FinishReason finish = FinishReason::kNone;
    double queue_seconds = -1;  // on a sequence's first token: from add() to its first admission
    std::vector<SampledToken> top{};  // sampling.logprobs > 0: the most likely tokens of its row (Engine)
    bool grammar_end = false;  // kStop because the grammar is finished: `token` is part of the output's text
    int64_t cached_tokens = -1;  // on a sequence's first token: its prompt tokens the prefix cache served
};

// The time of a step against its token count, fitted to measured steps: seconds = a + b * tokens, by
// least squares with exponential forgetting (recent steps weigh most: load and context lengths
// change). Until two distinct token counts were seen, b is the mean seconds per token (a = 0).
class StepCost {
public:
    void observe(int64_t tokens, double seconds);
    bool ready() const { return n_ > 0; }
    double a() const;
    double b() const;
    // The most tokens a step may hold to take at most `seconds` (0 when even the fixed part exceeds it).
    int64_t tokens_within(double seconds) const;

private:
    static constexpr double kKeep = 0.95;  // weight of the past per new step
    double n_ = 0, st_ = 0, stt_ = 0, sy_ = 0, sty_ = 0;
};

struct SchedulerOptions {
    int64_t step_tokens = 256;  // prompt tokens per step, besides the decode tokens
    double max_itl_s = 0;       // latency target of a step with decodes in it (0: none; see above)
    int64_t min_chunk = 16;     // prompt tokens a step with decodes takes at least, whatever the target
    int64_t step_capacity = 0;  // tokens a step can hold in all (the model's rows); 0: step_tokens
    int64_t max_seqs = 64;      // running sequences at most
    int64_t max_seq = 0;        // positions per sequence (context)
    int micro_batches = 1;      // pipeline stages: running sequences are spread over this many steps
    int64_t vocab = 0;          // token ids are checked against it
    std::vector<int64_t> eos_ids;
    // Speculative decoding by prompt lookup (runtime/engine/speculative.h): a decoding sequence feeds up
    // to spec_tokens drafts after its last token and the sampler checks them in the same step. 0: off.
    // Sequences with a grammar, penalties, top logprobs or min_tokens still to reach decode normally.
    int64_t spec_tokens = 0;
    int spec_ngram_min = 1, spec_ngram_max = 3;
    // The drafts of a sequence (its tokens so far, at most k): null is prompt lookup. A hook for other
    // proposers (tests; a draft model).
    DraftProposer proposer;
};

struct SchedulerStats {
    int64_t preemptions = 0;
    int64_t peak_blocks = 0;    // most blocks in use at once
    int64_t cached_tokens = 0;  // prompt tokens found in the prefix cache
    int64_t prompt_tokens = 0;  // over admitted requests
    int64_t generated_tokens = 0;
    int64_t drafted_tokens = 0;   // speculative decoding: drafts fed
    int64_t accepted_tokens = 0;  // ... of which the sampler accepted
    int64_t mask_skips = 0;       // steps a sequence with a grammar sat out because its mask was not done
};

class Scheduler {
public:
    Scheduler(const SchedulerOptions& opt, BlockPool& pool);
    ~Scheduler();

    // Throws Error (naming the limit) for a request that can never run; add() would take any other.
    void check(const EngineRequest& req) const;
    // Queues a request (check() first); returns its id.
    int64_t add(EngineRequest req);
    // Ends a request as cancelled: at once when nothing of it is in flight, else when its step completes.
    void cancel(int64_t id);
    // The next step (empty when nothing can run now). Marks its tokens as issued.
    StepPlan next(int64_t number);
    // A step of `tokens` tokens took `seconds` from its plan to its sampled tokens (the latency target's
    // cost model learns from it).
    void observe_step(int64_t tokens, double seconds) { cost_.observe(tokens, seconds); }
    const StepCost& step_cost() const { return cost_; }
    // The sampled tokens of `plan` arrived: plan.sample_slots() slots, 1 + n_draft per sampled sequence in
    // plan order, its tokens first (a speculating sequence's accepted drafts, then one more), then -1s.
    std::vector<TokenEvent> complete(const StepPlan& plan, std::span<const SampledToken> sampled);
    // Finishes decided outside a step (cancel of an idle sequence, nothing to generate), drained once.
    std::vector<TokenEvent> take_finished();
    // Sequences that ended since the last plan (the sampler rank drops their state); drained once.
    std::vector<int64_t> take_released() { return std::exchange(released_, {}); }

    // Nothing waiting, running or in flight, and no finish left to report.
    bool idle() const { return seqs_.empty() && finished_.empty(); }
    int64_t waiting() const;
    int64_t running() const;
    const SchedulerStats& stats() const { return stats_; }
    const BlockPool& pool() const { return kv_.pool(); }
    // Structured output's masks (runtime/engine/grammar_worker.h): its statistics; hold() for tests.
    MaskWorker& mask_worker();

private:
    struct Seq {
        int64_t id = 0;
        EngineRequest req;
        std::vector<int32_t> tokens;  // prompt, then generated
        int64_t prompt_len = 0;
        int64_t computed = 0;   // tokens whose K/V are written or being written
        int64_t inflight = 0;   // issued steps not completed
        bool awaiting = false;  // a sample is on its way
        bool running = false;   // admitted (holds blocks) vs waiting
        bool cancelled = false;
        bool admitted_before = false;  // counted in the prompt tokens (preemption re-admits)
        std::chrono::steady_clock::time_point arrived;  // add()
        double queue_seconds = -1;                      // add() to the first admission
        int64_t cached_prompt = 0;                      // prompt tokens from the prefix cache at that admission
        int64_t generated() const { return int64_t(tokens.size()) - prompt_len; }
    };

    // The sequences by (priority, id): the order every pass of next() takes them in.
    std::vector<Seq*> by_priority();
    // Blocks for `positions` positions of s; a running s may preempt others (KvCacheManager's choice
    // among those nothing in flight or in this plan uses) and even itself (then false).
    bool ensure_blocks(Seq& s, int64_t positions, const std::vector<int64_t>& in_plan);
    void preempt(Seq& v);
    // One next(): the plan being built and what it has taken so far.
    struct Building {
        StepPlan p;
        std::vector<int64_t> in_plan;  // the sequences in p
        int64_t budget = 0;            // prompt tokens left
        int64_t cap = 0;               // sequences a step takes (a micro-batch's share)
        int64_t decodes = 0, prompt_tails = 0, drafted = 0;
        std::chrono::steady_clock::time_point mask_deadline;  // masks not done by then: their sequence waits
        bool mask_skipped = false;                            // some sequence did
    };
    // How long a step waits for a pending grammar mask: this share of its predicted time (StepCost),
    // at least kMaskWaitMin_s. A plain sequence's step grows by that much at most.
    static constexpr double kMaskWaitShare = 0.1, kMaskWaitMin_s = 200e-6;
    static bool ready(const Seq& s) { return s.running && !s.awaiting && !s.cancelled; }
    int64_t step_capacity() const { return opt_.step_capacity > 0 ? opt_.step_capacity : opt_.step_tokens; }
    void take(Building& b, Seq& s, int64_t n, const std::vector<int32_t>& drafts = {});
    void add_mask(StepPlan& p, Seq& s) const;
    bool mask_ready(Building& b, const Seq& s);
    void take_decodes(Building& b, const std::vector<Seq*>& order);
    void take_chunks(Building& b, const std::vector<Seq*>& order);
    void admit(Building& b, const std::vector<Seq*>& order, int64_t n_running);
    void release(Seq& s);  // its blocks back, and the sampler rank told (it leaves seqs_ after)
    void finish(Seq& s, FinishReason why, std::vector<TokenEvent>& out, int32_t token, float logprob);
    bool is_stop(const Seq& s, int32_t token) const;
    std::vector<int32_t> drafts_for(const Seq& s, int64_t room) const;  // speculative decoding
    // One sampled token of s: appended, its stop rules, its event (and the finish). False once s ended.
    bool append(Seq& s, const SampledToken& st, std::vector<TokenEvent>& out);

    SchedulerOptions opt_;
    KvCacheManager kv_;
    std::map<int64_t, Seq> seqs_;  // by id = arrival order
    int64_t next_id_ = 0;
    std::vector<int64_t> released_;
    std::vector<TokenEvent> finished_;
    SchedulerStats stats_;
    StepCost cost_;
    std::unique_ptr<MaskWorker> masks_;
};

}  // namespace lattice
