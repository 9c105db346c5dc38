// EngineClient: the one way a front (`lattice generate`, `chat`, `batch`, `serve`, the benchmarks)
// talks to the engine. vLLM's output processor is the model: requests in, events out.
//   in   ClientRequest: prompt ids, sampling, stop strings, token stops, limits;
//   out  ClientEvent per generated token: the newly visible text (incremental detokenization, stop
//        strings applied across token boundaries and held back while they could still match,
//        runtime/engine/text_stream.h), the token id and its logprob; the request's last event
//        carries its finish reason (one enum, one set of words: "stop", "length", "cancelled") and
//        its usage.
// The rules that used to live in each front live here only:
//   - the context budget: max_tokens is clamped to the room the prompt leaves in the context
//     (kRestOfContext asks for all of it); a prompt that leaves no room is an Error naming both
//     sizes (unless it asks for 0 tokens);
//   - finish reasons: eos, an end-of-generation id of the tokenizer, a stop_token_id or a stop
//     string -> kStop; max_tokens or a full context -> kLength (context_full says which);
//     a caller's cancel or a drain -> kCancelled. The token that ended a request by kStop is
//     returned among the ids, its text is not shown (nor is a stop string, nor what follows it);
//   - ignore_eos: the model's eos and the tokenizer's end-of-generation ids do not stop (explicit
//     stop_token_ids and stop strings still do);
//   - drain: no new requests; running ones finish until the deadline, then end as cancelled.
// A request may hold several sequences (OpenAI's n / best_of, a list of prompts: vLLM's parent
// request): submit(choices, siblings) takes them as one request with one id. Choices come in runs of
// `siblings` per prompt; the first of each run runs at once, the others once it has its first token,
// so the prefix cache serves them its prompt's full KV blocks instead of each computing the prompt in
// the same step. Events carry the request's id and the choice's index; each choice's last event its
// finish reason and usage; the request's very last event is marked last_of_request and carries the
// request's usage (every prompt once, every choice's output). Every choice is checked before any
// runs, so a refused request leaves nothing behind; a cancel or a drain ends every choice.
// LoRA: a request names an adapter (ClientRequest::lora) and holds one of the --max-loras slots from its
// start to its last choice's end. When every slot is held by running requests, it waits, in arrival
// order, until a request's end frees a slot (vLLM's LoRA-waiting queue): poll() admits the first waiting
// request whenever its adapter can be made resident, and so the next; a request whose adapter is resident
// starts at once unless older requests wait for a slot and its adapter is not resident. A waiting request
// whose adapter is unloaded before it starts ends as cancelled.
// Ranks: the leader (world rank 0) submits and polls; the other ranks follow(). run() is the
// every-rank form (generate, chat, the benchmarks): every rank calls it, the leader gets the outputs,
// every rank the run's statistics.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/engine/grammar.h"
#include "runtime/engine/text_stream.h"
#include "runtime/tokenizer/tokenizer.h"

namespace lattice {

struct ClientRequest {
    static constexpr int64_t kRestOfContext = -1;
    std::vector<int32_t> prompt;
    int64_t max_tokens = 16;  // new tokens at most; kRestOfContext: all the context leaves room for
    int64_t min_tokens = 0;   // eos and stop ids cannot end the output before this many tokens
    SamplingParams sampling;
    std::vector<std::string> stop;        // stop strings (need a tokenizer)
    std::vector<int32_t> stop_token_ids;  // ids that end the output (besides eos / end-of-generation)
    bool ignore_eos = false;
    int64_t priority = 0;  // lower runs first; first come first served within a level
    // Structured output (runtime/engine/grammar.h): sampling follows the grammar's token mask and the
    // output ends when the grammar is finished (kStop, the last token shown). Null: free text.
    std::shared_ptr<const Grammar> grammar = nullptr;
    // The LoRA adapter the request runs with (its name in the engine's LoraRegistry; "": the base).
    // Every choice of one submit names the same.
    std::string lora;
};

struct ClientEvent {
    int64_t id = 0;     // the request's (submit's)
    int64_t index = 0;  // the choice (submit's order)
    std::string text;   // newly visible text ("" without a tokenizer)
    int32_t token = -1;  // the new token (-1: none, e.g. a cancel)
    float logprob = 0;   // its log-softmax under the model's raw logits
    std::vector<SampledToken> top;  // sampling.logprobs = k > 0: the k most likely tokens of the same row
                                    // and their log-softmax, most likely first (the token may be absent)
    FinishReason finish = FinishReason::kNone;  // not kNone: the request's last event
    bool context_full = false;  // kLength because the context is full, not max_tokens
    bool drained = false;       // kCancelled by a drain's deadline
    double queue_seconds = -1;  // on a request's first token: submit to its first scheduling
    int64_t cached_tokens = -1;  // on a choice's first token: its prompt tokens the prefix cache served
    int64_t prompt_tokens = 0;  // a choice's last event: its usage
    int64_t completion_tokens = 0;
    bool last_of_request = false;           // every choice of the request has ended: this is its last event,
    int64_t request_prompt_tokens = 0;      // with the request's usage (each prompt once)
    int64_t request_completion_tokens = 0;  // (every choice's tokens)
    int64_t request_cached_tokens = 0;      // (each prompt's first choice: prompt tokens from the prefix cache)
};

// The logprob of each prompt token given the ones before it (the first: NaN, it has no context), and
// with top_k > 0 the top_k most likely tokens of each position's row (the first position: none);
// ranks: each token's rank in its row (1: the most likely; the first position: 0).
struct PromptLogprobs {
    std::vector<float> logprobs;
    std::vector<std::vector<SampledToken>> top;
    std::vector<int64_t> ranks;
};

// One request's output: engine token events in, client events out. The text, stop-string and
// finish rules above; the engine client keeps one per request (public for its unit test).
class RequestOutput {
public:
    RequestOutput(const Tokenizer* tok, std::vector<std::string> stop, int64_t prompt_tokens, int64_t context);
    // The client event of one engine event. A stop string completed: finish kStop and
    // stopped_by_text() (the caller cancels the engine's sequence).
    ClientEvent apply(const TokenEvent& ev);
    // The last event of a request ended by its caller or a drain: kCancelled, held-back text flushed.
    ClientEvent cancel(int64_t id, bool drained);
    bool stopped_by_text() const { return text_stopped_; }
    const std::string& text() const;  // everything shown so far

private:
    ClientEvent end(ClientEvent e);
    std::unique_ptr<TextStream> text_;
    int64_t prompt_tokens_ = 0, completion_tokens_ = 0, context_ = 0;
    bool text_stopped_ = false;
};

// What run() leaves of each request on the leader.
struct ClientOutput {
    std::string text;
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    std::vector<std::vector<SampledToken>> top;  // per token, when sampling.logprobs > 0
    FinishReason finish = FinishReason::kNone;
    bool context_full = false;
    int64_t prompt_tokens = 0;
    int64_t max_tokens = 0;  // granted (<= asked: the context's room)
};

class EngineClient {
public:
    // `tok` may be null (a model without a tokenizer: no text, no stop strings). `quiet`: no warning
    // that the KV cache holds less than the context (a tool's or a test's client for generate / score).
    EngineClient(Engine& engine, const Tokenizer* tok, bool quiet = false);

    bool is_leader() const { return engine_.is_leader(); }
    // Positions per sequence, prompt and output: the model's, or fewer when the KV cache holds fewer
    // (leader; a warning says so).
    int64_t context() const { return context_; }
    const Tokenizer* tokenizer() const { return tok_; }
    // The new tokens a request may have: max_tokens (kRestOfContext: all) clamped to the room the
    // prompt leaves. Error when the prompt leaves none (and more than 0 are asked for), naming both sizes.
    int64_t budget(int64_t prompt_tokens, int64_t max_tokens) const;

    // ---- leader ----
    // Queues a request; returns its id. Error (naming the problem) for one that cannot run, and
    // while draining.
    int64_t submit(ClientRequest r);
    // Queues a request of several choices (see above): choices.size() a multiple of `siblings`.
    int64_t submit(std::vector<ClientRequest> choices, int64_t siblings);
    // Ends a request now: the last events (kCancelled) of its open choices come with the next poll().
    // Unknown ids: ignored.
    void cancel(int64_t id);
    // One engine round (also the idle heartbeat to the followers): the events it produced.
    std::vector<ClientEvent> poll();
    bool busy() const;  // requests in flight or events not yet polled
    // No new requests from now on; running ones may finish for `seconds`, then end as cancelled.
    void drain(double seconds);
    bool draining() const { return draining_; }
    int64_t active() const { return int64_t(requests_.size()); }  // requests not yet ended
    // Requests waiting for a LoRA slot (not yet in the scheduler; one cancelled while waiting counts until
    // the queue reaches it).
    int64_t lora_waiting() const { return int64_t(lora_waiting_.size()); }
    const Scheduler& scheduler() const { return engine_.scheduler(); }
    LoraRegistry& loras() { return engine_.loras(); }  // the adapters on offer (leader)
    void shutdown() { engine_.shutdown(); }

    // ---- followers ----
    void follow() { engine_.follow(); }

    // ---- every rank ----
    // Runs the requests to completion. on_event (leader) sees each event with its request's index;
    // returning false cancels that request. The leader returns one output per request, the others
    // none; `stats` (every rank) the run's statistics. An Error on the leader (a request refused)
    // is thrown on every rank.
    using OnEvent = std::function<bool(size_t index, const ClientEvent& event)>;
    std::vector<ClientOutput> run(const std::vector<ClientRequest>& reqs, const OnEvent& on_event = {},
                                  GenerateStats* stats = nullptr);
    // Logits of every prompt position, [prompt.size(), vocab] row-major, on the leader (kScore plans of
    // up to max_batch_tokens tokens, as many in flight as there are stages). Needs an idle engine.
    // `lora`: an adapter's name in the registry (leader), "" the base.
    std::vector<float> score(const std::vector<int32_t>& prompt, const std::string& lora = "");
    // The engine's own requests, ids in and ids out (tools, tests, the draft model): runs them to
    // completion (leader) / follows (others); results on every rank. Sequence i samples with seed
    // reqs[i].sampling.seed + i (distinct streams, reproducible); on_token: see TokenCallback.
    std::vector<GenerateResult> generate_batch(const std::vector<GenerateRequest>& reqs,
                                               const TokenCallback& on_token = {}, GenerateStats* total = nullptr);
    GenerateResult generate(const GenerateRequest& req, const std::function<void(int32_t)>& on_token = {});
    // The prompt's logprobs from score() (echo of OpenAI's completions), under adapter `lora` ("" the base).
    PromptLogprobs prompt_logprobs(const std::vector<int32_t>& prompt, int32_t top_k, const std::string& lora = "");

private:
    struct Choice {  // one sequence of a request, running in the engine
        int64_t request = 0, index = 0;
        RequestOutput out;
    };
    static constexpr int64_t kWaiting = -1, kEnded = -2;  // Request::engine_ids besides engine ids
    struct Request {  // by choice index: what it runs, its engine id (or kWaiting / kEnded), its prompt size
        std::vector<EngineRequest> later;             // (moved into the engine when it starts)
        std::vector<std::vector<std::string>> stops;  // (moved into its RequestOutput when it starts)
        std::vector<int64_t> engine_ids, prompt_tokens;
        int64_t siblings = 1, open = 0, prompt_total = 0, completion_total = 0, cached_total = 0;
        int32_t lora = 0;  // the LoRA slot it holds (released with its last choice)
        std::string lora_wait;  // the adapter it waits for a slot of (not started yet), "" none
    };
    EngineRequest engine_request(ClientRequest& r);
    void start(int64_t request, int64_t index);  // the choice into the engine
    bool hold_lora(int64_t request, const std::string& name);  // a slot for it, then its first choices start
    void admit_lora_waiting();                                 // the waiting requests a freed slot lets start
    ClientEvent ended(ClientEvent e);            // a choice's last event: the request's accounting
    void end_request(int64_t request, bool drained);
    void cut_by_drain();
    std::shared_ptr<const TokenVocab> grammar_vocab();
    std::vector<float> score_chunks(const std::vector<int32_t>& prompt, const std::vector<int32_t>& table,
                                    int32_t lora);

    Engine& engine_;
    const Tokenizer* tok_;
    int64_t context_ = 0;
    std::shared_ptr<const TokenVocab> vocab_;  // built on the first structured-output request
    std::map<int64_t, Choice> live_;           // by engine id
    std::map<int64_t, Request> requests_;      // by request id
    std::deque<int64_t> lora_waiting_;         // requests waiting for a LoRA slot, oldest first
    int64_t next_request_ = 0;
    std::vector<ClientEvent> pending_;  // cancels' last events, for the next poll
    bool draining_ = false;
    std::chrono::steady_clock::time_point drain_deadline_{};
};

}  // namespace lattice
