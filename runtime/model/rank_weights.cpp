// RankWeights (see rank_weights.h): the plan of one rank's tensors and their reads.
#include "runtime/model/rank_weights.h"

#include <cmath>
#include <cstring>
#include <numeric>

#include "base/error.h"
#include "kernels/common/int4_quantize.h"
#include "kernels/common/quantize.h"
#include "runtime/arch/architecture.h"
#include "runtime/weights/dequant.h"

namespace lattice {

namespace {

constexpr char kScale[] = "_scale";  // == kScaleSuffix of runtime/weights/manifest.h

DType keep_dtype(DType t) {
    return (t == DType::kF32 || t == DType::kF16 || t == DType::kBF16) ? t : DType::kF32;
}

// Rows of several host tensors stacked (q | k | v, gate | up); mixed dtypes widen to f32.
HostTensor concat_rows(std::vector<HostTensor>& parts) {
    DType dt = parts[0].dtype;
    for (auto& p : parts)
        if (p.dtype != dt) dt = DType::kF32;
    HostTensor out;
    out.dtype = dt;
    out.cols = parts[0].cols;
    for (auto& p : parts) out.rows += p.rows;
    out.data.resize(size_t(out.rows * out.cols * dtype_size(dt)));
    uint8_t* dst = out.data.data();
    for (auto& p : parts) {
        LATTICE_CHECK(p.cols == out.cols, "concat_rows: column mismatch {} vs {}", p.cols, out.cols);
        const int64_t n = p.rows * p.cols;
        convert_elements(p.data.data(), p.dtype, dst, dt, n);
        dst += n * dtype_size(dt);
        p.data = {};  // keep the peak near one fused tensor plus one part
    }
    return out;
}

// 4-bit parts stacked by rows (q | k | v, gate | up): the planner gave them one group and kind; an act-order
// permutation (the input channels' order) must be the same for all, as it is when one input Hessian ordered
// them (GPTQ).
Int4Weights concat_int4(std::vector<Int4Weights>& parts, const std::string& name) {
    Int4Weights out = std::move(parts[0]);
    for (size_t i = 1; i < parts.size(); ++i) {
        Int4Weights& p = parts[i];
        LATTICE_CHECK(p.k == out.k && p.group == out.group && p.kind == out.kind && p.perm == out.perm,
                      "\"{}\": its 4-bit parts differ in columns, group, kind or act-order permutation (g_idx), so "
                      "they cannot be fused; run with --quant w8a8 or w8a16",
                      name);
        out.n += p.n;
        out.qs.insert(out.qs.end(), p.qs.begin(), p.qs.end());
        out.d.insert(out.d.end(), p.d.begin(), p.d.end());
        out.m.insert(out.m.end(), p.m.begin(), p.m.end());
        out.z.insert(out.z.end(), p.z.begin(), p.z.end());
        p = Int4Weights{};
    }
    return out;
}

int64_t int4_bytes(const Int4Weights& w) {
    return int64_t(w.qs.size() + 2 * (w.d.size() + w.m.size()) + w.z.size() + 4 * w.perm.size());
}

}  // namespace

RankWeights::RankWeights(const TensorSource& src, const ModelOptions& opt) : src_(src), opt_(opt) {
    const ModelConfig& c = src.config();
    if (opt_.layer_end < 0) opt_.layer_end = c.n_layers;
    shard_ = shard_shape(c.dims(), opt_.tp, opt_.tp_rank);
    const int64_t H = c.hidden, hd = c.head_dim;
    const ShardShape& s = shard_;
    const QuantMode head_mode = opt_.quant_head ? opt_.quant : QuantMode::kNone;
    const bool qkv_bias = architecture_of(c).qkv_bias;
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
                   role == WeightRole::kBqkv;
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
        add(WeightRole::kWo, l, PreparedNames::wo(l), H, s.n_heads * hd, opt_.quant);
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
    auto plan_linear = [&](RankTensor& t, std::initializer_list<TensorRole> roles, int64_t layer, bool folded) {
        const TensorInfo& first = src_.info(tensor_name(c, *roles.begin(), layer, t.expert));
        bool same_kept = true, int4 = first.int4_group > 0 && !folded && is_int4(t.mode);
        for (TensorRole r : roles) {
            stored(r, layer, t.expert);
            const TensorInfo& ti = src_.info(tensor_name(c, r, layer, t.expert));
            same_kept &= keep_dtype(ti.dtype) == keep_dtype(first.dtype);
            int4 &=
                ti.int4_group == first.int4_group && ti.int4_kind == first.int4_kind && ti.int4_perm == first.int4_perm;
        }
        t.int4 = int4;
        t.int4_group = int4 ? first.int4_group : 0;
        t.int4_kind = first.int4_kind;
        t.int4_perm = int4 && first.int4_perm;
        t.dtype = int4 ? DType::kU8 : same_kept && !folded ? keep_dtype(first.dtype) : DType::kF32;
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

HostTensor RankWeights::read_rows(const std::string& name, int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                                  DType dtype) {
    HostTensor h;
    h.dtype = dtype;
    h.rows = rows;
    h.cols = cols;
    h.data.resize(size_t(dtype_bytes(dtype, rows * cols)));
    src_.read(name, row0, rows, col0, cols, dtype, h.data.data());
    bytes_read_ += dtype_bytes(src_.info(name).dtype, rows * cols);
    return h;
}

HostTensor RankWeights::read(const RankTensor& t) {
    HostTensor h;
    if (src_.prepared() && t.int4) {  // stored as this rank holds it: nothing sliced, fused or rounded
        h.dtype = DType::kU8;
        h.q4 = src_.read_int4(t.name, 0, t.rows, 0, t.cols);
        h.rows = h.q4.n;
        h.cols = h.q4.k;
        bytes_read_ += int4_bytes(h.q4);
        return h;
    }
    if (src_.prepared()) {
        h = read_rows(t.name, 0, t.rows, 0, t.cols, t.dtype);
        if (t.dtype == DType::kI8) {
            h.scales.resize(size_t(t.rows));
            src_.read(t.name + kScale, 0, 1, 0, t.rows, DType::kF32, h.scales.data());
            bytes_read_ += t.rows * int64_t(sizeof(float));
        }
        h.vector = t.vector;
        return h;
    }
    if (t.int4) return read_int4(t);
    const ModelConfig& c = src_.config();
    const int64_t H = c.hidden, hd = c.head_dim;
    const ShardShape& s = shard_;
    const int64_t l = t.layer;
    // Parts of a linear planned as raw 4-bit blocks are read as blocks; everything else as float.
    auto part_dtype = [&](const std::string& name) { return keep_dtype(src_.info(name).dtype); };
    auto rows_of = [&](TensorRole role, int64_t row0, int64_t rows) {
        const std::string name = tensor_name(c, role, l, t.expert);
        return read_rows(name, row0, rows, 0, H, part_dtype(name));
    };
    // Entries [col0, col0 + n) of a 1-D tensor (a bias slice), as f32.
    auto entries_of = [&](TensorRole role, int64_t col0, int64_t n) {
        HostTensor b = read_rows(tensor_name(c, role, l), 0, 1, col0, n, DType::kF32);
        b.rows = 1;
        return b;
    };
    auto fold = [&](HostTensor& w, int which) {
        if (const auto* f = smooth_of(l, which)) fold_smooth_columns(w.data, w.dtype, w.rows, w.cols, *f);
    };
    switch (t.role) {
        case WeightRole::kEmbed:
            h = rows_of(TensorRole::kEmbed, s.vocab0, s.vocab_rows);
            break;
        case WeightRole::kLmHead:
            h = rows_of(c.tie_embeddings ? TensorRole::kEmbed : TensorRole::kLmHead, s.vocab0, s.vocab_rows);
            break;
        case WeightRole::kFinalNorm:
        case WeightRole::kAttnNorm:
        case WeightRole::kFfnNorm: {
            const TensorRole role = t.role == WeightRole::kAttnNorm  ? TensorRole::kAttnNorm
                                    : t.role == WeightRole::kFfnNorm ? TensorRole::kFfnNorm
                                                                     : TensorRole::kFinalNorm;
            h = read_rows(tensor_name(c, role, l), 0, 1, 0, H, DType::kF32);
            const auto* f = t.role == WeightRole::kAttnNorm  ? smooth_of(l, kSmoothAttn)
                            : t.role == WeightRole::kFfnNorm ? smooth_of(l, kSmoothMlp)
                                                             : nullptr;
            if (f) fold_smooth_norm(reinterpret_cast<float*>(h.data.data()), H, *f);
            break;
        }
        case WeightRole::kBqkv: {
            // The rank's slice of each bias, like the rows of its weight (column-parallel); SmoothQuant
            // scales the activation's columns, not the outputs, so the bias takes no factor.
            HostTensor q = entries_of(TensorRole::kBq, s.head0 * hd, s.n_heads * hd);
            HostTensor k = entries_of(TensorRole::kBk, s.kv_head0 * hd, s.n_kv * hd);
            HostTensor v = entries_of(TensorRole::kBv, s.kv_head0 * hd, s.n_kv * hd);
            h.dtype = DType::kF32;
            h.rows = 1;
            h.cols = q.cols + k.cols + v.cols;
            for (HostTensor* p : {&q, &k, &v}) h.data.insert(h.data.end(), p->data.begin(), p->data.end());
            break;
        }
        case WeightRole::kWqkv: {
            std::vector<HostTensor> parts;
            parts.push_back(rows_of(TensorRole::kWq, s.head0 * hd, s.n_heads * hd));
            parts.push_back(rows_of(TensorRole::kWk, s.kv_head0 * hd, s.n_kv * hd));
            parts.push_back(rows_of(TensorRole::kWv, s.kv_head0 * hd, s.n_kv * hd));
            h = concat_rows(parts);
            fold(h, kSmoothAttn);
            break;
        }
        case WeightRole::kWo: {
            const std::string o = tensor_name(c, TensorRole::kWo, l);
            h = read_rows(o, 0, H, s.head0 * hd, s.n_heads * hd, part_dtype(o));
            break;
        }
        case WeightRole::kWGateUp: {
            std::vector<HostTensor> parts;
            parts.push_back(rows_of(TensorRole::kWGate, s.ffn0, s.ffn));
            parts.push_back(rows_of(TensorRole::kWUp, s.ffn0, s.ffn));
            h = concat_rows(parts);
            fold(h, kSmoothMlp);
            break;
        }
        case WeightRole::kWDown:
        case WeightRole::kExpDown: {
            const TensorRole role = t.role == WeightRole::kWDown ? TensorRole::kWDown : TensorRole::kExpDown;
            const std::string d = tensor_name(c, role, l, t.expert);
            h = read_rows(d, 0, H, s.ffn0, s.ffn, part_dtype(d));
            break;
        }
        case WeightRole::kRouter:
            // Replicated; SmoothQuant divides the MLP input's columns by s, so the router, which reads
            // the same input, takes s into its columns like gate/up.
            h = rows_of(TensorRole::kRouter, 0, c.n_experts);
            fold(h, kSmoothMlp);
            break;
        case WeightRole::kExpGateUp: {
            std::vector<HostTensor> parts;
            parts.push_back(rows_of(TensorRole::kExpGate, s.ffn0, s.ffn));
            parts.push_back(rows_of(TensorRole::kExpUp, s.ffn0, s.ffn));
            h = concat_rows(parts);
            fold(h, kSmoothMlp);
            break;
        }
    }
    h.vector = t.vector;
    LATTICE_CHECK(h.dtype == t.dtype && h.rows == t.rows && h.cols == t.cols,
                  "RankWeights: \"{}\" read as {} [{}, {}], planned {} [{}, {}]", t.name, dtype_name(h.dtype), h.rows,
                  h.cols, dtype_name(t.dtype), t.rows, t.cols);
    return h;
}

// A linear planned in 4 bits: the rank's slices of its parts (as read()'s float path slices them), stacked.
HostTensor RankWeights::read_int4(const RankTensor& t) {
    const ModelConfig& c = src_.config();
    const int64_t H = c.hidden, hd = c.head_dim;
    const ShardShape& s = shard_;
    std::vector<Int4Weights> parts;
    auto part = [&](TensorRole role, int64_t row0, int64_t rows, int64_t col0, int64_t cols) {
        const std::string name = tensor_name(c, role, t.layer, t.expert);
        parts.push_back(src_.read_int4(name, row0, rows, col0, cols));
        bytes_read_ += int4_bytes(parts.back());
    };
    switch (t.role) {
        case WeightRole::kEmbed:
        case WeightRole::kLmHead:
            part(c.tie_embeddings ? TensorRole::kEmbed : TensorRole::kLmHead, s.vocab0, s.vocab_rows, 0, H);
            break;
        case WeightRole::kWqkv:
            part(TensorRole::kWq, s.head0 * hd, s.n_heads * hd, 0, H);
            part(TensorRole::kWk, s.kv_head0 * hd, s.n_kv * hd, 0, H);
            part(TensorRole::kWv, s.kv_head0 * hd, s.n_kv * hd, 0, H);
            break;
        case WeightRole::kWo:
            part(TensorRole::kWo, 0, H, s.head0 * hd, s.n_heads * hd);
            break;
        case WeightRole::kWGateUp:
            part(TensorRole::kWGate, s.ffn0, s.ffn, 0, H);
            part(TensorRole::kWUp, s.ffn0, s.ffn, 0, H);
            break;
        case WeightRole::kWDown:
            part(TensorRole::kWDown, 0, H, s.ffn0, s.ffn);
            break;
        case WeightRole::kExpGateUp:
            part(TensorRole::kExpGate, s.ffn0, s.ffn, 0, H);
            part(TensorRole::kExpUp, s.ffn0, s.ffn, 0, H);
            break;
        case WeightRole::kExpDown:
            part(TensorRole::kExpDown, 0, H, s.ffn0, s.ffn);
            break;
        default:
            LATTICE_FAIL("RankWeights: \"{}\" is not a linear and has no 4-bit form", t.name);
    }
    HostTensor h;
    h.dtype = DType::kU8;
    h.q4 = concat_int4(parts, t.name);
    h.rows = h.q4.n;
    h.cols = h.q4.k;
    LATTICE_CHECK(h.rows == t.rows && h.cols == t.cols && h.q4.group == t.int4_group,
                  "RankWeights: \"{}\" read as 4-bit [{}, {}] in groups of {}, planned [{}, {}] in groups of {}",
                  t.name, h.rows, h.cols, h.q4.group, t.rows, t.cols, t.int4_group);
    return h;
}

double RankWeights::resident_bytes(bool cuda) const {
    double w = 0;
    for (const RankTensor& t : tensors_) {
        const double n = double(t.rows) * double(t.cols);
        if (t.is_linear() && is_int4(t.mode)) {
            // kernels/cpu/int4_gemm.h: per channel and group G / 2 bytes of nibbles, an f16 d, and an f16 m or a
            // zero point (+ a pad byte) except for offset8; channels padded to 16. Float weights: affine G = 32.
            // CUDA (kernels/cuda/int4_gemm.h): the same bytes per group (a zero point as f16), channels unpadded.
            const int64_t g = t.int4 ? t.int4_group : 32;
            const double extra = t.int4 && t.int4_kind == Int4Kind::kOffset8 ? 0 : 2;
            const int64_t rows = cuda ? t.rows : (t.rows + 15) / 16 * 16;
            w += double(rows) * double((t.cols + g - 1) / g) * (double(g) / 2 + 2 + extra);
        } else if (t.is_linear() && t.mode != QuantMode::kNone) {
            w += n + 8.0 * double(t.rows);
        } else
            w += n * double(cuda && !t.vector ? 2 : dtype_size(t.dtype));
    }
    return w;
}

HostTensor quantize_per_channel(const HostTensor& w, const std::string& name) {
    LATTICE_CHECK(w.dtype == DType::kF32 || w.dtype == DType::kF16 || w.dtype == DType::kBF16,
                  "quantize \"{}\": dtype {} is not float", name, dtype_name(w.dtype));
    HostTensor q;
    q.dtype = DType::kI8;
    q.rows = w.rows;
    q.cols = w.cols;
    q.vector = w.vector;
    q.data.resize(size_t(w.rows * w.cols));
    q.scales.resize(size_t(w.rows));
    std::vector<float> row(size_t(w.cols));
    const int64_t es = dtype_size(w.dtype);
    for (int64_t i = 0; i < w.rows; ++i) {
        convert_elements(w.data.data() + i * w.cols * es, w.dtype, row.data(), DType::kF32, w.cols);
        for (int64_t j = 0; j < w.cols; ++j)
            LATTICE_CHECK(std::isfinite(row[size_t(j)]), "quantize \"{}\": non-finite weight {} at [{}, {}]", name,
                          row[size_t(j)], i, j);
        q.scales[size_t(i)] =
            quantize_row_int8(row.data(), w.cols, reinterpret_cast<int8_t*>(q.data.data()) + i * w.cols);
    }
    return q;
}

HostTensor quantize_int4(const HostTensor& w, const std::string& name) {
    if (w.int4()) return w;
    LATTICE_CHECK(w.dtype == DType::kF32 || w.dtype == DType::kF16 || w.dtype == DType::kBF16,
                  "quantize \"{}\" to 4 bits: dtype {} is not float", name, dtype_name(w.dtype));
    std::vector<float> f(size_t(w.rows * w.cols));
    convert_elements(w.data.data(), w.dtype, f.data(), DType::kF32, w.rows * w.cols);
    HostTensor q;
    q.dtype = DType::kU8;
    q.rows = w.rows;
    q.cols = w.cols;
    try {
        q.q4 = quantize_weights_int4(f.data(), w.rows, w.cols, kInt4Block);
    } catch (const Error& e) {
        LATTICE_FAIL("quantize \"{}\" to 4 bits: {}", name, e.message());
    }
    return q;
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
