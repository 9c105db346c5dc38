// EngineClient and RequestOutput (see client.h).
#include "runtime/engine/client.h"

#include <algorithm>
#include <cmath>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "runtime/backend/backend.h"
#include "runtime/engine/sampler.h"

namespace lattice {

// ---- RequestOutput -------------------------------------------------------------------------------

RequestOutput::RequestOutput(const Tokenizer* tok, std::vector<std::string> stop, int64_t prompt_tokens,
                             int64_t context)
    : prompt_tokens_(prompt_tokens), context_(context) {
    if (tok) text_ = std::make_unique<TextStream>(*tok, std::move(stop));
}

const std::string& RequestOutput::text() const {
    static const std::string kNone;
    return text_ ? text_->text() : kNone;
}

ClientEvent RequestOutput::end(ClientEvent e) {
    if (text_ && !text_->stopped()) e.text += text_->finish();  // whatever was held back
    e.prompt_tokens = prompt_tokens_;
    e.completion_tokens = completion_tokens_;
    e.context_full = e.finish == FinishReason::kLength && prompt_tokens_ + completion_tokens_ >= context_;
    return e;
}

ClientEvent RequestOutput::apply(const TokenEvent& ev) {
    ClientEvent e;
    e.id = ev.id;
    e.finish = ev.finish;
    if (ev.token >= 0) {
        e.token = ev.token;
        e.logprob = ev.logprob;
        e.top = ev.top;
        e.queue_seconds = ev.queue_seconds;
        e.cached_tokens = ev.cached_tokens;
        ++completion_tokens_;
        // A token that ended the output by kStop is eos / a stop id: returned, but not text (the
        // grammar's last token is text: it completes the output).
        if (text_ && (ev.finish != FinishReason::kStop || ev.grammar_end)) {
            TextStream::Piece p = text_->push(ev.token);
            e.text = std::move(p.text);
            if (p.stop) {
                text_stopped_ = true;
                e.finish = FinishReason::kStop;
            }
        }
    }
    return e.finish == FinishReason::kNone ? e : end(std::move(e));
}

ClientEvent RequestOutput::cancel(int64_t id, bool drained) {
    ClientEvent e;
    e.id = id;
    e.finish = FinishReason::kCancelled;
    e.drained = drained;
    return end(std::move(e));
}

// ---- EngineClient --------------------------------------------------------------------------------

EngineClient::EngineClient(Engine& engine, const Tokenizer* tok, bool quiet)
    : engine_(engine), tok_(tok), context_(engine.model().max_seq()) {
    if (!engine_.is_leader()) return;
    // A KV cache smaller than one full-context sequence bounds the context: a request the cache can
    // never hold would only be refused later (and a chat's default max_tokens always would be).
    const BlockPool& pool = engine_.scheduler().pool();
    const int64_t held = pool.num_blocks() * pool.block_size();
    if (held < context_) {
        if (!quiet)
            LOG_WARN("the KV cache holds {} positions ({} blocks of {}), fewer than the context of {}: requests get "
                     "{} positions (raise --kv-cache-gb for more)",
                     held, pool.num_blocks(), pool.block_size(), context_, held);
        context_ = held;
    }
}

int64_t EngineClient::budget(int64_t prompt_tokens, int64_t max_tokens) const {
    LATTICE_CHECK(prompt_tokens >= 1, "the prompt is empty");
    LATTICE_CHECK(max_tokens >= ClientRequest::kRestOfContext, "max_tokens {} is negative", max_tokens);
    LATTICE_CHECK(prompt_tokens <= context_,
                  "the prompt of {} tokens is longer than the model's context ({} positions per sequence; see "
                  "--max-seq)",
                  prompt_tokens, context_);
    if (max_tokens == 0) return 0;
    const int64_t room = context_ - prompt_tokens;
    LATTICE_CHECK(room > 0,
                  "the prompt of {} tokens fills the whole context of {} positions: no room for new tokens (shorten "
                  "it, or raise --max-seq up to the model's max_position_embeddings {})",
                  prompt_tokens, context_, engine_.model().config().max_position);
    return max_tokens == ClientRequest::kRestOfContext ? room : std::min(max_tokens, room);
}

EngineRequest EngineClient::engine_request(ClientRequest& r) {
    LATTICE_CHECK(r.stop.empty() || tok_, "stop strings need a model with a tokenizer");
    for (const std::string& s : r.stop) LATTICE_CHECK(!s.empty(), "stop strings must not be empty");
    EngineRequest e;
    e.max_new_tokens = budget(int64_t(r.prompt.size()), r.max_tokens);
    e.min_tokens = r.min_tokens;
    e.sampling = r.sampling;
    e.ignore_eos = r.ignore_eos;
    e.priority = r.priority;
    e.stop_ids = std::move(r.stop_token_ids);
    if (tok_ && !r.ignore_eos)  // <|im_end|>, <|eot_id|> ... end a turn as eos does
        for (int32_t id : tok_->eog_ids()) e.stop_ids.push_back(id);
    if (r.grammar) e.grammar = std::make_shared<GrammarMatcher>(r.grammar, grammar_vocab());
    e.prompt = std::move(r.prompt);
    engine_.scheduler().check(e);
    return e;
}

int64_t EngineClient::submit(ClientRequest r) {
    std::vector<ClientRequest> one;
    one.push_back(std::move(r));
    return submit(std::move(one), 1);
}

int64_t EngineClient::submit(std::vector<ClientRequest> choices, int64_t siblings) {
    LATTICE_CHECK(!draining_, "shutting down: no new requests are taken");
    const int64_t n = int64_t(choices.size());
    LATTICE_CHECK(n > 0 && siblings >= 1 && n % siblings == 0,
                  "a request of {} choices cannot run in runs of {} per prompt", n, siblings);
    Request q;
    q.siblings = siblings;
    q.open = n;
    q.engine_ids.assign(size_t(n), -1);
    for (ClientRequest& c : choices) {  // every choice checked before any runs
        q.prompt_tokens.push_back(int64_t(c.prompt.size()));
        q.later.push_back(engine_request(c));
        q.stops.push_back(std::move(c.stop));
    }
    for (int64_t i = 0; i < n; i += siblings) q.prompt_total += q.prompt_tokens[size_t(i)];
    if (!choices[0].lora.empty())
        for (const ClientRequest& c : choices)
            LATTICE_CHECK(c.lora == choices[0].lora, "the choices of one request name different adapters");
    const int64_t id = next_request_++;
    requests_.emplace(id, std::move(q));
    if (choices[0].lora.empty()) {
        for (int64_t i = 0; i < n; i += siblings) start(id, i);
        return id;
    }
    // Held until the request's last choice ends (ended()); with every slot held, or older requests waiting
    // for one, it waits (unknown adapters are refused here, before anything changed).
    LoraRegistry& reg = engine_.loras();
    const bool queue = !lora_waiting_.empty() && !reg.is_resident(choices[0].lora);
    try {
        if (queue) LATTICE_CHECK(reg.has(choices[0].lora), "the model '{}' does not exist", choices[0].lora);
        if (!queue && hold_lora(id, choices[0].lora)) return id;
    } catch (const Error&) {
        requests_.erase(id);
        throw;
    }
    requests_.at(id).lora_wait = choices[0].lora;
    lora_waiting_.push_back(id);
    return id;
}

bool EngineClient::hold_lora(int64_t request, const std::string& name) {
    const std::optional<LoraRegistry::Ref> ref = engine_.loras().try_acquire(name);
    if (!ref) return false;
    Request& q = requests_.at(request);
    q.lora = ref->slot;
    q.lora_wait.clear();
    for (EngineRequest& e : q.later) {
        e.lora = ref->slot;
        e.lora_key = ref->key;
    }
    for (int64_t i = 0; i < int64_t(q.later.size()); i += q.siblings) start(request, i);
    return true;
}

void EngineClient::admit_lora_waiting() {
    while (!lora_waiting_.empty()) {
        const int64_t id = lora_waiting_.front();
        const auto it = requests_.find(id);
        if (it == requests_.end() || it->second.lora_wait.empty()) {  // cancelled or drained while waiting
            lora_waiting_.pop_front();
            continue;
        }
        bool held = false;
        try {
            held = hold_lora(id, it->second.lora_wait);
        } catch (const Error&) {  // unloaded while it waited
            held = true;
            end_request(id, false);
        }
        if (!held) return;  // the slots are still held: it stays first
        lora_waiting_.pop_front();
    }
}

void EngineClient::start(int64_t request, int64_t index) {
    Request& q = requests_.at(request);
    const size_t i = size_t(index);
    const int64_t eid = engine_.add(std::move(q.later[i]));  // checked when submitted: cannot throw
    q.engine_ids[i] = eid;
    live_.emplace(eid,
                  Choice{request, index, RequestOutput(tok_, std::move(q.stops[i]), q.prompt_tokens[i], context_)});
}

ClientEvent EngineClient::ended(ClientEvent e) {
    auto it = requests_.find(e.id);
    Request& q = it->second;
    q.engine_ids[size_t(e.index)] = kEnded;
    q.completion_total += e.completion_tokens;
    if (--q.open == 0) {
        e.last_of_request = true;
        e.request_prompt_tokens = q.prompt_total;
        e.request_completion_tokens = q.completion_total;
        engine_.loras().release(q.lora, q.prompt_total + q.completion_total);
        e.request_cached_tokens = q.cached_total;
        requests_.erase(it);
    }
    return e;
}

// The vocabulary grammars mask (runtime/engine/grammar.h make_token_vocab: each id's bytes, special
// tokens never allowed, padded to the model's logits width). Built once, on the first grammar.
std::shared_ptr<const TokenVocab> EngineClient::grammar_vocab() {
    if (vocab_) return vocab_;
    LATTICE_CHECK(tok_, "structured output needs a model with a tokenizer");
    vocab_ = make_token_vocab(*tok_, int32_t(engine_.model().config().vocab));
    return vocab_;
}

void EngineClient::cancel(int64_t id) {
    end_request(id, false);
}

void EngineClient::end_request(int64_t request, bool drained) {
    auto it = requests_.find(request);
    if (it == requests_.end()) return;
    const std::vector<int64_t> eids = it->second.engine_ids;  // (ended() erases the request with its last choice)
    for (size_t i = 0; i < eids.size(); ++i) {
        ClientEvent e;
        if (eids[i] == kEnded) continue;
        if (eids[i] == kWaiting) {  // a sibling that never ran
            e.id = request;
            e.finish = FinishReason::kCancelled;
            e.drained = drained;
            e.prompt_tokens = requests_.at(request).prompt_tokens[i];
        } else {
            auto c = live_.find(eids[i]);
            engine_.cancel(eids[i]);
            e = c->second.out.cancel(request, drained);
            live_.erase(c);
        }
        e.index = int64_t(i);
        pending_.push_back(ended(std::move(e)));
    }
}

void EngineClient::drain(double seconds) {
    if (draining_) return;
    draining_ = true;
    drain_deadline_ = SteadyClock::now() + std::chrono::microseconds(int64_t(std::max(0.0, seconds) * 1e6));
}

void EngineClient::cut_by_drain() {
    std::vector<int64_t> ids;
    for (const auto& [id, q] : requests_) ids.push_back(id);
    for (int64_t id : ids) end_request(id, true);
}

bool EngineClient::busy() const { return !pending_.empty() || !lora_waiting_.empty() || engine_.busy(); }

std::vector<ClientEvent> EngineClient::poll() {
    if (draining_ && !requests_.empty() && SteadyClock::now() >= drain_deadline_) cut_by_drain();
    admit_lora_waiting();
    std::vector<ClientEvent> out = std::exchange(pending_, {});
    for (const TokenEvent& ev : engine_.step()) {
        auto it = live_.find(ev.id);
        if (it == live_.end()) continue;  // ended by its caller, a stop string or a drain: said already
        const int64_t request = it->second.request, index = it->second.index;
        ClientEvent e = it->second.out.apply(ev);
        e.id = request;
        e.index = index;
        auto q = requests_.find(request);
        if (q != requests_.end() && e.cached_tokens > 0 && index % q->second.siblings == 0)
            q->second.cached_total += e.cached_tokens;
        if (e.finish != FinishReason::kNone) {
            if (it->second.out.stopped_by_text() && ev.finish == FinishReason::kNone) engine_.cancel(ev.id);
            live_.erase(it);
        }
        // The first choice of a prompt has its first token (or ended without one): the prompt's KV
        // blocks are in the prefix cache now, its siblings run.
        if (q != requests_.end() && index % q->second.siblings == 0)
            for (int64_t i = index + 1; i < index + q->second.siblings; ++i)
                if (q->second.engine_ids[size_t(i)] == kWaiting) start(request, i);
        out.push_back(e.finish == FinishReason::kNone ? std::move(e) : ended(std::move(e)));
    }
    return out;
}

PromptLogprobs EngineClient::prompt_logprobs(const std::vector<int32_t>& prompt, int32_t top_k,
                                             const std::string& lora) {
    const std::vector<float> logits = score(prompt, lora);
    const int64_t V = int64_t(logits.size() / prompt.size());
    PromptLogprobs out;
    out.logprobs.push_back(std::nanf(""));  // the first token has no context
    out.ranks.push_back(0);
    if (top_k >= 0) out.top.emplace_back();
    for (size_t i = 1; i < prompt.size(); ++i) {  // position i - 1 predicts token i
        const float* row = logits.data() + (i - 1) * size_t(V);
        const double lse = host_log_sum_exp(row, V);
        out.logprobs.push_back(float(double(row[prompt[i]]) - lse));
        out.ranks.push_back(1 + std::count_if(row, row + V, [&](float x) { return x > row[prompt[i]]; }));
        if (top_k < 0) continue;
        std::vector<int32_t> ids(static_cast<size_t>(top_k));
        std::vector<float> lps(static_cast<size_t>(top_k));
        top_logprobs(row, V, lse, top_k, ids.data(), lps.data());
        std::vector<SampledToken>& top = out.top.emplace_back(size_t(top_k));
        for (size_t j = 0; j < top.size(); ++j) top[j] = {ids[j], lps[j]};
    }
    return out;
}

std::vector<ClientOutput> EngineClient::run(const std::vector<ClientRequest>& reqs, const OnEvent& on_event,
                                            GenerateStats* stats) {
    LATTICE_CHECK(!reqs.empty(), "generate: no requests");
    const Engine::RunMark mark = engine_.mark_run();
    std::vector<ClientOutput> outs;
    std::string error;
    double prefill_s = 0;
    if (is_leader()) {
        outs.resize(reqs.size());
        std::map<int64_t, size_t> index;
        try {
            for (size_t i = 0; i < reqs.size(); ++i) {
                outs[i].prompt_tokens = int64_t(reqs[i].prompt.size());
                outs[i].max_tokens = budget(outs[i].prompt_tokens, reqs[i].max_tokens);
                index[submit(reqs[i])] = i;
            }
        } catch (const Error& e) {  // refused before anything ran: the followers are told
            error = e.what();
            for (const auto& [id, i] : index) cancel(id);
            index.clear();
        }
        size_t started = 0;
        std::vector<bool> has_first(reqs.size(), false);
        while (busy()) {
            for (const ClientEvent& ev : poll()) {
                auto at = index.find(ev.id);
                if (at == index.end()) continue;
                const size_t i = at->second;
                if (!has_first[i]) {
                    has_first[i] = true;
                    if (++started == reqs.size()) prefill_s = seconds_since(mark.start);
                }
                ClientOutput& o = outs[i];
                o.text += ev.text;
                if (ev.token >= 0) {
                    o.tokens.push_back(ev.token);
                    o.logprobs.push_back(ev.logprob);
                    if (!ev.top.empty()) o.top.push_back(ev.top);
                }
                if (ev.finish != FinishReason::kNone) {
                    o.finish = ev.finish;
                    o.context_full = ev.context_full;
                    index.erase(at);
                }
                const bool go_on = on_event ? on_event(i, ev) : true;
                if (!go_on && ev.finish == FinishReason::kNone) cancel(ev.id);  // its last event: next poll
            }
        }
        if (started < reqs.size()) prefill_s = seconds_since(mark.start);
        shutdown();
    } else {
        follow();
    }
    const GenerateStats s = engine_.finish_run(mark, int64_t(reqs.size()), prefill_s, error);
    if (stats) *stats = s;
    return outs;
}

}  // namespace lattice
