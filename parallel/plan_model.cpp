// The layout planner's model (see plan_model.h for the formulas). The device and link tables it runs on, and the
// sources of their constants: plan_devices.cpp.
#include "parallel/plan_model.h"

#include <algorithm>
#include <cmath>
#include <exception>

#include <fmt/format.h>

#include "base/error.h"

namespace lattice {

bool tp_crosses_nodes(const PlanRequest& r, int tp) { return r.nodes > 1 && tp > r.devices / r.nodes; }

PlanQuant parse_plan_quant(const std::string& s) {
    if (s == "w8a8") return PlanQuant::kW8A8;
    if (s == "w8a16") return PlanQuant::kW8A16;
    if (s == "w4a8") return PlanQuant::kW4A8;
    if (s == "w4a16") return PlanQuant::kW4A16;
    if (s == "fp16" || s == "bf16") return PlanQuant::kFp16;
    if (s == "f32") return PlanQuant::kF32;
    LATTICE_FAIL("unknown --quant \"{}\" (w8a8, w8a16, w4a8, w4a16, fp16, bf16, f32, none)", s);
}

const char* plan_quant_name(PlanQuant q) {
    switch (q) {
        case PlanQuant::kW8A8: return "w8a8";
        case PlanQuant::kW8A16: return "w8a16";
        case PlanQuant::kW4A8: return "w4a8";
        case PlanQuant::kW4A16: return "w4a16";
        case PlanQuant::kFp16: return "fp16";
        case PlanQuant::kF32: return "f32";
    }
    return "?";
}

PlanQuant device_plan_quant(const std::string& s, bool cpu) {
    if (s == "none") return cpu ? PlanQuant::kF32 : PlanQuant::kFp16;
    const PlanQuant q = parse_plan_quant(s);
    return !cpu && q == PlanQuant::kW4A8 ? PlanQuant::kW4A16 : q;
}

namespace {

// Parameters with `experts` FFNs per layer (a MoE model: every expert held, or the n_experts_used a
// token runs), plus the router.
double shape_parameters(const ModelDims& d, double experts) {
    const double h = double(d.hidden);
    const double layer = h * double(d.n_heads + 2 * d.n_kv_heads) * double(d.head_dim) +
                         double(d.n_heads * d.head_dim) * h + experts * 3.0 * h * double(d.intermediate) +
                         double(d.n_experts) * h + 2.0 * h;
    return double(d.n_layers) * layer + double(d.vocab) * h * (d.tie_embeddings ? 1.0 : 2.0) + h;
}

}  // namespace

double model_parameters(const ModelDims& d) {
    return shape_parameters(d, double(std::max<int64_t>(d.n_experts, 1)));
}
double active_parameters(const ModelDims& d) {
    return shape_parameters(d, double(std::max<int64_t>(d.n_experts_used, 1)));
}

double kv_element_bytes(const std::string& kv_dtype, int64_t head_dim, bool cpu) {
    if (kv_dtype == "auto") return cpu ? 4.0 : 2.0;
    if (kv_dtype == "f32") return 4.0;
    if (kv_dtype == "f16" || kv_dtype == "bf16") return 2.0;
    LATTICE_CHECK(kv_dtype == "int8", "--kv-cache-dtype \"{}\": expected auto, f32, f16, bf16 or int8", kv_dtype);
    LATTICE_CHECK(head_dim > 0, "kv_element_bytes: head_dim {}", head_dim);
    return 1.0 + 4.0 / double(head_dim);  // runtime/backend/backend.h kv_row_elems: the row's scale
}

double kv_cache_bytes(const ModelDims& m, int tp, int64_t layers, int64_t positions, double bytes_per_elem) {
    const ShardShape s = shard_shape(m, tp, 0);
    return double(layers) * 2.0 * double(positions) * double(s.n_kv) * double(m.head_dim) * bytes_per_elem;
}

double activation_bytes(const ModelDims& m, int tp, int64_t tokens, double bytes_per_elem, bool last_stage) {
    const ShardShape s = shard_shape(m, tp, 0);
    const double T = double(tokens);
    double b = T * bytes_per_elem *
               (3.0 * double(m.hidden) + double((s.n_heads + 2 * s.n_kv) * m.head_dim) +
                double(s.n_heads * m.head_dim) + 3.0 * double(s.ffn));
    // A MoE layer: the router's logits and an expert's gathered inputs and outputs.
    if (m.n_experts > 0) b += T * bytes_per_elem * (double(m.n_experts) + 2.0 * double(m.hidden));
    if (last_stage) b += T * 4.0 * double(s.vocab_per_rank) * double(tp);
    return b;
}

double experts_touched(const ModelDims& m, double tokens) {
    if (m.n_experts <= 0) return 1.0;
    const double e = double(m.n_experts), k = double(std::clamp<int64_t>(m.n_experts_used, 1, m.n_experts));
    if (tokens <= 1.0) return k;
    return e * (1.0 - std::pow(1.0 - k / e, tokens));
}

namespace {

struct StageShape {
    int64_t layers = 0;
    double attn_params = 0;    // q/k/v/o of its layers (this rank's shard)
    double ffn_params = 0;     // gate/up/down of its layers: the dense FFN's shard, or ONE expert's (MoE)
    double router_params = 0;  // MoE: the routers [experts, hidden] of its layers (replicated, float)
    double experts = 1;        // FFNs per layer (dense: 1)
    double head_params = 0;    // the LM head rows (last stage)
    double embed_params = 0;   // the embedding rows (first stage; decode reads one row per token)
    double small_params = 0;   // norms
    // Linear weights held, and those a forward of `tokens` tokens reads (the experts they touch).
    double linear_params() const { return attn_params + experts * ffn_params; }
    double linear_params_read(const ModelDims& m, double tokens) const {
        return attn_params + experts_touched(m, tokens) * ffn_params;
    }
};

std::vector<StageShape> stage_shapes(const ModelDims& m, int tp, int pp) {
    const ShardShape s = shard_shape(m, tp, 0);
    const double h = double(m.hidden), hd = double(m.head_dim);
    const double attn = h * double(s.n_heads + 2 * s.n_kv) * hd + double(s.n_heads) * hd * h;
    std::vector<StageShape> out;
    const auto ranges = stage_layer_ranges(m.n_layers, pp);
    for (int p = 0; p < pp; ++p) {
        StageShape st;
        st.layers = ranges[size_t(p)].second - ranges[size_t(p)].first;
        st.attn_params = double(st.layers) * attn;
        st.ffn_params = double(st.layers) * 3.0 * h * double(s.ffn);
        if (m.n_experts > 0) {
            st.experts = double(m.n_experts);
            st.router_params = double(st.layers) * double(m.n_experts) * h;
        }
        st.small_params = double(st.layers) * 2.0 * h + (p == pp - 1 ? h : 0.0);
        if (p == 0) st.embed_params = double(s.vocab_rows) * h;
        if (p == pp - 1) st.head_params = double(s.vocab_rows) * h;
        out.push_back(st);
    }
    return out;
}

bool int8_weights(PlanQuant q) { return q == PlanQuant::kW8A8 || q == PlanQuant::kW8A16; }
bool int4_weights(PlanQuant q) { return q == PlanQuant::kW4A8 || q == PlanQuant::kW4A16; }
// int8 x int8 products (W8A8, W4A8) run at the int8 rate, the rest at the float rate.
bool int8_products(PlanQuant q) { return q == PlanQuant::kW8A8 || q == PlanQuant::kW4A8; }

// Bytes per element of activations and KV cache: CPU f32, GPU fp16/bf16.
double act_bytes(const PlanRequest& r) { return r.device.cpu ? 4.0 : 2.0; }
double kv_bytes(const PlanRequest& r) { return r.kv_bytes > 0 ? r.kv_bytes : act_bytes(r); }
// Bytes per unquantized weight: 16-bit (the checkpoints' bf16/fp16, which the CPU backend keeps and
// the GPU computes in) unless f32 is asked for.
double float_weight_bytes(const PlanRequest& r) { return r.quant == PlanQuant::kF32 ? 4.0 : 2.0; }

double linear_bytes(const PlanRequest& r, double params, double rows_hint) {
    if (int4_weights(r.quant)) return params * (r.int4_bytes > 0 ? r.int4_bytes : kInt4GroupBytesPerWeight);
    return int8_weights(r.quant) ? params + 8.0 * rows_hint : params * float_weight_bytes(r);
}

// Bytes of the stage's weights: held (decode_reads false), or read by one forward of `tokens` tokens
// (the embedding apart, one row per token; a MoE layer's experts those tokens are routed to).
double stage_weight_bytes(const PlanRequest& r, const StageShape& st, bool decode_reads, double tokens = 1) {
    const double linear = decode_reads ? st.linear_params_read(r.model, tokens) : st.linear_params();
    const double rows = linear / double(std::max<int64_t>(r.model.hidden, 1));  // ~output channels
    double b = linear_bytes(r, linear, rows) + st.small_params * 4.0 + st.router_params * float_weight_bytes(r);
    // A quantized head is int8, 4-bit runs included (runtime/model/rank_weights.h).
    const bool head_q = r.quant_head && (int8_weights(r.quant) || int4_weights(r.quant));
    const double head_b = head_q ? st.head_params + 8.0 * st.head_params / double(r.model.hidden)
                                 : st.head_params * float_weight_bytes(r);
    b += head_b;
    // The embedding is stored on the first stage (tied and one stage: the head's rows serve both).
    if (!decode_reads && !(r.model.tie_embeddings && st.head_params > 0)) b += st.embed_params * float_weight_bytes(r);
    return b;
}

// Ring all-reduce of `bytes` over n ranks.
double allreduce_s(const LinkSpec& l, int n, double bytes) {
    if (n <= 1) return 0.0;
    return 2.0 * (n - 1) * l.alpha_us * 1e-6 + 2.0 * double(n - 1) / double(n) * bytes / (l.bw_gbs * 1e9);
}

double send_s(const LinkSpec& l, double bytes) { return l.alpha_us * 1e-6 + bytes / (l.bw_gbs * 1e9); }

// What one rank gets while `active` ranks of its node run at once.
struct RankRates {
    double bw = 0;    // bytes/s
    double int8 = 0;  // ops/s
    double fp = 0;    // flops/s
    double attn = 0;  // flops/s of the attention kernels
};

struct StageTime {
    double total = 0, comm = 0;
    bool compute_bound = false;
};

// One forward of `tokens` tokens (each attending to `positions` cached ones) through a stage.
StageTime stage_time(const PlanRequest& r, const StageShape& st, int tp, double tokens, double positions,
                     const RankRates& rate) {
    const ModelDims& m = r.model;
    const ShardShape s = shard_shape(m, tp, 0);
    const double w_bytes = stage_weight_bytes(r, st, true, tokens) + tokens * double(m.hidden) * float_weight_bytes(r) *
                                                                  (st.embed_params > 0 ? 1.0 : 0.0);
    const double kv_read = double(st.layers) * 2.0 * tokens * positions * double(s.n_kv) * double(m.head_dim) *
                           kv_bytes(r);
    const double mem_s = w_bytes / rate.bw;
    const double attn_flops = double(st.layers) * 4.0 * tokens * positions * double(s.n_heads) * double(m.head_dim);
    // The head runs for the sampled rows only (one per sequence; at most `tokens`), at the float
    // rate unless it is quantized. Attention is its own kernel with its own roofline: the KV it
    // reads against its achieved rate.
    const double head_rows = std::min(tokens, double(r.batch));
    const bool head_int8 = int8_products(r.quant) && r.quant_head;
    // Each token runs the attention and its num_experts_per_tok experts (dense: the one FFN), the
    // router at the float rate.
    const double used = m.n_experts > 0 ? double(std::clamp<int64_t>(m.n_experts_used, 1, m.n_experts)) : 1.0;
    const double comp_s = 2.0 * tokens * (st.attn_params + used * st.ffn_params) /
                              (int8_products(r.quant) ? rate.int8 : rate.fp) +
                          2.0 * tokens * st.router_params / rate.fp +
                          2.0 * head_rows * st.head_params / (head_int8 ? rate.int8 : rate.fp);
    const double attn_s = std::max(kv_read / rate.bw, attn_flops / rate.attn);
    StageTime t;
    t.compute_bound = comp_s + attn_flops / rate.attn > mem_s + kv_read / rate.bw;
    // A TP group that spans nodes all-reduces over a ring whose slowest hops are the inter-node link.
    const LinkSpec& tp_link = tp_crosses_nodes(r, tp) ? r.inter_node : r.link;
    t.comm = double(st.layers) * 2.0 * allreduce_s(tp_link, tp, tokens * double(m.hidden) * act_bytes(r));
    if (st.head_params > 0 && tp > 1)  // the gathered logits of the sampled rows
        t.comm += allreduce_s(tp_link, tp, tokens * double(s.vocab_per_rank) * 4.0 * double(tp) / 2.0);
    t.total = std::max(mem_s, comp_s) + (1.0 - r.device.overlap) * std::min(mem_s, comp_s) + attn_s + t.comm +
              double(st.layers) * r.device.layer_overhead_us * 1e-6;
    return t;
}

// What one rank gets while `active` ranks of its node run at once.
RankRates rates_of(const DeviceSpec& d, int active) {
    const double n = double(std::max(active, 1));
    RankRates x;
    x.bw = d.bw_gbs * d.bw_eff * 1e9;
    if (d.node_bw_gbs > 0) x.bw = std::min(x.bw, d.node_bw_gbs * 1e9 / n);
    x.int8 = d.int8_tops * d.compute_eff * 1e12;
    if (d.node_int8_tops > 0) x.int8 = std::min(x.int8, d.node_int8_tops * d.compute_eff * 1e12 / n);
    x.fp = d.fp16_tflops * d.compute_eff * 1e12;
    x.attn = d.attn_tflops > 0 ? d.attn_tflops * 1e12 : x.fp;
    if (d.node_int8_tops > 0 && d.int8_tops > 0) {  // the float units share the cores the same way
        const double share = std::min(1.0, d.node_int8_tops / (d.int8_tops * n));
        x.fp *= share;
        x.attn *= share;
    }
    return x;
}

}  // namespace

double predict_stage_seconds(const PlanRequest& r, int tp, int pp, int stage, double tokens, double positions,
                             double sampled) {
    const auto stages = stage_shapes(r.model, tp, pp);
    LATTICE_CHECK(stage >= 0 && stage < pp, "predict_stage_seconds: stage {} of {}", stage, pp);
    PlanRequest q = r;
    q.batch = std::max<int64_t>(1, int64_t(sampled));  // the head's rows
    return stage_time(q, stages[size_t(stage)], tp, tokens, positions, rates_of(r.device, tp)).total;
}

MemoryEstimate estimate_memory(const PlanRequest& r, int tp, int pp) {
    const auto stages = stage_shapes(r.model, tp, pp);
    MemoryEstimate best;
    double best_total = -1;
    for (int p = 0; p < pp; ++p) {
        MemoryEstimate e;
        e.weights = stage_weight_bytes(r, stages[size_t(p)], false);
        e.kv = kv_cache_bytes(r.model, tp, stages[size_t(p)].layers, r.batch * r.context, kv_bytes(r));
        e.activations = activation_bytes(r.model, tp, r.max_batch_tokens, act_bytes(r), p == pp - 1);
        e.reserved = r.device.reserved_gib * double(int64_t(1) << 30);
        e.heaviest_stage = p;
        if (e.total() > best_total) best_total = e.total(), best = e;
    }
    return best;
}

namespace {
// Whether the model and the nodes allow tp x pp (out.feasible, out.why_not; out.tp_crosses_nodes).
void check_feasible(const PlanRequest& r, int tp, int pp, LayoutPrediction& out) {
    try {
        check_model_layout(r.model, tp, pp);
        Placement place;
        place.nodes = r.nodes;
        place.cpu = r.device.cpu;
        if (r.device.cpu) {
            place.cores_per_node = (tp * pp) / std::max(r.nodes, 1);
        } else {
            place.gpus_per_node = (tp * pp + r.nodes - 1) / std::max(r.nodes, 1);
        }
        // A TP group over whole nodes is what lattice-mpirun refuses but mpirun runs: predicted, flagged.
        out.tp_crosses_nodes = tp_crosses_nodes(r, tp) && (tp * pp) % r.nodes == 0 && tp % (tp * pp / r.nodes) == 0;
        if (!out.tp_crosses_nodes) check_placement(tp, pp, place);
    } catch (const Error& e) {
        out.feasible = false;
        out.why_not = e.message();
    }
}
}  // namespace

LayoutPrediction predict_layout(const PlanRequest& r, int tp, int pp) {
    LayoutPrediction out;
    out.tp = tp;
    out.pp = pp;
    check_feasible(r, tp, pp, out);
    if (!out.feasible) return out;
    out.memory = estimate_memory(r, tp, pp);
    const int ranks_per_node = tp * pp / r.nodes;
    // CPU ranks of a node share its memory; a GPU has its own.
    out.fits = out.memory.total() * (r.device.cpu ? double(ranks_per_node) : 1.0) <=
               r.device.mem_gib * double(int64_t(1) << 30);
    const auto stages = stage_shapes(r.model, tp, pp);
    // Hand-offs between stages: over the node link while the stages share a node, else the network.
    // Every rank of a stage sends its copy of the rows to its peer of the next stage (a blocking send
    // after its step), so a hop that crosses nodes moves tp copies through the node's link and belongs to
    // the sending stage's step (cross_s); hops inside a node overlap the next step (handoff_s).
    const int stages_per_node = std::max(1, ranks_per_node / tp);
    auto crosses = [&](int p) { return r.nodes > 1 && p + 1 < pp && (p + 1) % stages_per_node == 0; };
    auto cross_s = [&](int p, double tokens) {
        return crosses(p) ? send_s(r.inter_node, double(tp) * tokens * double(r.model.hidden) * act_bytes(r)) : 0.0;
    };
    auto handoff_s = [&](double tokens) {
        double t = 0;
        for (int p = 0; p + 1 < pp; ++p)
            if (!crosses(p)) t += send_s(r.link, tokens * double(r.model.hidden) * act_bytes(r));
        if (pp > 1) t += send_s(r.nodes > 1 ? r.inter_node : r.link, 8.0);  // the sampled tokens back to the leader
        return t;
    };
    auto rank_rates = [&](int active) { return rates_of(r.device, active); };
    // The step plan reaches every rank (a broadcast) before each forward.
    const double plan_s = tp * pp > 1 ? std::ceil(std::log2(double(tp * pp))) * r.link.alpha_us * 1e-6 : 0.0;

    // Decode: m micro-batches of ceil(batch / m) sequences, each attending to the prompt.
    const int64_t m = pp > 1 ? std::min<int64_t>(r.batch, pp) : 1;
    const double micro = std::ceil(double(r.batch) / double(m));
    const int active = std::min(ranks_per_node, tp * int(std::min<int64_t>(m, pp)));
    double sum = 0, slowest = 0, comm = 0;
    bool compute_bound = false;
    for (int p = 0; p < pp; ++p) {
        StageTime t = stage_time(r, stages[size_t(p)], tp, micro, double(r.prompt), rank_rates(active));
        const double hop = cross_s(p, micro);
        t.total += hop;
        sum += t.total;
        comm += t.comm + hop;
        if (t.total > slowest) slowest = t.total, compute_bound = t.compute_bound;
    }
    const double hand = handoff_s(micro);
    const double round = std::max(double(m) * slowest, sum + hand) + plan_s;
    out.decode_tokens_per_s = double(r.batch) / round;
    out.decode_token_latency_ms = round * 1e3;
    out.comm_share = (double(m) * comm / double(pp) + hand) / round;
    out.bound = compute_bound ? "compute" : "memory";

    // Prefill: chunks of at most max_batch_tokens flow through the stages (a pipeline when pp > 1).
    // With pp > 1 the engine's scheduler also admits at most ceil(sequences / pp) sequences a step and
    // gives every step in flight a chunk, so the prompts of a batch split into micro-batches that
    // pipeline (runtime/engine/scheduler.cpp).
    // One chunk's way through the stages (the pipeline's fill and drain) runs one stage at a time,
    // at the rate of its TP group alone; the other chunks follow a step behind the slowest stage,
    // while up to min(chunks, pp) stages compute at once and share the node (CPU ranks).
    auto prefill_s = [&](double tokens, double per_step) {
        const double chunk = std::min({tokens, per_step, double(r.max_batch_tokens)});
        const double chunks = std::ceil(tokens / chunk);
        const int alone = std::min(ranks_per_node, tp);
        const int together = std::min(ranks_per_node, tp * int(std::min<double>(chunks, pp)));
        double s = 0, worst = 0;
        for (int p = 0; p < pp; ++p) {
            const StageShape& st = stages[size_t(p)];
            // each chunk attends to half the prompt on average
            s += stage_time(r, st, tp, chunk, double(r.prompt) / 2.0, rank_rates(alone)).total + cross_s(p, chunk);
            worst = std::max(worst, stage_time(r, st, tp, chunk, double(r.prompt) / 2.0, rank_rates(together)).total +
                                        cross_s(p, chunk));
        }
        return s + (chunks - 1.0) * worst + handoff_s(chunk) + chunks * plan_s;
    };
    out.ttft_ms = prefill_s(double(r.prompt), double(r.prompt)) * 1e3;
    out.prefill_tokens_per_s =
        double(r.batch * r.prompt) / prefill_s(double(r.batch * r.prompt), micro * double(r.prompt));
    return out;
}

std::vector<LayoutPrediction> plan_layouts(const PlanRequest& r) {
    LATTICE_CHECK(r.devices >= 1, "--gpus must be at least 1");
    LATTICE_CHECK(r.model.hidden > 0 && r.model.head_dim > 0, "the model's hidden size and head_dim are unknown");
    std::vector<LayoutPrediction> v;
    for (int tp = 1; tp <= r.devices; ++tp)
        if (r.devices % tp == 0) v.push_back(predict_layout(r, tp, r.devices / tp));
    std::stable_sort(v.begin(), v.end(), [](const LayoutPrediction& a, const LayoutPrediction& b) {
        // fitting layouts first, those with a TP group across nodes after the others
        auto key = [](const LayoutPrediction& p) {
            return !p.feasible ? 3 : !p.fits ? 2 : p.tp_crosses_nodes ? 1 : 0;
        };
        const int ka = key(a), kb = key(b);
        if (ka != kb) return ka < kb;
        if (ka == 3) return false;
        if (a.decode_tokens_per_s != b.decode_tokens_per_s) return a.decode_tokens_per_s > b.decode_tokens_per_s;
        return a.pp < b.pp;
    });
    return v;
}

}  // namespace lattice
