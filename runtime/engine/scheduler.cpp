// Scheduler (see scheduler.h for the policy).
#include "runtime/engine/scheduler.h"
#include "runtime/engine/speculative.h"

#include <algorithm>
#include <cmath>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "runtime/engine/grammar.h"
#include "runtime/engine/grammar_worker.h"

namespace lattice {

void StepCost::observe(int64_t tokens, double seconds) {
    if (tokens < 1 || !(seconds >= 0)) return;
    const double t = double(tokens);
    n_ = kKeep * n_ + 1;
    st_ = kKeep * st_ + t;
    stt_ = kKeep * stt_ + t * t;
    sy_ = kKeep * sy_ + seconds;
    sty_ = kKeep * sty_ + t * seconds;
}

// The least-squares slope where the token counts vary enough to fit one (their weighted variance is
// at least 1% of the squared mean), the mean seconds per token otherwise; never below 1e-9.
double StepCost::b() const {
    const double var = n_ * stt_ - st_ * st_;
    const double fitted = var > 0.01 * st_ * st_ ? (n_ * sty_ - st_ * sy_) / var : -1;
    return std::max(fitted > 0 ? fitted : sy_ / st_, 1e-9);
}

double StepCost::a() const {
    return std::max(0.0, (sy_ - b() * st_) / n_);
}

int64_t StepCost::tokens_within(double seconds) const {
    const double room = (seconds - a()) / b();
    return room < 1 ? 0 : int64_t(std::min(room, 1e9));
}

Scheduler::Scheduler(const SchedulerOptions& opt, BlockPool& pool)
    : opt_(opt), kv_(pool), masks_(std::make_unique<MaskWorker>()) {
    LATTICE_CHECK(
        opt_.step_tokens >= 1 && opt_.max_seqs >= 1 && opt_.max_seq >= 1 && opt_.micro_batches >= 1 &&
            opt_.vocab >= 1 && (opt_.step_capacity == 0 || opt_.step_capacity >= opt_.step_tokens),
        "scheduler: step tokens {}, max seqs {}, max seq {}, micro-batches {}, vocab {} (all must be >= 1), step "
        "capacity {} (0 or >= step tokens)",
        opt_.step_tokens, opt_.max_seqs, opt_.max_seq, opt_.micro_batches, opt_.vocab, opt_.step_capacity);
    LATTICE_CHECK(std::isfinite(opt_.max_itl_s) && opt_.max_itl_s >= 0 && opt_.min_chunk >= 1,
                  "--max-itl-ms must be >= 0 (0: no latency target), got {} ms; min chunk {} must be >= 1",
                  opt_.max_itl_s * 1e3, opt_.min_chunk);
}

Scheduler::~Scheduler() = default;

int64_t Scheduler::waiting() const {
    int64_t n = 0;
    for (const auto& [id, s] : seqs_) n += !s.running;
    return n;
}

int64_t Scheduler::running() const {
    int64_t n = 0;
    for (const auto& [id, s] : seqs_) n += s.running;
    return n;
}

void Scheduler::check(const EngineRequest& req) const {
    LATTICE_CHECK(!req.prompt.empty(), "empty prompt: give at least one token");
    for (size_t i = 0; i < req.prompt.size(); ++i)
        LATTICE_CHECK(req.prompt[i] >= 0 && req.prompt[i] < opt_.vocab,
                      "prompt token {} (at index {}) is outside the vocab of {}", req.prompt[i], i, opt_.vocab);
    LATTICE_CHECK(int64_t(req.prompt.size()) <= opt_.max_seq,
                  "prompt of {} tokens is longer than the model's context ({} positions per sequence; see --max-seq)",
                  req.prompt.size(), opt_.max_seq);
    LATTICE_CHECK(req.max_new_tokens >= 0, "max new tokens must be >= 0, got {}", req.max_new_tokens);
    LATTICE_CHECK(req.min_tokens >= 0, "min tokens must be >= 0, got {}", req.min_tokens);
    req.sampling.validate();
    const int64_t B = kv_.block_size();
    const int64_t total = std::min<int64_t>(int64_t(req.prompt.size()) + req.max_new_tokens, opt_.max_seq);
    const int64_t need = kv_.blocks_for(total);
    LATTICE_CHECK(need <= kv_.pool().num_blocks(),
                  "request needs {} KV blocks ({} prompt + up to {} new tokens, {} tokens per block) but the cache "
                  "holds {}: raise --kv-cache-gb or lower max new tokens",
                  need, req.prompt.size(), total - int64_t(req.prompt.size()), B, kv_.pool().num_blocks());
}

int64_t Scheduler::add(EngineRequest req) {
    check(req);
    const int64_t id = next_id_++;
    Seq& s = seqs_[id];
    s.id = id;
    s.tokens = req.prompt;
    s.prompt_len = int64_t(req.prompt.size());
    s.req = std::move(req);
    s.arrived = std::chrono::steady_clock::now();
    if (s.req.max_new_tokens == 0)
        finish(s, FinishReason::kLength, finished_, -1, 0);
    else if (s.prompt_len >= opt_.max_seq)
        finish(s, FinishReason::kLength, finished_, -1, 0);  // the context is full
    else if (s.req.grammar)  // the first mask, computed while the prompt waits and is computed
        masks_->request(id, 0, *s.req.grammar, s.req.max_new_tokens);
    return id;
}

void Scheduler::cancel(int64_t id) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) return;
    Seq& s = it->second;
    s.cancelled = true;
    if (s.inflight == 0) finish(s, FinishReason::kCancelled, finished_, -1, 0);
}

std::vector<TokenEvent> Scheduler::take_finished() {
    return std::exchange(finished_, {});
}

std::vector<Scheduler::Seq*> Scheduler::by_priority() {
    std::vector<Seq*> out;
    out.reserve(seqs_.size());
    for (auto& [id, s] : seqs_) out.push_back(&s);
    std::stable_sort(out.begin(), out.end(),
                     [](const Seq* a, const Seq* b) { return a->req.priority < b->req.priority; });
    return out;
}

void Scheduler::release(Seq& s) {
    kv_.free(s.id);
    if (s.req.grammar) masks_->forget(s.id);
    released_.push_back(s.id);
}

void Scheduler::preempt(Seq& v) {
    kv_.free(v.id);  // its tokens (prompt and generated so far) are recomputed when it is admitted again
    v.computed = 0;
    v.running = false;
    ++stats_.preemptions;
}

bool Scheduler::ensure_blocks(Seq& s, int64_t positions, const std::vector<int64_t>& in_plan) {
    while (!kv_.allocate(s.id, positions)) {
        if (!s.running) return false;  // admissions never preempt
        std::vector<KvCacheManager::Candidate> candidates;  // running, and nothing in flight or in this plan uses them
        for (const auto& [id, v] : seqs_)
            if (v.running && v.inflight == 0 && std::find(in_plan.begin(), in_plan.end(), id) == in_plan.end())
                candidates.push_back({id, v.req.priority});
        const int64_t victim = KvCacheManager::choose_victim(candidates);
        if (victim < 0) return false;
        preempt(seqs_.at(victim));
        if (victim == s.id) return false;
    }
    return true;
}

// Structured output: the tokens the grammar of s allows, as the plan's next mask (grammar_worker.h: computed
// on the mask thread since s's last token was accepted; the callers checked mask_ready()).
void Scheduler::add_mask(StepPlan& p, Seq& s) const {
    const size_t words = size_t((opt_.vocab + 31) / 32);
    p.mask_width = int32_t(words);
    p.masks.resize(p.masks.size() + words);
    const std::span<uint32_t> mask(p.masks.data() + p.masks.size() - words, words);
    masks_->take(s.id, s.generated(), *s.req.grammar, s.req.max_new_tokens - s.generated(), mask);
    p.seqs.back().masked = true;
}

// Whether a step may sample s now: it has no grammar, or its next mask is done (waiting for it until the
// step's mask deadline at most). Else s sits this step out (the others do not wait for its mask).
bool Scheduler::mask_ready(Building& b, const Seq& s) {
    if (!s.req.grammar || masks_->ready(s.id, s.generated(), b.mask_deadline)) return true;
    b.mask_skipped = true;
    ++stats_.mask_skips;
    return false;
}

MaskWorker& Scheduler::mask_worker() {
    return *masks_;
}

// n tokens of s (from its first not computed) and its drafts into the plan.
void Scheduler::take(Building& b, Seq& s, int64_t n, const std::vector<int32_t>& drafts) {
    StepPlan& p = b.p;
    const int64_t ban0 = int64_t(p.ban_ids.size());
    PlanSeq ps;
    ps.id = s.id;
    ps.start = int32_t(s.computed);
    ps.count = int32_t(n + int64_t(drafts.size()));
    ps.n_draft = int32_t(drafts.size());
    ps.sample = s.computed + n == int64_t(s.tokens.size());
    ps.ban_stop = ps.sample && s.generated() < s.req.min_tokens;
    ps.sampling = s.req.sampling;
    ps.lora = s.req.lora;
    p.seqs.push_back(ps);
    p.tokens.insert(p.tokens.end(), s.tokens.begin() + s.computed, s.tokens.begin() + s.computed + n);
    p.tokens.insert(p.tokens.end(), drafts.begin(), drafts.end());
    std::vector<int32_t> row(size_t(p.width), -1);
    const std::span<const int32_t> blocks = kv_.blocks(s.id);
    std::copy(blocks.begin(), blocks.end(), row.begin());
    p.tables.insert(p.tables.end(), row.begin(), row.end());
    if (ps.ban_stop) {  // eos (unless ignored) and the stop ids may not be sampled yet
        if (!s.req.ignore_eos)
            for (int64_t e : opt_.eos_ids) p.ban_ids.push_back(int32_t(e));
        p.ban_ids.insert(p.ban_ids.end(), s.req.stop_ids.begin(), s.req.stop_ids.end());
        p.seqs.back().n_ban = int32_t(int64_t(p.ban_ids.size()) - ban0);
    }
    if (ps.sample && s.req.grammar) add_mask(p, s);
    if (ps.sample) {  // the repetition penalty's window: the last tokens, prompt and output
        const int64_t w = std::min<int64_t>(s.req.sampling.recent_window(opt_.max_seq), int64_t(s.tokens.size()));
        p.recent_ids.insert(p.recent_ids.end(), s.tokens.end() - w, s.tokens.end());
        p.seqs.back().n_recent = int32_t(w);
    }
    s.computed += n + int64_t(drafts.size());  // (complete() takes back the refused drafts)
    stats_.drafted_tokens += int64_t(drafts.size());
    ++s.inflight;
    s.awaiting = ps.sample;
    b.budget -= n;
    b.in_plan.push_back(s.id);
}

// 1. One decode token for each running sequence that waits for nothing, oldest first. Decodes
//    always fit (the engine sizes a step for them beside the prompt budget): a small budget bounds
//    prompt chunks, never how many sequences run.
//    A prompt's last token (one left to compute) goes here too, but from the prompt budget.
//    With a pipeline, a step takes at most its share of the sequences that decode (ready or
//    awaiting a sample), so the micro-batches in flight hold equal numbers of decodes: sequences
//    whose prompts end in steps of one parity would otherwise fill that parity's steps first.
void Scheduler::take_decodes(Building& b, const std::vector<Seq*>& order) {
    const int64_t capacity = step_capacity();
    int64_t decoding = 0;
    for (const auto& [id, s] : seqs_)
        decoding += s.running && (s.awaiting || int64_t(s.tokens.size()) - s.computed == 1);
    const int64_t mb = opt_.micro_batches;
    const int64_t decode_cap = mb > 1 ? std::min(b.cap, std::max<int64_t>(1, (decoding + mb - 1) / mb)) : b.cap;
    for (Seq* sp : order) {
        Seq& s = *sp;
        if (int64_t(b.in_plan.size()) >= decode_cap || b.decodes + b.prompt_tails + b.drafted >= capacity) break;
        if (!ready(s) || int64_t(s.tokens.size()) - s.computed != 1) continue;
        const bool tail = s.computed < s.prompt_len;  // not a sampled token: a prompt's last
        if (tail && b.prompt_tails >= opt_.step_tokens) continue;
        if (!mask_ready(b, s)) continue;
        // Drafts take room the prompt budget leaves in the step (beside a decode token for every
        // running sequence that may still come).
        const int64_t decode_rows = (opt_.max_seqs + opt_.micro_batches - 1) / opt_.micro_batches;
        const int64_t room = capacity - opt_.step_tokens - std::min(decode_rows, capacity) - b.drafted;
        std::vector<int32_t> drafts = tail ? std::vector<int32_t>{} : drafts_for(s, room);
        if (!drafts.empty() && !ensure_blocks(s, s.computed + 1 + int64_t(drafts.size()), b.in_plan)) drafts.clear();
        if (ensure_blocks(s, s.computed + 1, b.in_plan)) {
            take(b, s, 1, drafts);
            ++(tail ? b.prompt_tails : b.decodes);
            b.drafted += int64_t(drafts.size());
        }
    }
}

// 2. Prefill chunks of running sequences (chunked prompts, recomputation after preemption). Not
//    bound by the micro-batch cap: the cap spreads sequences over the steps in flight as they are
//    admitted and as they decode, while the prompt tokens are most of a step's work, so a step whose
//    cap its decodes fill still takes a chunk (else with a pipeline every other step is decodes only,
//    a fraction of the others' time, and the stages idle in between).
void Scheduler::take_chunks(Building& b, const std::vector<Seq*>& order) {
    for (Seq* sp : order) {
        Seq& s = *sp;
        if (b.budget < 1) break;
        const int64_t left = int64_t(s.tokens.size()) - s.computed;
        if (!ready(s) || left <= 1) continue;
        int64_t n = std::min(left, b.budget);
        if (n == left && !mask_ready(b, s)) --n;  // its last token (and the sample) once the mask is done
        if (ensure_blocks(s, s.computed + n, b.in_plan)) take(b, s, n);
    }
}

// 3. Admit waiting sequences, oldest first, while there is room; never overtake one that waits.
void Scheduler::admit(Building& b, const std::vector<Seq*>& order, int64_t n_running) {
    int64_t n_run = n_running;
    for (Seq* sp : order) {
        Seq& s = *sp;
        if (b.budget < 1 || int64_t(b.in_plan.size()) >= b.cap || n_run >= opt_.max_seqs) break;
        if (s.running || s.cancelled) continue;
        const int64_t cached = kv_.admit_prefix(s.id, s.tokens, s.req.lora_key);
        s.computed += cached;
        stats_.cached_tokens += cached;
        int64_t n = std::min<int64_t>(int64_t(s.tokens.size()) - s.computed, b.budget);
        if (n > 1 && n == int64_t(s.tokens.size()) - s.computed && !mask_ready(b, s)) --n;  // (as take_chunks)
        if (!ensure_blocks(s, s.computed + n, b.in_plan)) {
            kv_.free(s.id);  // undo the prefix hits: try again when blocks free up
            stats_.cached_tokens -= s.computed;
            s.computed = 0;
            break;
        }
        if (!s.admitted_before) {
            stats_.prompt_tokens += s.prompt_len;
            s.queue_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - s.arrived).count();
            s.cached_prompt = cached;
        }
        s.admitted_before = true;
        s.running = true;
        ++n_run;
        take(b, s, n);
    }
}

StepPlan Scheduler::next(int64_t number) {
    Building b;
    b.p.kind = StepPlan::Kind::kStep;
    b.p.number = number;
    b.p.width = int32_t(kv_.blocks_for(opt_.max_seq));
    b.budget = opt_.step_tokens;
    const int64_t n_running = running();
    // With a pipeline, spread the active sequences (running, and waiting ones that may start) over
    // the micro-batches that can be in flight.
    const int64_t active = std::min(opt_.max_seqs, n_running + waiting());
    b.cap = opt_.micro_batches > 1 ? std::max<int64_t>(1, (active + opt_.micro_batches - 1) / opt_.micro_batches)
                                   : opt_.max_seqs;
    const std::vector<Seq*> order = by_priority();
    // Masks not done by a small share of the step's predicted time keep only their own sequence waiting.
    const double predicted = cost_.ready() ? cost_.a() + cost_.b() * double(std::max<int64_t>(1, n_running)) : 0;
    const std::chrono::duration<double> wait(std::max(kMaskWaitMin_s, kMaskWaitShare * predicted));
    b.mask_deadline = SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(wait);
    take_decodes(b, order);
    int64_t step_tokens = opt_.step_tokens;  // the prompt budget, less where a latency target binds
    if (opt_.max_itl_s > 0 && b.decodes > 0 && cost_.ready())
        step_tokens = std::clamp(cost_.tokens_within(opt_.max_itl_s) - b.decodes,
                                 std::min(opt_.min_chunk, step_tokens), step_tokens);
    b.budget = std::min(step_tokens - b.prompt_tails, step_capacity() - b.decodes - b.prompt_tails - b.drafted);
    take_chunks(b, order);
    admit(b, order, n_running);
    const bool in_flight =
        std::any_of(seqs_.begin(), seqs_.end(), [](const auto& e) { return e.second.inflight > 0; });
    if (b.p.seqs.empty() && b.mask_skipped && !in_flight) {  // nothing to run or complete: wait for the masks
        b.mask_deadline = SteadyClock::time_point::max();
        take_decodes(b, order);
    }
    if (!b.p.seqs.empty()) b.p.released = std::exchange(released_, {});
    stats_.peak_blocks = std::max(stats_.peak_blocks, kv_.pool().num_used());
    return std::move(b.p);
}

std::vector<int32_t> Scheduler::drafts_for(const Seq& s, int64_t room) const {
    if (opt_.spec_tokens <= 0 || room <= 0 || s.req.grammar || s.req.sampling.logprobs > 0 ||
        s.req.sampling.uses_recent() || s.req.sampling.presence_penalty != 0.0f ||
        s.req.sampling.frequency_penalty != 0.0f || s.generated() < s.req.min_tokens)
        return {};
    // Every draft accepted and one more token must stay within max_new_tokens and the context.
    const int64_t k = std::min({opt_.spec_tokens, room, s.req.max_new_tokens - s.generated() - 1,
                                opt_.max_seq - int64_t(s.tokens.size()) - 1});
    if (k <= 0) return {};
    std::vector<int32_t> d =
        opt_.proposer ? opt_.proposer(s.tokens, k) : ngram_drafts(s.tokens, k, opt_.spec_ngram_min, opt_.spec_ngram_max);
    if (int64_t(d.size()) > k) d.resize(size_t(k));
    for (int32_t t : d)
        LATTICE_CHECK(t >= 0 && t < opt_.vocab, "speculative decoding: draft token {} outside the vocab of {}", t,
                      opt_.vocab);
    return d;
}

bool Scheduler::is_stop(const Seq& s, int32_t t) const {
    if (!s.req.ignore_eos && std::find(opt_.eos_ids.begin(), opt_.eos_ids.end(), int64_t(t)) != opt_.eos_ids.end())
        return true;
    return std::find(s.req.stop_ids.begin(), s.req.stop_ids.end(), t) != s.req.stop_ids.end();
}

void Scheduler::finish(Seq& s, FinishReason why, std::vector<TokenEvent>& out, int32_t token, float logprob) {
    out.push_back(TokenEvent{s.id, token, logprob, why});
    if (s.inflight > 0) {  // the step in flight completes first (cancel); it finds the sequence cancelled
        s.cancelled = true;
        return;
    }
    release(s);
    seqs_.erase(s.id);
}

bool Scheduler::append(Seq& s, const SampledToken& st, std::vector<TokenEvent>& out) {
    LATTICE_CHECK(st.token >= 0 && st.token < opt_.vocab, "scheduler: sampled token {} outside the vocab", st.token);
    s.tokens.push_back(st.token);
    ++stats_.generated_tokens;
    FinishReason why = FinishReason::kNone;
    bool grammar_end = false;
    if (GrammarMatcher* g = s.req.grammar.get()) {
        // The mask allowed only what the grammar accepts, and end ids once it is complete.
        if (!g->accept(st.token)) {
            if (!g->complete())
                LOG_WARN("request {}: sampled token {} is outside its grammar; the output ends here", s.id, st.token);
            why = FinishReason::kStop;  // an end id: eos / end of turn (ignore_eos or not)
        } else if (g->finished()) {
            why = FinishReason::kStop;
            grammar_end = true;
        }
    }
    if (why == FinishReason::kNone) {
        if (is_stop(s, st.token) && s.generated() > s.req.min_tokens - 1)
            why = FinishReason::kStop;
        else if (s.generated() >= s.req.max_new_tokens)
            why = FinishReason::kLength;
        else if (int64_t(s.tokens.size()) >= opt_.max_seq)
            why = FinishReason::kLength;  // the context is full
    }
    const double queued = s.generated() == 1 ? s.queue_seconds : -1;  // (finish may drop s)
    const int64_t cached = s.generated() == 1 ? s.cached_prompt : -1;
    if (why != FinishReason::kNone) {
        finish(s, why, out, st.token, st.logprob);
    } else {
        out.push_back(TokenEvent{s.id, st.token, st.logprob, FinishReason::kNone});
        if (s.req.grammar)  // the next mask, beside the next step
            masks_->request(s.id, s.generated(), *s.req.grammar, s.req.max_new_tokens - s.generated());
    }
    out.back().queue_seconds = queued;
    out.back().cached_tokens = cached;
    out.back().grammar_end = grammar_end;
    return why == FinishReason::kNone;
}

std::vector<TokenEvent> Scheduler::complete(const StepPlan& plan, std::span<const SampledToken> sampled) {
    std::vector<TokenEvent> out = take_finished();
    size_t k = 0;
    int64_t fed = 0;  // plan.tokens before this sequence's
    for (const PlanSeq& ps : plan.seqs) {
        const int64_t first_fed = fed;
        fed += ps.count;
        auto it = seqs_.find(ps.id);
        LATTICE_CHECK(it != seqs_.end(), "scheduler: step {} completed for unknown sequence {}", plan.number, ps.id);
        Seq& s = it->second;
        --s.inflight;
        if (ps.sample) {
            const size_t slots = size_t(1 + ps.n_draft);
            LATTICE_CHECK(k + slots <= sampled.size(), "scheduler: step {} returned {} token slots for {}",
                          plan.number, sampled.size(), plan.sample_slots());
            const std::span<const SampledToken> got = sampled.subspan(k, slots);
            k += slots;
            s.awaiting = false;
            if (s.cancelled) {
                if (s.inflight == 0) {
                    release(s);
                    seqs_.erase(it);
                }
                continue;
            }
            size_t m = 0;  // tokens returned: the accepted drafts and one more
            while (m < slots && got[m].token >= 0) ++m;
            LATTICE_CHECK(m >= 1, "scheduler: step {} returned no token for sequence {}", plan.number, s.id);
            for (size_t j = m; j < slots; ++j)
                LATTICE_CHECK(got[j].token == -1, "scheduler: step {}: sequence {}'s token slots are not a run",
                              plan.number, s.id);
            for (size_t j = 0; j + 1 < m; ++j)
                LATTICE_CHECK(got[j].token == plan.tokens[size_t(first_fed + 1) + j],
                              "scheduler: step {}: sequence {}'s token {} is not the draft it accepted", plan.number,
                              s.id, j);
            stats_.accepted_tokens += int64_t(m) - 1;
            // K/V are valid for the fed token and the accepted drafts; refused drafts' positions are
            // overwritten when they are fed again.
            s.computed = ps.start + ps.count - ps.n_draft + int64_t(m) - 1;
            kv_.register_full_blocks(s.id, s.tokens, s.computed);
            for (size_t j = 0; j < m; ++j)
                if (!append(s, got[j], out)) break;  // (s may be gone)
        } else {
            kv_.register_full_blocks(s.id, s.tokens, ps.start + ps.count);
            if (s.cancelled && s.inflight == 0 && !s.awaiting) {
                release(s);
                seqs_.erase(it);
            }
        }
    }
    LATTICE_CHECK(k == sampled.size(), "scheduler: step {} returned {} token slots for {}", plan.number,
                  sampled.size(), k);
    return out;
}

}  // namespace lattice
