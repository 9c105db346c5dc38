// StepSampler (see step_sampler.h).
#include "runtime/engine/step_sampler.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "base/error.h"

namespace lattice {

void StepSampler::release(std::span<const int64_t> ids) {
    for (int64_t id : ids) samplers_.erase(id);
}

// The sampled sequences of `p` in plan order, each with its bans, penalty window, mask, drafts and
// where its logit rows, token slots and top logprobs are.
std::vector<StepSampler::Row> StepSampler::plan_rows(const StepPlan& p, int64_t V, int64_t* logit_rows,
                                                     size_t* slots, size_t* tops) {
    std::vector<Row> rows;
    size_t ban = 0, recent = 0, mask = 0, fed = 0;
    *logit_rows = 0;
    *slots = *tops = 0;
    LATTICE_CHECK(p.masks.empty() || p.mask_width == (V + 31) / 32, "step {}: masks of {} words for a vocab of {}",
                  p.number, p.mask_width, V);
    for (const PlanSeq& ps : p.seqs) {
        const std::span<const int32_t> bans(p.ban_ids.data() + ban, size_t(ps.n_ban));
        ban += size_t(ps.n_ban);
        const std::span<const int32_t> last(p.recent_ids.data() + recent, size_t(ps.n_recent));
        recent += size_t(ps.n_recent);
        const uint32_t* allowed = ps.masked ? p.masks.data() + mask : nullptr;
        mask += ps.masked ? size_t(p.mask_width) : 0;
        fed += size_t(ps.count);
        if (!ps.sample) continue;
        auto it = samplers_.find(ps.id);
        if (it == samplers_.end()) it = samplers_.emplace(ps.id, Sampler(ps.sampling)).first;
        rows.push_back({&ps, ps.ban_stop ? bans : std::span<const int32_t>{}, last, &it->second, allowed, *logit_rows,
                        *slots, *tops, p.tokens.data() + fed - size_t(ps.n_draft)});
        *logit_rows += 1 + ps.n_draft;
        *slots += size_t(1 + ps.n_draft);
        *tops += size_t(ps.sampling.logprobs);
    }
    return rows;
}

void StepSampler::sample(const StepPlan& p, const View& lg, Backend& be, int64_t V, StepResults* out) {
    int64_t logit_rows = 0;
    size_t slots = 0, tops = 0;
    const std::vector<Row> rows = plan_rows(p, V, &logit_rows, &slots, &tops);
    LATTICE_CHECK(logit_rows == lg.rows(), "step {}: {} logit rows for {} samples", p.number, lg.rows(), logit_rows);
    out->tokens.assign(slots, SampledToken{-1, 0.0f});
    out->top.resize(tops);
    host_rows_.clear();  // filled when some row is sampled on the host
    std::vector<int64_t> on_backend;
    if (be.selects_tokens())
        for (size_t k = 0; k < rows.size(); ++k)
            if (rows[k].ps->sampling.logprobs == 0 && !rows[k].mask && rows[k].ps->n_draft == 0)
                on_backend.push_back(int64_t(k));
    if (!on_backend.empty()) sample_on_backend(rows, on_backend, lg, be, V, out);
    if (on_backend.size() == rows.size()) return;
    if (host_rows_.empty()) {
        host_rows_.resize(size_t(lg.rows() * V));
        be.download(host_rows_.data(), lg);
    }
    size_t next = 0;
    for (size_t k = 0; k < rows.size(); ++k) {
        if (next < on_backend.size() && on_backend[next] == int64_t(k)) {
            ++next;
            continue;
        }
        const Row& r = rows[k];
        float* row = host_rows_.data() + size_t(r.row * V);
        if (r.ps->n_draft > 0)
            verify_drafts(r.ps->n_draft, r.drafts, row, V, r.bans, *r.sampler, out->tokens.data() + r.slot);
        else
            sample_on_host(r, row, V, out);
    }
}

// select_tokens takes its rows contiguous: in a batch that mixes in host rows (top logprobs, masks,
// drafts to verify), every row goes to the host (those need it there) and the picked ones back to the
// front.
void StepSampler::sample_on_backend(const std::vector<Row>& rows, const std::vector<int64_t>& picked, const View& lg,
                                    Backend& be, int64_t V, StepResults* out) {
    View sel = lg;
    if (int64_t(picked.size()) != lg.rows()) {
        sel = lg.row_range(0, int64_t(picked.size()));
        host_rows_.resize(size_t(lg.rows() * V));
        be.download(host_rows_.data(), lg);
        for (size_t j = 0; j < picked.size(); ++j)
            be.upload(sel.row_range(int64_t(j), int64_t(j) + 1),
                      host_rows_.data() + size_t(rows[size_t(picked[j])].row * V));
    }
    std::vector<TokenSelect> sels(picked.size());
    penalties_.resize(std::max(penalties_.size(), picked.size()));
    for (size_t j = 0; j < picked.size(); ++j) {
        const Row& r = rows[size_t(picked[j])];
        const SamplingParams& sp = r.sampler->params();
        // The penalties go with the row (applied before the bans and the pick, on the device).
        r.sampler->penalty_list(r.recent, V, penalties_[j]);
        sels[j] = {sp.temperature, int32_t(std::min<int64_t>(sp.top_k, INT32_MAX)), sp.top_p, sp.min_p,
                   r.sampler->draw(), r.bans, sp.repeat_penalty, penalties_[j]};
    }
    std::vector<int32_t> ids(picked.size());
    std::vector<float> lps(picked.size());
    be.select_tokens(sel, sels, ids.data(), lps.data());
    for (size_t j = 0; j < picked.size(); ++j) {
        rows[size_t(picked[j])].sampler->accept(ids[j]);
        out->tokens[rows[size_t(picked[j])].slot] = SampledToken{ids[j], lps[j]};
    }
}

void StepSampler::sample_on_host(const Row& r, float* row, int64_t V, StepResults* out) {
    // log-softmax of the model's row (temperature 1), before any ban, penalty or temperature
    const double lse = host_log_sum_exp(row, V);
    if (const int32_t m = std::min<int32_t>(r.ps->sampling.logprobs, int32_t(V)); m > 0) {
        int32_t ids[SamplingParams::kMaxLogprobs];
        float lps[SamplingParams::kMaxLogprobs];
        top_logprobs(row, V, lse, m, ids, lps);
        for (int32_t j = 0; j < m; ++j) out->top[r.top + size_t(j)] = SampledToken{ids[j], lps[j]};
    }
    for (int32_t id : r.bans)
        if (id >= 0 && id < V) row[id] = -INFINITY;
    if (r.mask) apply_token_mask(row, V, r.mask);
    const int32_t tok = r.sampler->sample(row, V, r.recent);
    out->tokens[r.slot] = SampledToken{tok, float(double(row[tok]) - lse)};  // (the Sampler leaves row raw)
}

void StepSampler::verify_drafts(int32_t n_draft, const int32_t* drafts, float* rows, int64_t V,
                                std::span<const int32_t> bans, Sampler& sampler, SampledToken* out) {
    for (int32_t i = 0; i <= n_draft; ++i) {
        float* row = rows + size_t(i) * size_t(V);
        const double lse = host_log_sum_exp(row, V);
        for (int32_t id : bans)
            if (id >= 0 && id < V) row[id] = -INFINITY;
        bool accepted = false;
        const int32_t tok = i < n_draft ? sampler.verify(row, V, drafts[i], &accepted) : sampler.sample(row, V);
        out[i] = SampledToken{tok, float(double(row[tok]) - lse)};
        if (!accepted) return;
    }
}

}  // namespace lattice
