// Engine (see engine.h for the roles and the step protocol). Messages on the plans communicator:
//   leader -> every rank, per plan:  8 KiB: int64 size, then the encoded StepPlan's first bytes
//                                    (step_plan.h); a longer plan: one more message with the rest.
// On the world communicator:
//   sampler -> leader, per kStep:    SampledToken[n + 1], the first holding n (sampled sequences);
//                      per kScore:   f32 logits [tokens, vocab];
//   leader -> every rank, after generate_batch: the results (so every rank returns them).
// Pipeline stages pass hidden rows [tokens, hidden] on the pipe communicator, in plan order.
#include "runtime/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <thread>

#include "base/clock.h"
#include "base/error.h"

namespace lattice {

namespace {

using Clock = SteadyClock;
constexpr auto since = seconds_since;
constexpr int64_t kPlanHead = 8192;  // a plan's first message: its size and up to 8184 of its bytes

// The step graphs' batch sizes: `given` (increasing, positive; those above cap dropped), or by default
// vLLM's list: 1, 2, 4, then every multiple of 8 up to cap, and cap itself as the last.
std::vector<int64_t> graph_bucket_list(const std::vector<int64_t>& given, int64_t cap) {
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

template <typename T>
View host_view(T* p, DType dt, int64_t n) {
    return View::contiguous(const_cast<std::remove_const_t<T>*>(p), dt, {n});
}

}  // namespace

Engine::Engine(Model& model, PipelineLinks links, const EngineOptions& opt) : model_(model), links_(links), opt_(opt) {
    if (links_.world) {
        rank_ = links_.world->rank();
        world_ = links_.world->size();
    }
    stages_ = links_.pipe ? links_.pipe->size() : 1;
    LATTICE_CHECK(model_.kv_blocks() > 0, "Engine: the model has no KV cache (Model::allocate_kv first)");
    const ModelOptions& mo = model_.options();
    // Every rank decides alike (the options, the backend kind and the model are the same everywhere), so
    // the leader's pool and every stage agree on the reserved trash block.
    graphs_on_ = !opt_.sim && opt_.step_graphs && model_.backend().captures_steps() && model_.capturable() &&
                 model_.kv_blocks() >= 2;
    if (graphs_on_) {
        trash_block_ = int32_t(model_.kv_blocks() - 1);
        graph_buckets_ = graph_bucket_list(opt_.graph_buckets, std::min(opt_.max_seqs, mo.max_batch_tokens));
        graph_max_ = graph_buckets_.back();
        const size_t W = size_t(model_.attention_shape().table_width), B = size_t(graph_max_);
        graph_tokens_.reserve(B);
        graph_positions_.reserve(B);
        graph_seqs_.reserve(B);
        graph_tables_.reserve(B * W);
        graph_rows_.reserve(B);
    }
    if (is_leader()) {
        const ModelConfig& c = model_.config();
        pool_ = std::make_unique<BlockPool>(model_.kv_blocks() - (graphs_on_ ? 1 : 0),
                                            model_.attention_shape().block_size, opt_.prefix_caching);
        SchedulerOptions so;
        // A step holds the decode tokens of its running sequences, then up to step_tokens prompt
        // tokens, all within the model's rows (the builder sizes them for max_seqs decodes beside
        // the budget, so the budget never caps how many sequences run).
        const int64_t mbt = model_.options().max_batch_tokens;
        so.step_tokens = opt_.step_tokens > 0 ? std::min(opt_.step_tokens, mbt) : mbt;
        so.step_capacity = mbt;
        so.max_itl_s = opt_.max_itl_s;
        so.max_seqs = opt_.max_seqs;
        so.max_seq = model_.max_seq();
        so.micro_batches = stages_;
        so.vocab = c.vocab;
        so.eos_ids = c.eos_ids;
        LATTICE_CHECK(opt_.speculative_tokens >= 0 && opt_.speculative_tokens <= kMaxSpeculativeTokens,
                      "speculative tokens {}: must be in [0, {}]", opt_.speculative_tokens, kMaxSpeculativeTokens);
        so.spec_tokens = opt_.speculative_tokens;
        so.proposer = opt_.draft_proposer;
        sched_ = std::make_unique<Scheduler>(so, *pool_);
    }
    last_sent_ = Clock::now();
}

Engine::~Engine() = default;

// ---- messages ----

// The plan goes to every follower on the plans communicator (links_.plans), whose sends are
// buffered kPlanQueue plans deep per follower (parallel_context.h): each send copies the bytes and
// returns, MPI completes the transfer while this rank computes its stage, and the leader blocks
// only when some follower is that many plans behind. The time in those sends is plan_wait.
void Engine::send_plan(const StepPlan& p) {
    last_sent_ = Clock::now();
    if (world_ == 1) return;
    // One encoding (every follower knows the same tables), framed as a head of kPlanHead bytes (the
    // plan's size, then its first bytes) and, for a longer plan, one message with the rest: most
    // plans are one send per follower.
    std::vector<uint8_t> head(kPlanHead, 0);
    const std::vector<uint8_t> bytes = encode_plan(p, plan_tables_);
    const int64_t n = int64_t(bytes.size()), first = std::min<int64_t>(n, kPlanHead - 8);
    std::memcpy(head.data(), &n, 8);
    std::memcpy(head.data() + 8, bytes.data(), size_t(first));
    Communicator& c = plan_comm();
    const auto t0 = Clock::now();
    const double cpu0 = thread_cpu_seconds(), blocked0 = c.send_wait_seconds();
    for (int r = 0; r < world_; ++r) {
        if (r == rank_) continue;
        c.send(host_view(head.data(), DType::kU8, kPlanHead), r);
        if (n > first) c.send(host_view(bytes.data() + first, DType::kU8, n - first), r);
    }
    counters_.plan_wait_seconds += since(t0);
    counters_.plan_blocked_seconds += c.send_wait_seconds() - blocked0;
    counters_.plan_cpu_seconds += thread_cpu_seconds() - cpu0;
    ++counters_.plans_sent;
    counters_.plan_bytes += n;
}

StepPlan Engine::recv_plan() {
    int64_t n = 0;
    const auto t0 = Clock::now();
    Communicator& c = plan_comm();
    std::vector<uint8_t> head(kPlanHead);
    c.recv(host_view(head.data(), DType::kU8, kPlanHead), 0);
    std::memcpy(&n, head.data(), 8);
    LATTICE_CHECK(n > 0 && n < (int64_t(1) << 30), "rank {}: step plan of {} bytes from the leader", rank_, n);
    const int64_t first = std::min<int64_t>(n, kPlanHead - 8);
    std::vector<uint8_t> bytes(static_cast<size_t>(n));
    std::memcpy(bytes.data(), head.data() + 8, size_t(first));
    if (n > first) c.recv(host_view(bytes.data() + first, DType::kU8, n - first), 0);
    counters_.wait_seconds += since(t0);
    StepPlan p = decode_plan(bytes.data(), n, plan_tables_);
    LATTICE_CHECK(p.number == number_ + 1, "rank {}: step plan {} arrived after {} (out of order)", rank_, p.number,
                  number_);
    number_ = p.number;
    return p;
}

void Engine::send_results(const StepPlan& p, const Results& r) {
    if (p.kind == StepPlan::Kind::kScore) {
        links_.world->send(host_view(r.logits.data(), DType::kF32, int64_t(r.logits.size())), 0);
        return;
    }
    std::vector<SampledToken> buf;  // {slots, 0}, a token per slot (plan.sample_slots()), the top logprobs
    buf.reserve(r.tokens.size() + 1);
    buf.push_back(SampledToken{int32_t(r.tokens.size()), 0});
    buf.insert(buf.end(), r.tokens.begin(), r.tokens.end());
    buf.insert(buf.end(), r.top.begin(), r.top.end());  // as many as the plan's sampled sequences ask for
    links_.world->send(
        host_view(reinterpret_cast<const uint8_t*>(buf.data()), DType::kU8, int64_t(buf.size() * sizeof(SampledToken))),
        0);
}

Engine::Results Engine::await_oldest(StepPlan* plan) {
    *plan = std::move(inflight_.front());
    inflight_.pop_front();
    Results r;
    const auto t0 = Clock::now();
    if (plan->kind == StepPlan::Kind::kScore) {
        r.logits.resize(plan->tokens.size() * size_t(model_.config().vocab));
        links_.world->recv(host_view(r.logits.data(), DType::kF32, int64_t(r.logits.size())), links_.sampler);
    } else {
        const int64_t n = plan->sample_slots();
        int64_t top = 0;
        for (const PlanSeq& ps : plan->seqs)
            if (ps.sample) top += ps.sampling.logprobs;
        std::vector<SampledToken> buf(static_cast<size_t>(n + 1 + top));
        links_.world->recv(
            host_view(reinterpret_cast<uint8_t*>(buf.data()), DType::kU8, int64_t(buf.size() * sizeof(SampledToken))),
            links_.sampler);
        LATTICE_CHECK(buf[0].token == n, "leader: step {} came back with {} token slots for {}", plan->number,
                      buf[0].token, n);
        r.tokens.assign(buf.begin() + 1, buf.begin() + 1 + n);
        r.top.assign(buf.begin() + 1 + n, buf.end());
    }
    counters_.wait_seconds += since(t0);
    return r;
}

void Engine::attach_top(const StepPlan& p, const Results& r, std::vector<TokenEvent>& events) {
    if (r.top.empty()) return;
    std::unordered_map<int64_t, std::pair<size_t, int32_t>> at;  // sequence -> (offset, count) in r.top
    size_t off = 0;
    for (const PlanSeq& ps : p.seqs) {
        if (!ps.sample || ps.sampling.logprobs == 0) continue;
        at[ps.id] = {off, ps.sampling.logprobs};
        off += size_t(ps.sampling.logprobs);
    }
    LATTICE_CHECK(off == r.top.size(), "step {}: {} top logprobs for {} asked", p.number, r.top.size(), off);
    for (TokenEvent& e : events) {
        const auto it = at.find(e.id);
        if (it == at.end() || e.token < 0) continue;
        const auto first = r.top.begin() + int64_t(it->second.first);
        e.top.assign(first, first + it->second.second);
    }
}

// ---- execution (every rank) ----

void Engine::execute(const StepPlan& p, Results* out) {
    if (opt_.sim) return sim_execute(p, out);
    const ModelConfig& c = model_.config();
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
    if (is_sampler())
        for (int64_t id : p.released) samplers_.erase(id);
    const TokenBatch b{p.tokens.data(), pos_.data(), seq_of_.data(), T, p.tables.data(), n, p.width};
    const auto t0 = Clock::now();
    double graph_waited = 0;
    if (graphs_on_ && graph_step(p, b, out, &graph_waited)) {
        counters_.compute_seconds += since(t0) - graph_waited;
        counters_.wait_seconds += graph_waited;
        ++counters_.steps;
        return;
    }
    const StepScope step(model_.backend(), b);  // the metadata goes to the device once
    const ModelOptions& o = model_.options();
    double waited = 0;
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
        const int64_t V = c.vocab;
        const View lg = model_.head_logits(hidden, rows);  // every TP rank of the last stage takes part
        Backend& be = model_.backend();
        if (is_sampler() && p.kind == StepPlan::Kind::kScore) {
            out->logits.resize(rows.size() * size_t(V));
            be.download(out->logits.data(), lg);
        } else if (is_sampler()) {
            const auto ts = Clock::now();
            sample_rows(p, lg, out);
            counters_.sample_seconds += since(ts);
        }
    }
    counters_.compute_seconds += since(t0) - waited;
    counters_.wait_seconds += waited;
    ++counters_.steps;
}

// The simulated device's step (sim_device.h): the previous stage's hidden rows (16-bit, the real
// byte count), one TP all-reduce of a layer's real byte count, then a sleep until the predicted
// time of the whole stage step has passed since the rows arrived, the hand-off to the next stage,
// and on the sampler one pseudo-token per sampled sequence. Every rank takes the same branches (they
// depend on the plan only), so the collectives match.
void Engine::sim_execute(const StepPlan& p, Results* out) {
    LATTICE_CHECK(p.kind == StepPlan::Kind::kStep, "the simulated device has no logits to score (step {})", p.number);
    const SimDevice& sim = *opt_.sim;
    const ModelOptions& o = model_.options();
    const int64_t T = int64_t(p.tokens.size());
    double attended = 0;  // positions each token attends to, summed
    for (const PlanSeq& ps : p.seqs)
        attended += double(ps.count) * double(ps.start) + double(ps.count) * double(ps.count + 1) / 2.0;
    const int64_t sampled = p.sampled();
    sim_rows_.resize(size_t(sim.hidden_bytes(T)));
    const View rows = host_view(sim_rows_.data(), DType::kU8, int64_t(sim_rows_.size()));
    double waited = 0;
    if (!o.first_stage) {
        const auto w0 = Clock::now();
        links_.pipe->recv(rows, links_.prev);
        waited = since(w0);
    }
    const auto t0 = Clock::now();
    if (sim.tp() > 1) {  // (as f32 words: the same bytes)
        LATTICE_CHECK(links_.tp, "simulated device: tp {} without a TP communicator", sim.tp());
        links_.tp->all_reduce_sum(host_view(sim_rows_.data(), DType::kF32, int64_t(sim_rows_.size() / 4)));
    }
    const double step_s = sim.step_seconds(T, T > 0 ? attended / double(T) : 0.0, o.last_stage ? sampled : 0);
    // The real all-reduce counts against the step's predicted time (which includes the link): what
    // runs past it (a machine with fewer cores than ranks) is the simulation's overrun.
    counters_.sim_overrun_seconds += std::max(0.0, since(t0) - step_s);
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(step_s)));
    if (!o.last_stage) links_.pipe->send(rows, links_.next);
    if (is_sampler()) {
        for (int64_t id : p.released) samplers_.erase(id);
        out->tokens.clear();
        for (const PlanSeq& ps : p.seqs) {
            if (!ps.sample) continue;
            out->tokens.push_back(SampledToken{
                SimDevice::pseudo_token(ps.id, ps.start + ps.count - ps.n_draft, model_.config().vocab,
                                        model_.config().eos_ids),
                0.0f});
            out->tokens.insert(out->tokens.end(), size_t(ps.n_draft), SampledToken{-1, 0.0f});  // drafts refused
        }
    }
    counters_.compute_seconds += since(t0);
    counters_.wait_seconds += waited;
    ++counters_.steps;
}

// Decode-only steps (one sampled token per sequence, at most graph_max_ of them) run as the
// captured graph of their bucket, the smallest of graph_buckets_ holding them: the batch is padded
// with dummy sequences (token 0 at position 0, writing the reserved trash block), the first step of
// a bucket runs eagerly (sizing scratch), the second captures and replays, the rest replay. Every
// rank takes the same branch (it depends only on the plan), so TP collectives stay matched, and with
// pipeline stages every stage pads alike: a stage receives the previous stage's padded rows into the
// bucket's hidden rows before its graph runs and sends them on after it (the hand-offs stay outside
// the graph, on the backend's stream for a device communicator). `waited`: seconds in the receive.
bool Engine::graph_step(const StepPlan& p, const TokenBatch& b, Results* out, double* waited) {
    const int64_t T = b.count, W = b.table_width;
    if (p.kind != StepPlan::Kind::kStep || T > graph_max_ || b.num_seqs != T) return false;
    for (const PlanSeq& ps : p.seqs)
        if (ps.count != 1 || !ps.sample) return false;
    const int64_t B = *std::lower_bound(graph_buckets_.begin(), graph_buckets_.end(), T);
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
    if (is_sampler()) {
        const auto ts = Clock::now();
        sample_rows(p, slot.logits.row_range(0, T), out);
        counters_.sample_seconds += since(ts);
    }
    return true;
}

// One token per sampled sequence of the step from the logits lg [rows, vocab] on the backend.
// Rows that ask for top logprobs (the backends' select_tokens returns only the chosen token's), that
// a grammar masks (structured output: the leader's mask, applied to the host row like the bans) or a
// backend that cannot select (CPU) take the host path: the row on the host, the log-softmax, the
// bans, Sampler::sample. The rest are picked by Backend::select_tokens with a draw from their
// sampler and their penalties as per-id edits (Sampler::penalty_list: the recent window's ids and the
// generated counts, applied on the device before the bans), so on CUDA only ids and log-probabilities
// leave the device, penalized rows included.
void Engine::sample_rows(const StepPlan& p, const View& lg, Results* out) {
    const int64_t V = model_.config().vocab;
    Backend& be = model_.backend();
    struct Row {
        const PlanSeq* ps;
        std::span<const int32_t> bans, recent;
        Sampler* sampler;
        const uint32_t* mask;   // structured output: the allowed ids' bits (null: all allowed)
        int64_t row = 0;        // its first logit row (n_draft + 1 rows with drafts)
        size_t slot = 0;        // its first token slot in out->tokens
        const int32_t* drafts;  // n_draft drafted ids (the fed tokens after the first)
    };
    std::vector<Row> rows;
    size_t ban = 0, recent = 0, mask = 0, fed = 0;
    int64_t logit_rows = 0;
    size_t slots = 0;
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
        rows.push_back({&ps, ps.ban_stop ? bans : std::span<const int32_t>{}, last, &it->second, allowed, logit_rows,
                        slots, p.tokens.data() + fed - size_t(ps.n_draft)});
        logit_rows += 1 + ps.n_draft;
        slots += size_t(1 + ps.n_draft);
    }
    LATTICE_CHECK(logit_rows == lg.rows(), "step {}: {} logit rows for {} samples", p.number, lg.rows(), logit_rows);
    out->tokens.assign(slots, SampledToken{-1, 0.0f});
    std::vector<size_t> top_at(rows.size());  // where each row's top logprobs go in out->top
    size_t n_top = 0;
    for (size_t k = 0; k < rows.size(); ++k) {
        top_at[k] = n_top;
        n_top += size_t(rows[k].ps->sampling.logprobs);
    }
    out->top.resize(n_top);
    host_rows_.clear();  // filled below when some row is sampled on the host
    std::vector<int64_t> on_backend;
    if (be.selects_tokens())
        for (size_t k = 0; k < rows.size(); ++k)
            if (rows[k].ps->sampling.logprobs == 0 && !rows[k].mask && rows[k].ps->n_draft == 0)
                on_backend.push_back(int64_t(k));
    if (!on_backend.empty()) {
        // select_tokens takes its rows contiguous: in a batch that mixes in host rows (top logprobs,
        // masks, drafts to verify), every row goes to the host (those need it there) and the others back
        // to the front.
        View sel = lg;
        if (int64_t(on_backend.size()) != lg.rows()) {
            sel = lg.row_range(0, int64_t(on_backend.size()));
            host_rows_.resize(size_t(lg.rows() * V));
            be.download(host_rows_.data(), lg);
            for (size_t j = 0; j < on_backend.size(); ++j)
                be.upload(sel.row_range(int64_t(j), int64_t(j) + 1),
                          host_rows_.data() + size_t(rows[size_t(on_backend[j])].row * V));
        }
        std::vector<TokenSelect> sels(on_backend.size());
        penalties_.resize(std::max(penalties_.size(), on_backend.size()));
        for (size_t j = 0; j < on_backend.size(); ++j) {
            const Row& r = rows[size_t(on_backend[j])];
            const SamplingParams& sp = r.sampler->params();
            // The penalties go with the row (applied before the bans and the pick, on the device).
            r.sampler->penalty_list(r.recent, V, penalties_[j]);
            sels[j] = {sp.temperature, int32_t(std::min<int64_t>(sp.top_k, INT32_MAX)), sp.top_p, sp.min_p,
                       r.sampler->draw(), r.bans, sp.repeat_penalty, penalties_[j]};
        }
        std::vector<int32_t> ids(on_backend.size());
        std::vector<float> lps(on_backend.size());
        be.select_tokens(sel, sels, ids.data(), lps.data());
        for (size_t j = 0; j < on_backend.size(); ++j) {
            rows[size_t(on_backend[j])].sampler->accept(ids[j]);
            out->tokens[rows[size_t(on_backend[j])].slot] = SampledToken{ids[j], lps[j]};
        }
    }
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
        if (r.ps->n_draft > 0) {
            verify_drafts(r.ps->n_draft, r.drafts, host_rows_.data() + size_t(r.row * V), V, r.bans, *r.sampler,
                          out->tokens.data() + r.slot);
            continue;
        }
        float* row = host_rows_.data() + size_t(r.row * V);
        // log-softmax of the model's row (temperature 1), before any ban, penalty or temperature
        const double lse = host_log_sum_exp(row, V);
        if (const int32_t m = std::min<int32_t>(r.ps->sampling.logprobs, int32_t(V)); m > 0) {
            int32_t ids[SamplingParams::kMaxLogprobs];
            float lps[SamplingParams::kMaxLogprobs];
            top_logprobs(row, V, lse, m, ids, lps);
            for (int32_t j = 0; j < m; ++j) out->top[top_at[k] + size_t(j)] = SampledToken{ids[j], lps[j]};
        }
        for (int32_t id : r.bans)
            if (id >= 0 && id < V) row[id] = -INFINITY;
        if (r.mask) apply_token_mask(row, V, r.mask);
        const int32_t tok = r.sampler->sample(row, V, r.recent);
        out->tokens[r.slot] = SampledToken{tok, float(double(row[tok]) - lse)};  // (the Sampler leaves row raw)
    }
}

// A speculating sequence's n_draft + 1 rows (row i follows draft i, row 0 the last verified token):
// each draft checked in order (Sampler::verify, which keeps the sampled distribution exact) until one
// is refused, whose row's token replaces it; when all pass, the last row gives one more token. The
// tokens go to out[0 ..], each with its raw log-softmax; the slots after them stay -1.
void Engine::verify_drafts(int32_t n_draft, const int32_t* drafts, float* rows, int64_t V,
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

StepBreakdown Engine::breakdown(const EngineCounters& c0, double comm0, double wall) const {
    StepBreakdown b;
    b.rank = rank_;
    b.tp_rank = model_.options().tp_rank;
    b.pp_rank = links_.pipe ? links_.pipe->rank() : 0;
    b.steps = counters_.steps - c0.steps;
    b.wall = wall;
    b.communication = model_.comm_seconds() - comm0;
    b.sampling = counters_.sample_seconds - c0.sample_seconds;
    b.compute = std::max(0.0, counters_.compute_seconds - c0.compute_seconds - b.communication - b.sampling);
    b.pipeline_bubble = counters_.wait_seconds - c0.wait_seconds;
    b.host_overhead = std::max(0.0, wall - b.compute - b.communication - b.sampling - b.pipeline_bubble);
    b.plan_wait = counters_.plan_wait_seconds - c0.plan_wait_seconds;
    b.plan_blocked = counters_.plan_blocked_seconds - c0.plan_blocked_seconds;
    b.plan_bytes = counters_.plan_bytes - c0.plan_bytes;
    return b;
}

// ---- leader ----

int64_t Engine::add(EngineRequest r) {
    LATTICE_CHECK(is_leader(), "Engine::add on rank {}: requests go to the leader (rank 0)", rank_);
    return sched_->add(std::move(r));
}

void Engine::cancel(int64_t id) {
    LATTICE_CHECK(is_leader(), "Engine::cancel on rank {}", rank_);
    sched_->cancel(id);
}

bool Engine::busy() const {
    return is_leader() && (!sched_->idle() || !inflight_.empty() || !done_.empty());
}

void Engine::issue(const StepPlan& plan) {
    StepPlan p = plan;
    p.number = ++number_;
    if (p.kind == StepPlan::Kind::kStep) issued_at_[p.number] = Clock::now();
    send_plan(p);
    Results r;
    execute(p, &r);
    if (is_sampler())
        done_.emplace_back(std::move(p), std::move(r));
    else
        inflight_.push_back(std::move(p));
}

std::vector<TokenEvent> Engine::step() {
    LATTICE_CHECK(is_leader(), "Engine::step on rank {}: followers run follow()", rank_);
    std::vector<TokenEvent> out = sched_->take_finished();
    while (int64_t(inflight_.size() + done_.size()) < stages_) {
        StepPlan p = sched_->next(0);
        if (p.empty()) break;
        issue(p);
        if (!done_.empty()) break;  // one stage: one step per call
    }
    std::vector<TokenEvent> ev;
    if (!done_.empty()) {
        auto [p, r] = std::move(done_.front());
        done_.pop_front();
        observe_step(p);
        ev = sched_->complete(p, r.tokens);
        attach_top(p, r, ev);
    } else if (!inflight_.empty()) {
        StepPlan p;
        Results r = await_oldest(&p);
        observe_step(p);
        ev = sched_->complete(p, r.tokens);
        attach_top(p, r, ev);
    } else {
        heartbeat_if_due();
    }
    out.insert(out.end(), ev.begin(), ev.end());
    return out;
}

void Engine::observe_step(const StepPlan& p) {
    const auto it = issued_at_.find(p.number);
    if (it == issued_at_.end()) return;
    sched_->observe_step(int64_t(p.tokens.size()), since(it->second));
    issued_at_.erase(it);
}

void Engine::heartbeat_if_due() {
    StepPlan hb;
    hb.kind = StepPlan::Kind::kHeartbeat;
    hb.released = sched_->take_released();
    if (is_sampler())
        for (int64_t id : hb.released) samplers_.erase(id);
    if (world_ == 1 || (hb.released.empty() && since(last_sent_) < opt_.heartbeat_s)) return;
    hb.number = ++number_;
    send_plan(hb);
}

void Engine::shutdown() {
    LATTICE_CHECK(is_leader(), "Engine::shutdown on rank {}", rank_);
    while (!done_.empty()) {
        auto [p, r] = std::move(done_.front());
        done_.pop_front();
        sched_->complete(p, r.tokens);
    }
    while (!inflight_.empty()) {
        StepPlan p;
        Results r = await_oldest(&p);
        if (p.kind == StepPlan::Kind::kStep) sched_->complete(p, r.tokens);
    }
    issued_at_.clear();
    StepPlan s;
    s.kind = StepPlan::Kind::kShutdown;
    s.released = sched_->take_released();
    if (is_sampler())
        for (int64_t id : s.released) samplers_.erase(id);
    s.number = ++number_;
    send_plan(s);
}

// ---- followers ----

void Engine::follow() {
    LATTICE_CHECK(!is_leader(), "Engine::follow on the leader");
    for (;;) {
        StepPlan p = recv_plan();
        if (p.kind == StepPlan::Kind::kShutdown || p.kind == StepPlan::Kind::kHeartbeat) {
            if (is_sampler())
                for (int64_t id : p.released) samplers_.erase(id);
            if (p.kind == StepPlan::Kind::kShutdown) return;
            continue;
        }
        Results r;
        execute(p, &r);
        if (is_sampler()) send_results(p, r);
    }
}

}  // namespace lattice
