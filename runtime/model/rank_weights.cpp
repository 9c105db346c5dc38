// RankWeights (see rank_weights.h): the plan of one rank's tensors (which tensors, their shapes,
// dtypes and quantization modes) and its resident-bytes estimate; the reads are rank_weights_read.cpp.
#include "runtime/model/rank_weights.h"

#include <cmath>
#include <cstring>
#include <numeric>

#include "base/error.h"
#include "kernels/common/int4_quantize.h"
#include "kernels/common/quantize.h"
#include "runtime/arch/architecture.h"
#include "runtime/model/rank_weights_internal.h"
#include "runtime/weights/dequant.h"

namespace lattice {

using rank_weights_internal::extra_norm_role;
using rank_weights_internal::is_extra_norm;
using rank_weights_internal::keep_dtype;
using rank_weights_internal::kScale;

RankWeights::RankWeights(const TensorSource& src, const ModelOptions& opt) : src_(src), opt_(opt) {
    const ModelConfig& c = src.config();
    if (opt_.layer_end < 0) opt_.layer_end = c.n_layers;
    shard_ = shard_shape(c.dims(), opt_.tp, opt_.tp_rank);
    const int64_t H = c.hidden, hd = c.head_dim;
    const ShardShape& s = shard_;
    const QuantMode head_mode = opt_.quant_head ? opt_.quant : QuantMode::kNone;
    const Architecture& arch = architecture_of(c);
    const bool qkv_bias = arch.qkv_bias;
    auto add = [&](WeightRole role, int64_t layer, std::string name, int64_t rows, int64_t cols, QuantMode mode,
                   int64_t expert = -1) {
        RankTensor t;
        t.role = role;
        t.layer = layer;
        t.expert = expert;
        t.name = std::move(name);
        t.rows = rows;
        t.cols = cols;
        t.vector = role == WeightRole::kFinalNorm || role == WeightRole::kAttnNorm || role == WeightRole::kFfnNorm ||
                   role == WeightRole::kBqkv || is_extra_norm(role);
        t.mode = mode;
        tensors_.push_back(std::move(t));
    };
    const bool tied_float_head = opt_.last_stage && c.tie_embeddings && head_mode == QuantMode::kNone;
    if (opt_.first_stage || tied_float_head) {
        add(WeightRole::kEmbed, -1, PreparedNames::embed(), s.vocab_rows, H, QuantMode::kNone);
        tensors_.back().table = opt_.first_stage;
        tensors_.back().tied_head = tied_float_head;
    }
    if (opt_.last_stage) {
        if (!tied_float_head) add(WeightRole::kLmHead, -1, PreparedNames::lm_head(), s.vocab_rows, H, head_mode);
        add(WeightRole::kFinalNorm, -1, PreparedNames::final_norm(), 1, H, QuantMode::kNone);
    }
    for (int64_t l = opt_.layer_begin; l < opt_.layer_end; ++l) {
        add(WeightRole::kAttnNorm, l, PreparedNames::attn_norm(l), 1, H, QuantMode::kNone);
        add(WeightRole::kWqkv, l, PreparedNames::wqkv(l), (s.n_heads + 2 * s.n_kv) * hd, H, opt_.quant);
        if (qkv_bias) add(WeightRole::kBqkv, l, PreparedNames::bqkv(l), 1, (s.n_heads + 2 * s.n_kv) * hd, QuantMode::kNone);
        if (arch.qk_norm) {
            add(WeightRole::kQNorm, l, PreparedNames::q_norm(l), 1, hd, QuantMode::kNone);
            add(WeightRole::kKNorm, l, PreparedNames::k_norm(l), 1, hd, QuantMode::kNone);
        }
        add(WeightRole::kWo, l, PreparedNames::wo(l), H, s.n_heads * hd, opt_.quant);
        if (arch.sandwich_norms) {
            add(WeightRole::kPostAttnNorm, l, PreparedNames::post_attn_norm(l), 1, H, QuantMode::kNone);
            add(WeightRole::kPostFfnNorm, l, PreparedNames::post_ffn_norm(l), 1, H, QuantMode::kNone);
        }
        add(WeightRole::kFfnNorm, l, PreparedNames::ffn_norm(l), 1, H, QuantMode::kNone);
        if (!c.is_moe()) {
            add(WeightRole::kWGateUp, l, PreparedNames::w_gate_up(l), 2 * s.ffn, H, opt_.quant);
            add(WeightRole::kWDown, l, PreparedNames::w_down(l), H, s.ffn, opt_.quant);
            continue;
        }
        add(WeightRole::kRouter, l, PreparedNames::router(l), c.n_experts, H, QuantMode::kNone);
        for (int64_t e = 0; e < c.n_experts; ++e) {
            add(WeightRole::kExpGateUp, l, PreparedNames::expert_gate_up(l, e), 2 * s.ffn, H, opt_.quant, e);
            add(WeightRole::kExpDown, l, PreparedNames::expert_down(l, e), H, s.ffn, opt_.quant, e);
        }
    }
    if (src.prepared())
        plan_prepared();
    else
        plan_original();
}

void RankWeights::plan_original() {
    const ModelConfig& c = src_.config();
    const int64_t H = c.hidden;
    // The tensor's dtype as stored (checked against the config's shape first).
    auto stored = [&](TensorRole role, int64_t layer, int64_t expert = -1) {
        const std::string name = tensor_name(c, role, layer, expert);
        const std::vector<int64_t> expect = tensor_shape(c, role);
        const TensorInfo& ti = src_.info(name);
        LATTICE_CHECK(ti.shape == expect, "{}: tensor \"{}\" has shape {}, expected {} from the config", ti.file, name,
                      shape_string(ti.shape), shape_string(expect));
        return ti.dtype;
    };
    auto check_role = [&](TensorRole role, int64_t layer, int64_t expert = -1) {
        return keep_dtype(stored(role, layer, expert));
    };
    // A linear of a 4-bit run whose parts are all stored in 4 bits alike (group, kind, act-order or not) is
    // read in its 4-bit form (read_int4: nothing dequantized or rounded again); any other linear as float
    // (kept, or widened to f32 when parts differ or SmoothQuant is folded in), which the backend quantizes.
    // A GGUF Q6_K part counts as affine groups of 32 (TensorInfo::int4_requant: re-quantized, its super-blocks
    // kept beside for the CPU's W4A8), so a Q4_K_M linear with Q6_K parts is read in its 4-bit form too.
    // Rows of a fused linear's part in this rank's slice (read_int4's).
    auto part_rows = [&](TensorRole r) {
        return r == TensorRole::kWq ? shard_.n_heads * c.head_dim
               : r == TensorRole::kWk || r == TensorRole::kWv ? shard_.n_kv * c.head_dim
                                                              : shard_.ffn;
    };
    auto group_of = [](const TensorInfo& ti) { return ti.int4_requant ? int64_t(32) : ti.int4_group; };
    auto plan_linear = [&](RankTensor& t, std::initializer_list<TensorRole> roles, int64_t layer, bool folded) {
        const TensorInfo& first = src_.info(tensor_name(c, *roles.begin(), layer, t.expert));
        bool same_kept = true, int4 = group_of(first) > 0 && !folded && is_int4(t.mode);
        for (TensorRole r : roles) {
            stored(r, layer, t.expert);
            const TensorInfo& ti = src_.info(tensor_name(c, r, layer, t.expert));
            same_kept &= keep_dtype(ti.dtype) == keep_dtype(first.dtype);
            int4 &= group_of(ti) == group_of(first) && ti.int4_kind == first.int4_kind &&
                    ti.int4_perm == first.int4_perm;
        }
        t.int4 = int4;
        t.int4_group = int4 ? group_of(first) : 0;
        t.int4_kind = first.int4_kind;
        t.int4_perm = int4 && first.int4_perm;
        t.dtype = int4 ? DType::kU8 : same_kept && !folded ? keep_dtype(first.dtype) : DType::kF32;
        t.kq_parts.clear();
        for (TensorRole r : roles) {  // the parts read_int4 stacks, as rank_weights_read.cpp slices them
            const DType d = src_.info(tensor_name(c, r, layer, t.expert)).dtype;
            if (int4 && (d == DType::kQ4_K || d == DType::kQ6_K))
                t.kq_parts.emplace_back(d, roles.size() == 1 ? t.rows : part_rows(r));
        }
        if (t.kq_parts.size() != roles.size()) t.kq_parts.clear();
    };
    // A row-parallel linear's column slice must keep whole blocks of a block-quantized tensor and, read in 4
    // bits, whole groups (and all of an act-order tensor's columns).
    auto check_column_split = [&](const RankTensor& t, TensorRole role, int64_t layer, int64_t col0, int64_t cols) {
        const std::string name = tensor_name(c, role, layer, t.expert);
        const TensorInfo& ti = src_.info(name);
        const int64_t g = std::max(dtype_block_elems(ti.dtype), t.int4 ? ti.int4_group : int64_t(1));
        LATTICE_CHECK(g == 1 || (col0 % g == 0 && cols % g == 0),
                      "{}: tensor \"{}\" is {} (groups of {} along its {} columns); tp {} gives rank {} columns [{}, "
                      "{}), which cuts a group: choose a tp that splits {} columns into multiples of {}",
                      ti.file, name,
                      t.int4 && ti.int4_group >= dtype_block_elems(ti.dtype) ? "4-bit" : dtype_name(ti.dtype), g,
                      ti.cols(), opt_.tp, opt_.tp_rank, col0, col0 + cols, ti.cols(), g);
        LATTICE_CHECK(!t.int4 || !ti.int4_perm || cols == ti.cols(),
                      "{}: tensor \"{}\" is 4-bit with act-order (GPTQ desc_act: its groups are spread over all {} "
                      "columns), which tp {} would split: run it with tp 1 along this dimension, or a checkpoint "
                      "without desc_act",
                      ti.file, name, ti.cols(), opt_.tp);
    };
    if (!opt_.smooth_path.empty()) smooth_ = read_smooth_factors(opt_.smooth_path, H, opt_.layer_begin, opt_.layer_end);
    const bool smooth = !opt_.smooth_path.empty();
    for (RankTensor& t : tensors_) {
        const int64_t l = t.layer;
        switch (t.role) {
            case WeightRole::kEmbed:
                t.dtype = check_role(TensorRole::kEmbed, -1);
                break;
            case WeightRole::kLmHead: {
                const TensorRole head = c.tie_embeddings ? TensorRole::kEmbed : TensorRole::kLmHead;
                // A 4-bit run keeps the head at 8 bits unless the checkpoint stores it in 4 (rank_weights.h).
                stored(head, -1);
                if (is_int4(t.mode) && src_.info(tensor_name(c, head, -1)).int4_group == 0)
                    t.mode = int8_counterpart(t.mode);
                plan_linear(t, {head}, -1, false);
                break;
            }
            case WeightRole::kFinalNorm:
                check_role(TensorRole::kFinalNorm, -1);
                t.dtype = DType::kF32;
                break;
            case WeightRole::kAttnNorm:
            case WeightRole::kFfnNorm:
                check_role(t.role == WeightRole::kAttnNorm ? TensorRole::kAttnNorm : TensorRole::kFfnNorm, l);
                t.dtype = DType::kF32;
                break;
            case WeightRole::kQNorm:
            case WeightRole::kKNorm:
            case WeightRole::kPostAttnNorm:
            case WeightRole::kPostFfnNorm:
                check_role(extra_norm_role(t.role), l);
                t.dtype = DType::kF32;
                break;
            case WeightRole::kBqkv:
                check_role(TensorRole::kBq, l);
                check_role(TensorRole::kBk, l);
                check_role(TensorRole::kBv, l);
                t.dtype = DType::kF32;
                break;
            case WeightRole::kWqkv:
                plan_linear(t, {TensorRole::kWq, TensorRole::kWk, TensorRole::kWv}, l, smooth);
                break;
            case WeightRole::kWo:
                plan_linear(t, {TensorRole::kWo}, l, false);
                check_column_split(t, TensorRole::kWo, l, shard_.head0 * c.head_dim, shard_.n_heads * c.head_dim);
                break;
            case WeightRole::kWGateUp:
                plan_linear(t, {TensorRole::kWGate, TensorRole::kWUp}, l, smooth);
                break;
            case WeightRole::kWDown:
                plan_linear(t, {TensorRole::kWDown}, l, false);
                check_column_split(t, TensorRole::kWDown, l, shard_.ffn0, shard_.ffn);
                break;
            case WeightRole::kRouter: {
                const DType d = check_role(TensorRole::kRouter, l);
                t.dtype = smooth ? DType::kF32 : d;
                break;
            }
            case WeightRole::kExpGateUp:
                plan_linear(t, {TensorRole::kExpGate, TensorRole::kExpUp}, l, smooth);
                break;
            case WeightRole::kExpDown:
                plan_linear(t, {TensorRole::kExpDown}, l, false);
                check_column_split(t, TensorRole::kExpDown, l, shard_.ffn0, shard_.ffn);
                break;
        }
    }
}

void RankWeights::plan_prepared() {
    const PreparedLayout& p = *src_.prepared();
    const std::string& f = p.folder;
    // The file must be this rank's: same TP shard, same layers, same quantization.
    const WorldConfig w = p.world();
    const auto [begin, end] = stage_layer_range(src_.config().n_layers, p.pp, w.pp_rank(), p.stage_layers);
    LATTICE_CHECK(
        p.tp == opt_.tp && w.tp_rank() == opt_.tp_rank && begin == opt_.layer_begin && end == opt_.layer_end &&
            w.is_first_stage() == opt_.first_stage && w.is_last_stage() == opt_.last_stage,
        "{}: holds rank {} of {} (tp rank {}, layers [{}, {})), but this rank loads tp rank {} of {} with "
        "layers [{}, {}): load it with the layout it was converted for",
        f, p.rank, p.describe(), w.tp_rank(), begin, end, opt_.tp_rank, opt_.tp, opt_.layer_begin, opt_.layer_end);
    LATTICE_CHECK(
        p.quant == quant_mode_name(opt_.quant) && p.quant_head == opt_.quant_head,
        "{}: converted with --quant {}{}; this load asks for {}{}: use --quant auto (or the same quantization)", f,
        p.quant, p.quant_head ? " --quant-head" : "", quant_mode_name(opt_.quant),
        opt_.quant_head ? " --quant-head" : "");
    LATTICE_CHECK(opt_.smooth_path.empty(),
                  "{}: SmoothQuant factors are folded in at conversion ({}); drop --smooth {}", f,
                  p.smooth.empty() ? "this one was converted without any" : "from " + p.smooth, opt_.smooth_path);
    for (RankTensor& t : tensors_) {
        LATTICE_CHECK(src_.has(t.name), "{}: tensor \"{}\" missing from rank {}'s file", f, t.name, p.rank);
        const TensorInfo& ti = src_.info(t.name);
        const std::vector<int64_t> want =
            t.vector ? std::vector<int64_t>{t.cols} : std::vector<int64_t>{t.rows, t.cols};
        LATTICE_CHECK(ti.shape == want, "{}: tensor \"{}\" has shape {}, rank {} needs {}", ti.file, t.name,
                      shape_string(ti.shape), p.rank, shape_string(want));
        t.dtype = ti.dtype;
        // A 4-bit run's LM head is 8-bit unless the checkpoint held it in 4 bits (plan_original): the file says
        // which.
        if (t.role == WeightRole::kLmHead && is_int4(t.mode) && ti.dtype == DType::kI8)
            t.mode = int8_counterpart(t.mode);
        if (!t.vector && is_int4(t.mode)) {
            LATTICE_CHECK(ti.int4_group > 0, "{}: tensor \"{}\" must be 4-bit for quant {}, is {}", ti.file, t.name,
                          quant_mode_name(t.mode), dtype_name(ti.dtype));
            t.int4 = true;
            t.int4_group = ti.int4_group;
            t.int4_kind = ti.int4_kind;
            t.int4_perm = ti.int4_perm;
            continue;
        }
        LATTICE_CHECK(ti.int4_group == 0, "{}: tensor \"{}\" is 4-bit but this rank runs it with quant {}", ti.file,
                      t.name, quant_mode_name(t.mode));
        if (t.vector) {
            LATTICE_CHECK(ti.dtype == DType::kF32, "{}: tensor \"{}\" must be f32, is {}", ti.file, t.name,
                          dtype_name(ti.dtype));
        } else if (t.mode != QuantMode::kNone) {
            LATTICE_CHECK(ti.dtype == DType::kI8, "{}: tensor \"{}\" must be i8 for quant {}, is {}", ti.file, t.name,
                          quant_mode_name(t.mode), dtype_name(ti.dtype));
            const std::string sn = t.name + kScale;
            LATTICE_CHECK(src_.has(sn) && src_.info(sn).dtype == DType::kF32 &&
                              src_.info(sn).shape == std::vector<int64_t>{t.rows},
                          "{}: int8 tensor \"{}\" needs f32 scales \"{}\" [{}]", ti.file, t.name, sn, t.rows);
        } else {
            LATTICE_CHECK(ti.dtype != DType::kI8, "{}: tensor \"{}\" is i8 but quant is none", ti.file, t.name);
        }
    }
}

const std::vector<float>* RankWeights::smooth_of(int64_t layer, int which) const {
    if (opt_.smooth_path.empty()) return nullptr;
    const size_t i = size_t(layer - smooth_.layer_begin);
    return which == kSmoothAttn ? &smooth_.attn[i] : &smooth_.mlp[i];
}

namespace {
// The K-quant layout's bytes of t (kernels/cpu/int4_gemm.h), or -1 where pack_int4_weights would pack the group
// form: parts all Q4_K / Q6_K, 256-column super-blocks, no act-order, every part but the last whole panels.
double kquant_bytes(const RankTensor& t) {
    if (t.kq_parts.empty() || t.cols % 256 != 0 || t.int4_perm) return -1;
    double b = 0;
    for (size_t i = 0; i < t.kq_parts.size(); ++i) {
        const auto& [type, rows] = t.kq_parts[i];
        if (type != DType::kQ4_K && type != DType::kQ6_K) return -1;
        if (i + 1 < t.kq_parts.size() && rows % 16 != 0) return -1;
        b += double((rows + 15) / 16) * double(t.cols / 256) * (type == DType::kQ6_K ? 3392 : 2304);
    }
    return b;
}
}  // namespace

double RankWeights::resident_bytes(const Holder& h) const {
    double w = 0;
    for (const RankTensor& t : tensors_) w += tensor_bytes(t, h);
    return w;
}

bool RankWeights::kquant_packed(const RankTensor& t, bool cpu_kquant) {
    return cpu_kquant && t.mode == QuantMode::kW4A8 && t.int4 && kquant_bytes(t) >= 0;
}

double RankWeights::tensor_bytes(const RankTensor& t, const Holder& h) {
    const double n = double(t.rows) * double(t.cols);
    if (!h.cuda && h.cpu_bf16 && t.is_linear() && t.mode == QuantMode::kNone && !t.vector) {
        if (!t.tied_head) return h.cpu_bf16(t.rows, t.cols);
        const bool shared = t.dtype == DType::kBF16 || !t.table;  // the head's rows serve as the table too
        return n * 2 + (shared ? 0 : n * double(dtype_size(t.dtype)));
    }
    if (!h.cuda && kquant_packed(t, h.cpu_kquant)) return kquant_bytes(t);
    if (t.is_linear() && is_int4(t.mode)) {
        // kernels/cpu/int4_gemm.h: per channel and group G / 2 bytes of nibbles, an f16 d, and an f16 m or a
        // zero point (+ a pad byte) except for offset8; channels padded to 16. Float weights: affine G = 32.
        // CUDA (kernels/cuda/int4_gemm.h): the same bytes per group (a zero point as f16), channels unpadded.
        const int64_t g = t.int4 ? t.int4_group : 32;
        const double extra = t.int4 && t.int4_kind == Int4Kind::kOffset8 ? 0 : 2;
        const int64_t rows = h.cuda ? t.rows : (t.rows + 15) / 16 * 16;
        return double(rows) * double((t.cols + g - 1) / g) * (double(g) / 2 + 2 + extra);
    }
    if (t.is_linear() && t.mode != QuantMode::kNone)
        return n + 8.0 * double(t.rows) + (!h.cuda && h.cpu_w8a8_copy && t.mode == QuantMode::kW8A8 ? n : 0.0);
    return n * double(h.cuda && !t.vector ? 2 : dtype_size(t.dtype));
}

ModelOptions rank_model_options(ModelOptions base, const WorldConfig& world, int64_t n_layers,
                                const std::vector<int64_t>& pp_layer_counts) {
    const auto stages = stage_layer_ranges(n_layers, world.pp, pp_layer_counts);
    base.tp = world.tp;
    base.tp_rank = world.tp_rank();
    base.layer_begin = stages[size_t(world.pp_rank())].first;
    base.layer_end = stages[size_t(world.pp_rank())].second;
    base.first_stage = world.is_first_stage();
    base.last_stage = world.is_last_stage();
    return base;
}

}  // namespace lattice
