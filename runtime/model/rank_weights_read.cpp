// RankWeights' reads (see rank_weights.h): each planned tensor read from the TensorSource as this rank
// holds it (sliced, fused q | k | v and gate | up, SmoothQuant folded, 4-bit parts stacked), and the
// host-side quantizers (int8 per channel, 4-bit) that the loader and `lattice convert` apply to them.
// The plan itself is rank_weights.cpp. Invariants: every read returns exactly the dtype and shape the
// plan recorded (checked, an Error otherwise); bytes_read_ counts the bytes taken from the source;
// a fused linear's parts of one dtype are read straight into its rows (mixed dtypes: parts released as they
// are fused, so the peak stays near one fused tensor plus one part); the read buffer is reused across tensors
// (recycle), so a load writes fresh pages for its largest float tensor, not for every one.
#include <cmath>
#include <cstring>
#include <numeric>
#include <tuple>

#include "base/error.h"
#include "kernels/common/int4_quantize.h"
#include "kernels/common/quantize_rows.h"
#include "runtime/arch/architecture.h"
#include "runtime/model/rank_weights.h"
#include "runtime/model/rank_weights_internal.h"
#include "runtime/weights/dequant.h"

namespace lattice {

using rank_weights_internal::keep_dtype;
using rank_weights_internal::kScale;

namespace {

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
// them (GPTQ). K-quant super-blocks (Int4Weights::kq) stay only when every part has them.
Int4Weights concat_int4(std::vector<Int4Weights>& parts, const std::string& name) {
    bool kq = true;
    for (const Int4Weights& p : parts) kq &= !p.kq.empty();
    Int4Weights out = std::move(parts[0]);
    if (!kq) out.kq.clear();
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
        if (kq)
            for (Int4KQuantPart& part : p.kq) out.kq.push_back(std::move(part));
        p = Int4Weights{};
    }
    return out;
}

// Bytes read from the source: a K-quant's super-blocks, else the 4-bit form's arrays.
int64_t int4_bytes(const Int4Weights& w) {
    if (!w.kq.empty()) {
        int64_t b = 0;
        for (const Int4KQuantPart& p : w.kq) b += int64_t(p.blocks.size());
        return b;
    }
    return int64_t(w.qs.size() + 2 * (w.d.size() + w.m.size()) + w.z.size() + 4 * w.perm.size());
}

}  // namespace

void RankWeights::recycle(HostTensor&& h) {
    if (h.data.capacity() > spare_.capacity()) spare_ = std::move(h.data);
}

std::vector<uint8_t> RankWeights::take_buffer(size_t bytes) {
    std::vector<uint8_t> b = std::move(spare_);
    spare_ = {};
    b.clear();  // a buffer too small grows without copying its old contents
    b.resize(bytes);
    return b;
}

HostTensor RankWeights::read_rows(const std::string& name, int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                                  DType dtype) {
    HostTensor h;
    h.dtype = dtype;
    h.rows = rows;
    h.cols = cols;
    h.data = take_buffer(size_t(dtype_bytes(dtype, rows * cols)));
    src_.read(name, row0, rows, col0, cols, dtype, h.data.data());
    bytes_read_ += dtype_bytes(src_.info(name).dtype, rows * cols);
    return h;
}

HostTensor RankWeights::read(const RankTensor& t, bool cpu_kquant) {
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
    // An embedding's table is gathered from the group form (a tied head's linear shares its read): read whole.
    if (t.int4) return read_int4(t, t.role != WeightRole::kEmbed && kquant_packed(t, cpu_kquant));
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
    // The row ranges (role, first row, rows) of a fused linear's parts (q | k | v, gate | up) stacked: read
    // straight into their rows of one buffer when they share a dtype, so the fused matrix is written once (not
    // read into parts and copied: at load that copy was a second float matrix of every fused linear to fault in);
    // parts of mixed dtypes are read apart and widened (concat_rows).
    auto stacked = [&](std::initializer_list<std::tuple<TensorRole, int64_t, int64_t>> parts) {
        std::vector<std::string> names;
        bool same = true;
        HostTensor out;
        out.cols = H;
        for (const auto& [role, row0, rows] : parts) {
            names.push_back(tensor_name(c, role, l, t.expert));
            const DType dt = part_dtype(names.back());
            same &= names.size() == 1 || dt == out.dtype;
            out.dtype = dt;
            out.rows += rows;
        }
        if (!same) {
            std::vector<HostTensor> read_parts;
            for (const auto& [role, row0, rows] : parts) read_parts.push_back(rows_of(role, row0, rows));
            return concat_rows(read_parts);
        }
        out.data = take_buffer(size_t(dtype_bytes(out.dtype, out.rows * H)));
        uint8_t* dst = out.data.data();
        size_t i = 0;
        for (const auto& [role, row0, rows] : parts) {
            const std::string& name = names[i++];
            src_.read(name, row0, rows, 0, H, out.dtype, dst);
            bytes_read_ += dtype_bytes(src_.info(name).dtype, rows * H);
            dst += dtype_bytes(out.dtype, rows * H);
        }
        return out;
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
        case WeightRole::kQNorm:
        case WeightRole::kKNorm:
        case WeightRole::kPostAttnNorm:
        case WeightRole::kPostFfnNorm:
            h = read_rows(tensor_name(c, rank_weights_internal::extra_norm_role(t.role), l), 0, 1, 0, t.cols,
                          DType::kF32);
            break;
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
            h = stacked({{TensorRole::kWq, s.head0 * hd, s.n_heads * hd},
                         {TensorRole::kWk, s.kv_head0 * hd, s.n_kv * hd},
                         {TensorRole::kWv, s.kv_head0 * hd, s.n_kv * hd}});
            fold(h, kSmoothAttn);
            break;
        }
        case WeightRole::kWo: {
            const std::string o = tensor_name(c, TensorRole::kWo, l);
            h = read_rows(o, 0, H, s.head0 * hd, s.n_heads * hd, part_dtype(o));
            break;
        }
        case WeightRole::kWGateUp: {
            h = stacked({{TensorRole::kWGate, s.ffn0, s.ffn}, {TensorRole::kWUp, s.ffn0, s.ffn}});
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
            h = stacked({{TensorRole::kExpGate, s.ffn0, s.ffn}, {TensorRole::kExpUp, s.ffn0, s.ffn}});
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
HostTensor RankWeights::read_int4(const RankTensor& t, bool kquant_only) {
    const ModelConfig& c = src_.config();
    const int64_t H = c.hidden, hd = c.head_dim;
    const ShardShape& s = shard_;
    std::vector<Int4Weights> parts;
    auto part = [&](TensorRole role, int64_t row0, int64_t rows, int64_t col0, int64_t cols) {
        const std::string name = tensor_name(c, role, t.layer, t.expert);
        parts.push_back(kquant_only ? src_.read_kquant(name, row0, rows, col0, cols)
                                    : src_.read_int4(name, row0, rows, col0, cols));
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
    const std::string what = fmt::format("quantize \"{}\"", name);
    if (const int64_t bad = quantize_rows_int8(w.data.data(), w.dtype, w.cols, 0, w.rows,
                                               reinterpret_cast<int8_t*>(q.data.data()), q.scales.data());
        bad < w.rows)
        fail_non_finite_row(w.data.data(), w.dtype, w.cols, bad, what);
    return q;
}

HostTensor quantize_int4(const HostTensor& w, const std::string& name) {
    if (w.int4()) return w;
    LATTICE_CHECK(w.dtype == DType::kF32 || w.dtype == DType::kF16 || w.dtype == DType::kBF16,
                  "quantize \"{}\" to 4 bits: dtype {} is not float", name, dtype_name(w.dtype));
    HostTensor q;
    q.dtype = DType::kU8;
    q.rows = w.rows;
    q.cols = w.cols;
    try {
        q.q4 = quantize_weights_int4(w.data.data(), w.dtype, w.rows, w.cols, kInt4Block);
    } catch (const Error& e) {
        LATTICE_FAIL("quantize \"{}\" to 4 bits: {}", name, e.message());
    }
    return q;
}

}  // namespace lattice
