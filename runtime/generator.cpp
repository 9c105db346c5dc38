// Generator implementation (see generator.h for the schedule).
#include "runtime/generator.h"

#include "runtime/base/error.h"

#include <algorithm>
#include <chrono>
#include <numeric>

namespace lattice {

namespace {
double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

Generator::Generator(Model& model, PipelineLinks links, int64_t micro)
    : model_(model), links_(links), micro_(micro > 0 ? micro : model.options().max_batch_tokens) {
    micro_ = std::min(micro_, model.options().max_batch_tokens);
}

bool Generator::is_sampler() const { return links_.world == nullptr || links_.world->rank() == links_.sampler; }

void Generator::check_prompt(const std::vector<int32_t>& prompt, int64_t extra) const {
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
    (void)extra;
}

void Generator::step(const int32_t* ids, int64_t count, int64_t pos0, const std::vector<int64_t>& logit_rows,
                     float* logits) {
    std::vector<int32_t> pos(static_cast<size_t>(count)), slots(size_t(count), 0);
    std::iota(pos.begin(), pos.end(), int32_t(pos0));
    TokenBatch b{ids, pos.data(), slots.data(), count};
    const ModelOptions& o = model_.options();
    View hidden = model_.hidden_scratch(count);
    if (o.first_stage) {
        model_.embed(b, hidden);
    } else {
        links_.pipe->recv(hidden, links_.prev);
    }
    model_.run_layers(b, hidden);
    if (o.last_stage)
        model_.head(hidden, logit_rows, logits);
    else
        links_.pipe->send(hidden, links_.next);
}

GenerateResult Generator::generate(const GenerateRequest& req, const std::function<void(int32_t)>& on_token) {
    check_prompt(req.prompt, req.max_new_tokens);
    LATTICE_CHECK(req.max_new_tokens >= 0, "--max-new-tokens must be >= 0, got {}", req.max_new_tokens);
    const ModelConfig& c = model_.config();
    const int64_t T = int64_t(req.prompt.size());
    const int64_t room = model_.max_seq() - T;
    const int64_t n_new = std::min(req.max_new_tokens, room);
    GenerateResult res;
    res.stats.prompt_tokens = T;
    Sampler sampler(req.sampling);
    std::vector<float> logits(size_t(c.vocab));
    const bool last = model_.options().last_stage;

    double t0 = now_seconds();
    int32_t token = 0;
    if (n_new > 0) {
        for (int64_t b = 0; b < T; b += micro_) {
            const int64_t n = std::min(micro_, T - b);
            const bool final_chunk = b + n == T;
            std::vector<int64_t> rows;
            if (final_chunk) rows.push_back(n - 1);
            step(req.prompt.data() + b, n, b, rows, last ? logits.data() : nullptr);
        }
        if (is_sampler()) token = sampler.sample(logits.data(), c.vocab);
        if (links_.world) {
            View tv = View::contiguous(&token, DType::kI32, {1});
            links_.world->broadcast(tv, links_.sampler);
        }
    }
    double t1 = now_seconds();
    res.stats.prefill_seconds = t1 - t0;
    for (int64_t i = 0; i < n_new; ++i) {
        res.tokens.push_back(token);
        if (on_token && is_sampler()) on_token(token);
        const bool stop = c.is_eos(token) || std::find(req.stop_ids.begin(), req.stop_ids.end(), token) != req.stop_ids.end();
        if ((!req.ignore_eos && stop) || i + 1 == n_new) break;
        step(&token, 1, T + i, {0}, last ? logits.data() : nullptr);
        if (is_sampler()) token = sampler.sample(logits.data(), c.vocab);
        if (links_.world) {
            View tv = View::contiguous(&token, DType::kI32, {1});
            links_.world->broadcast(tv, links_.sampler);
        }
    }
    res.stats.generated_tokens = int64_t(res.tokens.size());
    res.stats.decode_seconds = now_seconds() - t1;
    return res;
}

std::vector<float> Generator::score(const std::vector<int32_t>& prompt) {
    check_prompt(prompt, 0);
    const int64_t T = int64_t(prompt.size()), V = model_.config().vocab;
    const bool last = model_.options().last_stage;
    std::vector<float> out(last ? size_t(T * V) : 0);
    for (int64_t b = 0; b < T; b += micro_) {
        const int64_t n = std::min(micro_, T - b);
        std::vector<int64_t> rows(static_cast<size_t>(n));
        std::iota(rows.begin(), rows.end(), 0);
        step(prompt.data() + b, n, b, rows, last ? out.data() + b * V : nullptr);
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
