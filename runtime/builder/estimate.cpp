// Parameter count and per-rank memory without loading (see estimate.h).
#include "runtime/builder/estimate.h"

#include "parallel/plan_model.h"
#include "parallel/world_config.h"
#include "runtime/backend/cpu/cpu_backend.h"
#include "runtime/builder/build.h"
#include "runtime/model/rank_weights.h"

namespace lattice {

int64_t checked_parameter_count(const TensorSource& src) {
    if (!src.prepared()) check_tensor_set(src);  // a converted file is checked when a rank loads it
    const int64_t params = src.config().parameter_count(), listed = listed_elements(src);
    // Sources that list their tensors must hold what the config describes (rope tables aside).
    LATTICE_CHECK(listed == 0 || listed >= params,
                  "{}: the config describes {} parameters but the checkpoint's tensors hold {}", src.describe(),
                  params, listed);
    return params;
}

RankMemory largest_rank_memory(const TensorSource& src, const MemoryQuery& q) {
    const ModelConfig& c = src.config();
    check_model_layout(c.dims(), q.tp, q.pp);
    const bool cuda = q.device == BackendKind::kCuda;
    const QuantChoice quant = q.quant_auto ? auto_quant(src, q.quant_head, int4_mode_for(q.device))
                                           : QuantChoice{q.quant, q.quant_head};
    const double act = cuda ? 2 : 4;  // activation bytes per element
    const bool bf16 = !cuda && q.cpu_bf16;
    RankMemory best;
    // "auto" as the backends resolve it (kv_auto_dtype: CUDA f16, the CPU f32, bf16 under --dtype bf16).
    best.kv_dtype = q.kv_cache_dtype != "auto" ? q.kv_cache_dtype : cuda ? "f16" : bf16 ? "bf16" : "f32";
    const double kv_elem = kv_element_bytes(best.kv_dtype, c.head_dim, !cuda);
    best.quant = quant.quant;
    best.max_seq = resolve_max_seq(q.max_seq, c.max_position);  // the model's own default
    LATTICE_CHECK(best.max_seq <= c.max_position, "--max-seq {} exceeds the model's max_position_embeddings {}",
                  best.max_seq, c.max_position);
    ModelOptions base;
    base.quant = quant.quant;
    base.quant_head = quant.quant_head;
    QuantMode head = QuantMode::kNone;
    double largest = -1;
    for (int p = 0; p < q.pp; ++p) {
        const WorldConfig w = WorldConfig::make(q.tp * q.pp, q.tp, q.pp, p * q.tp);  // TP rank 0 of stage p
        const ModelOptions o = rank_model_options(base, w, c.n_layers);
        const RankWeights rw(src, o);
        for (const RankTensor& t : rw.tensors())
            if (t.role == WeightRole::kLmHead && t.mode != QuantMode::kNone) head = t.mode;
        const double weights = rw.resident_bytes({.cuda = cuda,
                                                  .cpu_kquant = !cuda && cpu_keeps_kquant(),
                                                  .cpu_bf16 = bf16 ? &cpu_bf16_linear_bytes : nullptr,
                                                  .cpu_w8a8_copy = !cuda && cpu_w8a8_keeps_onednn_copy()});
        const double kv = kv_cache_bytes(c.dims(), q.tp, o.layer_end - o.layer_begin, best.max_seq, kv_elem);
        const double activations = activation_bytes(c.dims(), q.tp, q.max_batch_tokens, act, o.last_stage);
        if (weights + kv + activations > largest) {
            largest = weights + kv + activations;
            best.stage = p, best.weights = weights, best.kv = kv, best.activations = activations;
        }
    }
    best.head = head;
    return best;
}

double int4_bytes_per_weight(const TensorSource& src, bool cpu_kquant) {
    ModelOptions o;
    o.quant = QuantMode::kW4A8;
    const RankWeights rw(src, o);
    double bytes = 0, weights = 0;
    for (const RankTensor& t : rw.tensors())
        if (t.layer >= 0 && t.is_linear() && is_int4(t.mode)) {
            bytes += RankWeights::tensor_bytes(t, {.cpu_kquant = cpu_kquant});
            weights += double(t.rows) * double(t.cols);
        }
    return weights > 0 ? bytes / weights : 0;
}

}  // namespace lattice
