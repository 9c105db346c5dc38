// BackendRunner (see backend_runner.h). Pipeline stages pass hidden rows [tokens, hidden] on the pipe
// communicator, in plan order.
#include "runtime/engine/backend_runner.h"

#include <algorithm>

#include "base/clock.h"
#include "base/error.h"
#include "parallel/communicator.h"

namespace lattice {

namespace {
using Clock = SteadyClock;
constexpr auto since = seconds_since;
}  // namespace

std::vector<int64_t> BackendRunner::bucket_list(const std::vector<int64_t>& given, int64_t cap) {
    std::vector<int64_t> b;
    if (given.empty()) {
        for (int64_t v : {1, 2, 4})
            if (v <= cap) b.push_back(v);
        for (int64_t v = 8; v <= cap; v += 8) b.push_back(v);
        if (b.empty() || b.back() != cap) b.push_back(cap);
        return b;
    }
    for (int64_t v : given) {
        LATTICE_CHECK(v >= 1 && (b.empty() || v > b.back()),
                      "step graph buckets must be increasing positive batch sizes (got {} after {})", v,
                      b.empty() ? 0 : b.back());
        if (v <= cap) b.push_back(v);
    }
    LATTICE_CHECK(!b.empty(), "no step graph bucket within {} sequences (max sequences and max batch tokens)", cap);
    return b;
}

BackendRunner::BackendRunner(Model& model, PipelineLinks links, int rank, const BackendRunnerOptions& opt,
                             EngineCounters& counters)
    : model_(model), links_(links), rank_(rank), counters_(counters) {
    graphs_on_ = opt.step_graphs && model_.backend().captures_steps() && model_.capturable() && model_.kv_blocks() >= 2;
    if (!graphs_on_) return;
    trash_block_ = int32_t(model_.kv_blocks() - 1);
    graph_buckets_ = bucket_list(opt.graph_buckets, std::min(opt.max_seqs, model_.options().max_batch_tokens));
    graph_max_ = graph_buckets_.back();
    const size_t W = size_t(model_.attention_shape().table_width), B = size_t(graph_max_);
    graph_tokens_.reserve(B);
    graph_positions_.reserve(B);
    graph_seqs_.reserve(B);
    graph_tables_.reserve(B * W);
    graph_rows_.reserve(B);
}

void BackendRunner::sample(const StepPlan& p, const View& logits, StepResults* out) {
    const auto ts = Clock::now();
    sampler_.sample(p, logits, model_.backend(), model_.config().vocab, out);
    counters_.sample_seconds += since(ts);
}

void BackendRunner::execute(const StepPlan& p, StepResults* out) {
    const AttentionShape& a = model_.attention_shape();
    const int64_t T = int64_t(p.tokens.size()), n = int64_t(p.seqs.size());
    LATTICE_CHECK(p.width == a.table_width, "step {}: block tables of width {}, the model's are {}", p.number, p.width,
                  a.table_width);
    pos_.resize(size_t(T));
    seq_of_.resize(size_t(T));
    int64_t i = 0;
    std::vector<int64_t> rows;
    for (int64_t s = 0; s < n; ++s) {
        const PlanSeq& ps = p.seqs[size_t(s)];
        for (int32_t j = 0; j < ps.count; ++j, ++i) {
            pos_[size_t(i)] = ps.start + j;
            seq_of_[size_t(i)] = int32_t(s);
            if (p.kind == StepPlan::Kind::kScore) rows.push_back(i);
        }
        if (p.kind == StepPlan::Kind::kStep && ps.sample)  // the last row, and the drafts' rows before it
            for (int64_t d = ps.n_draft; d >= 0; --d) rows.push_back(i - 1 - d);
    }
    if (is_sampler()) sampler_.release(p.released);
    load_loras(p);
    TokenBatch b{p.tokens.data(), pos_.data(), seq_of_.data(), T, p.tables.data(), n, p.width};
    seq_loras_.resize(size_t(n));
    for (int64_t s = 0; s < n; ++s) seq_loras_[size_t(s)] = p.seqs[size_t(s)].lora;
    if (std::any_of(seq_loras_.begin(), seq_loras_.end(), [](int32_t l) { return l != 0; }))
        b.seq_loras = seq_loras_.data();  // (no step graph: it captures no adapter grouping)
    const auto t0 = Clock::now();
    double waited = 0;
    if (!(graphs_on_ && graph_step(p, b, out, &waited))) {
        const StepScope step(model_.backend(), b);  // the metadata goes to the device once
        const ModelOptions& o = model_.options();
        View hidden = model_.hidden_scratch(T);
        if (o.first_stage) {
            model_.embed(b, hidden);
        } else {
            const auto w0 = Clock::now();
            links_.pipe->recv(hidden, links_.prev);
            waited = since(w0);
        }
        model_.run_layers(b, hidden);
        if (!o.last_stage) {
            links_.pipe->send(hidden, links_.next);
        } else if (!rows.empty()) {
            const View lg = model_.head_logits(hidden, rows);  // every TP rank of the last stage takes part
            if (is_sampler() && p.kind == StepPlan::Kind::kScore) {
                out->logits.resize(rows.size() * size_t(model_.config().vocab));
                model_.backend().download(out->logits.data(), lg);
            } else if (is_sampler()) {
                sample(p, lg, out);
            }
        }
    }
    counters_.compute_seconds += since(t0) - waited;
    counters_.wait_seconds += waited;
    ++counters_.steps;
}

// The plan's adapter loads and removals, before its forward: this rank's layers of each file (the leader
// checked the whole adapter when it was added).
void BackendRunner::load_loras(const StepPlan& p) {
    for (const LoraLoad& l : p.loras) {
        if (l.path.empty()) {
            model_.set_lora(l.slot, nullptr);
            continue;
        }
        LoraReadOptions ro;
        ro.max_rank = INT64_MAX;
        ro.layer_begin = model_.options().layer_begin;
        ro.layer_end = model_.options().layer_end;
        model_.set_lora(l.slot, std::make_shared<const LoraAdapter>(read_lora_adapter(l.name, l.path,
                                                                                      model_.config(), ro)));
    }
}

void BackendRunner::pad_batch(const StepPlan& p, const TokenBatch& b, int64_t B) {
    const int64_t T = b.count, W = b.table_width;
    graph_tokens_.assign(b.ids, b.ids + T);
    graph_tokens_.resize(size_t(B), 0);
    graph_positions_.assign(b.positions, b.positions + T);
    graph_positions_.resize(size_t(B), 0);
    graph_seqs_.resize(size_t(B));
    for (int64_t i = 0; i < B; ++i) graph_seqs_[size_t(i)] = int32_t(i);
    LATTICE_CHECK(std::equal(b.seqs, b.seqs + T, graph_seqs_.begin()), "step {}: decode tokens out of sequence order",
                  p.number);
    graph_tables_.assign(b.block_tables, b.block_tables + T * W);
    graph_tables_.resize(size_t(B * W), -1);
    for (int64_t i = T; i < B; ++i) graph_tables_[size_t(i * W)] = trash_block_;
}

// Every rank takes the same branch (it depends only on the plan), so TP collectives stay matched:
// a stage receives the previous stage's padded rows into the bucket's hidden rows before its graph
// runs and sends them on after it (on the backend's stream for a device communicator). `waited`:
// seconds in the receive.
bool BackendRunner::graph_step(const StepPlan& p, const TokenBatch& b, StepResults* out, double* waited) {
    const int64_t T = b.count, W = b.table_width;
    if (p.kind != StepPlan::Kind::kStep || T > graph_max_ || b.num_seqs != T || b.seq_loras) return false;
    for (const PlanSeq& ps : p.seqs)
        if (ps.count != 1 || !ps.sample) return false;
    const int64_t B = *std::lower_bound(graph_buckets_.begin(), graph_buckets_.end(), T);
    pad_batch(p, b, B);
    const TokenBatch gb{graph_tokens_.data(), graph_positions_.data(), graph_seqs_.data(), B,
                        graph_tables_.data(), B, W};
    GraphSlot& slot = graphs_[B];
    if (!slot.hidden.data) slot.hidden = model_.hidden_scratch(B);  // stable: the model's scratch never moves
    Backend& be = model_.backend();
    const ModelOptions& o = model_.options();
    auto body = [this, gb, &slot] {
        const StepScope step(model_.backend(), gb);
        if (model_.options().first_stage) model_.embed(gb, slot.hidden);
        model_.run_layers(gb, slot.hidden);
        if (model_.options().last_stage) {
            graph_rows_.resize(size_t(gb.count));
            for (int64_t i = 0; i < gb.count; ++i) graph_rows_[size_t(i)] = i;
            slot.logits = model_.head_logits(slot.hidden, graph_rows_);
        }
    };
    if (!o.first_stage) {
        const auto w0 = Clock::now();
        links_.pipe->recv(slot.hidden, links_.prev);
        *waited += since(w0);
    }
    ++counters_.graph_steps;
    if (!slot.warmed) {
        body();
        slot.warmed = true;
    } else {
        if (!slot.graph) {
            slot.graph = be.capture_step(gb, body);
            ++counters_.graphs_captured;
        }
        be.replay_step(*slot.graph, gb);
        ++counters_.graph_replays;
        model_.wait_comm();
    }
    if (!o.last_stage) links_.pipe->send(slot.hidden, links_.next);
    if (is_sampler()) sample(p, slot.logits.row_range(0, T), out);
    return true;
}

}  // namespace lattice
