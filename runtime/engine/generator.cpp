// Generator implementation (see generator.h for the item schedule and the token messages).
#include "runtime/engine/generator.h"

#include "base/error.h"

#include <algorithm>
#include <chrono>
#include <numeric>

namespace lattice {

namespace {
double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Sequence {
    const GenerateRequest* req = nullptr;
    int32_t slot = 0;
    int64_t n_new = 0;      // tokens this sequence may generate (bounded by the KV cache)
    std::vector<int32_t> out;
    bool done = false;
    int64_t known = 0;      // tokens of `out` this rank has received (== out.size() on the sampler)
};
}  // namespace

Generator::Generator(Model& model, PipelineLinks links, int64_t micro)
    : model_(model), links_(links), micro_(micro > 0 ? micro : model.options().max_batch_tokens) {
    micro_ = std::min(micro_, model.options().max_batch_tokens);
}

bool Generator::is_sampler() const { return links_.world == nullptr || links_.world->rank() == links_.sampler; }

void Generator::check_prompt(const std::vector<int32_t>& prompt) const {
    const ModelConfig& c = model_.config();
    LATTICE_CHECK(!prompt.empty(), "empty prompt: give at least one token");
    const int64_t limit = std::min(model_.max_seq(), c.max_position);
    LATTICE_CHECK(int64_t(prompt.size()) <= limit,
                  "prompt of {} tokens is longer than the model's context ({} = min(max_position_embeddings {}, KV "
                  "cache {}))",
                  prompt.size(), limit, c.max_position, model_.max_seq());
    for (size_t i = 0; i < prompt.size(); ++i)
        LATTICE_CHECK(prompt[i] >= 0 && prompt[i] < c.vocab, "prompt token {} (at index {}) is outside the vocab of {}",
                      prompt[i], i, c.vocab);
}

double Generator::step(const TokenBatch& b, const std::vector<int64_t>& logit_rows, float* logits) {
    const ModelOptions& o = model_.options();
    View hidden = model_.hidden_scratch(b.count);
    double waited = 0;
    const double t0 = now_seconds();
    if (o.first_stage) {
        model_.embed(b, hidden);
    } else {
        links_.pipe->recv(hidden, links_.prev);
        waited = now_seconds() - t0;
    }
    model_.run_layers(b, hidden);
    if (o.last_stage)
        model_.head(hidden, logit_rows, logits);
    else
        links_.pipe->send(hidden, links_.next);
    compute_seconds_ += now_seconds() - t0 - waited;
    return waited;
}

GenerateResult Generator::generate(const GenerateRequest& req, const std::function<void(int32_t)>& on_token) {
    GenerateStats total;
    std::vector<GenerateResult> r = generate_batch(
        {req}, on_token ? [&](int64_t, int32_t id) { on_token(id); } : std::function<void(int64_t, int32_t)>{},
        &total);
    r[0].stats = total;
    return std::move(r[0]);
}

std::vector<GenerateResult> Generator::generate_batch(const std::vector<GenerateRequest>& reqs,
                                                      const std::function<void(int64_t, int32_t)>& on_token,
                                                      GenerateStats* total) {
    const ModelConfig& c = model_.config();
    const int64_t S = int64_t(reqs.size());
    LATTICE_CHECK(S >= 1, "generate: no sequences");
    LATTICE_CHECK(S <= model_.options().slots, "generate: {} sequences but the model has {} KV slots", S,
                  model_.options().slots);
    LATTICE_CHECK(S <= model_.options().max_batch_tokens, "generate: {} sequences exceed max_batch_tokens {}", S,
                  model_.options().max_batch_tokens);
    std::vector<Sequence> seqs(static_cast<size_t>(S));
    std::vector<Sampler> samplers;
    for (int64_t i = 0; i < S; ++i) {
        const GenerateRequest& r = reqs[size_t(i)];
        check_prompt(r.prompt);
        LATTICE_CHECK(r.max_new_tokens >= 0, "--max-new-tokens must be >= 0, got {}", r.max_new_tokens);
        r.sampling.validate();
        Sequence& s = seqs[size_t(i)];
        s.req = &r;
        s.slot = int32_t(i);
        s.n_new = std::min<int64_t>(r.max_new_tokens, model_.max_seq() - int64_t(r.prompt.size()));
        s.done = s.n_new == 0;
        SamplingParams sp = r.sampling;
        sp.seed += uint64_t(i);  // distinct streams per sequence, reproducible
        samplers.emplace_back(sp);
    }
    const bool sampler = is_sampler();
    const bool last = model_.options().last_stage;
    const bool multi = links_.world && links_.world->size() > 1;
    std::vector<float> logits;
    GenerateStats st;
    st.sequences = S;
    compute_seconds_ = 0;

    // Sampling events are numbered in item order; the sampler sends each as one message of the
    // tokens it produced, every other rank consumes them in the same order.
    struct Event {
        std::vector<int64_t> seqs;
    };
    std::vector<Event> events;  // events not yet consumed by this rank (non-sampler ranks)
    size_t next_event = 0;
    auto finish_token = [&](int64_t i, int32_t tok) {
        Sequence& s = seqs[size_t(i)];
        s.out.push_back(tok);
        s.known = int64_t(s.out.size());
        if (on_token) on_token(i, tok);
        const GenerateRequest& r = *s.req;
        const bool stop = c.is_eos(tok) || std::find(r.stop_ids.begin(), r.stop_ids.end(), tok) != r.stop_ids.end();
        if ((!r.ignore_eos && stop) || int64_t(s.out.size()) >= s.n_new) s.done = true;
    };
    // Sampler: sample for `who` from logits rows, record, notify everyone else.
    auto sample_and_send = [&](const std::vector<int64_t>& who) {
        std::vector<int32_t> toks(who.size());
        for (size_t j = 0; j < who.size(); ++j) {
            toks[j] = samplers[size_t(who[j])].sample(logits.data() + j * size_t(c.vocab), c.vocab);
            finish_token(who[j], toks[j]);
        }
        if (multi) {
            View v = View::contiguous(toks.data(), DType::kI32, {int64_t(toks.size())});
            for (int r = 0; r < links_.world->size(); ++r)
                if (r != links_.world->rank()) links_.world->send(v, r);
        }
    };
    // Non-sampler: receive the next event's tokens from the sampler.
    auto consume_event = [&] {
        const Event& e = events[next_event++];
        std::vector<int32_t> toks(e.seqs.size());
        double t0 = now_seconds();
        links_.world->recv(View::contiguous(toks.data(), DType::kI32, {int64_t(toks.size())}), links_.sampler);
        st.idle_seconds += now_seconds() - t0;
        for (size_t j = 0; j < e.seqs.size(); ++j) finish_token(e.seqs[j], toks[j]);
    };
    // Non-sampler: consume events in order until sequence `i` has `need` tokens or is done.
    auto await_tokens = [&](int64_t i, int64_t need) {
        while (!seqs[size_t(i)].done && seqs[size_t(i)].known < need) {
            LATTICE_CHECK(next_event < events.size(), "generate: token stream out of order for sequence {}", i);
            consume_event();
        }
    };
    auto record_event = [&](std::vector<int64_t> who) {
        if (!sampler) events.push_back(Event{std::move(who)});
    };

    // Prefill.
    double t0 = now_seconds();
    for (int64_t i = 0; i < S; ++i) {
        Sequence& s = seqs[size_t(i)];
        if (s.done) continue;
        const std::vector<int32_t>& p = s.req->prompt;
        const int64_t T = int64_t(p.size());
        st.prompt_tokens += T;
        for (int64_t b = 0; b < T; b += micro_) {
            const int64_t n = std::min(micro_, T - b);
            std::vector<int32_t> pos(static_cast<size_t>(n)), slot(static_cast<size_t>(n), s.slot);
            std::iota(pos.begin(), pos.end(), int32_t(b));
            const bool final_chunk = b + n == T;
            if (final_chunk && last) logits.resize(size_t(c.vocab));
            st.idle_seconds += step(TokenBatch{p.data() + b, pos.data(), slot.data(), n},
                                    final_chunk ? std::vector<int64_t>{n - 1} : std::vector<int64_t>{},
                                    last ? logits.data() : nullptr);
        }
        if (sampler) sample_and_send({i});
        record_event({i});
    }
    const double t1 = now_seconds();
    st.prefill_seconds = t1 - t0;

    // Decode rounds over groups.
    const int pp = links_.pipe ? links_.pipe->size() : 1;
    const int64_t G = std::min<int64_t>(S, pp);
    for (int64_t r = 0;; ++r) {
        bool any = false;
        for (int64_t g = 0; g < G; ++g) {
            std::vector<int64_t> who;
            for (int64_t i = g; i < S; i += G) {
                if (!sampler) await_tokens(i, std::min<int64_t>(r + 1, seqs[size_t(i)].n_new));
                const Sequence& s = seqs[size_t(i)];
                if (!s.done && int64_t(s.out.size()) == r + 1) who.push_back(i);
            }
            if (who.empty()) continue;
            any = true;
            const int64_t n = int64_t(who.size());
            std::vector<int32_t> ids(static_cast<size_t>(n)), pos(static_cast<size_t>(n)), slot(static_cast<size_t>(n));
            std::vector<int64_t> rows(static_cast<size_t>(n));
            for (int64_t j = 0; j < n; ++j) {
                const Sequence& s = seqs[size_t(who[size_t(j)])];
                ids[size_t(j)] = s.out.back();
                pos[size_t(j)] = int32_t(int64_t(s.req->prompt.size()) + r);
                slot[size_t(j)] = s.slot;
                rows[size_t(j)] = j;
            }
            if (last) logits.resize(size_t(n * c.vocab));
            st.idle_seconds += step(TokenBatch{ids.data(), pos.data(), slot.data(), n}, rows,
                                    last ? logits.data() : nullptr);
            if (sampler) sample_and_send(who);
            record_event(who);
        }
        if (!any) break;
    }
    // Non-sampler ranks: consume the tokens of the final round (no item needed them).
    if (!sampler)
        while (next_event < events.size()) consume_event();
    st.decode_seconds = now_seconds() - t1;

    std::vector<GenerateResult> res(static_cast<size_t>(S));
    for (int64_t i = 0; i < S; ++i) {
        res[size_t(i)].tokens = std::move(seqs[size_t(i)].out);
        st.generated_tokens += int64_t(res[size_t(i)].tokens.size());
    }
    st.compute_seconds = compute_seconds_;
    if (total) *total = st;
    return res;
}

std::vector<float> Generator::score(const std::vector<int32_t>& prompt) {
    check_prompt(prompt);
    const int64_t T = int64_t(prompt.size()), V = model_.config().vocab;
    const bool last = model_.options().last_stage;
    std::vector<float> out(last ? size_t(T * V) : 0);
    for (int64_t b = 0; b < T; b += micro_) {
        const int64_t n = std::min(micro_, T - b);
        std::vector<int64_t> rows(static_cast<size_t>(n));
        std::iota(rows.begin(), rows.end(), 0);
        std::vector<int32_t> pos(static_cast<size_t>(n)), slot(static_cast<size_t>(n), 0);
        std::iota(pos.begin(), pos.end(), int32_t(b));
        step(TokenBatch{prompt.data() + b, pos.data(), slot.data(), n}, rows, last ? out.data() + b * V : nullptr);
    }
    if (links_.world && links_.world->size() > 1 && links_.sampler != 0) {
        // Move the logits to world rank 0, which writes the file.
        if (links_.world->rank() == links_.sampler) {
            links_.world->send(View::contiguous(out.data(), DType::kF32, {T * V}), 0);
        } else if (links_.world->rank() == 0) {
            out.resize(size_t(T * V));
            links_.world->recv(View::contiguous(out.data(), DType::kF32, {T * V}), links_.sampler);
        }
    }
    return out;
}

}  // namespace lattice
