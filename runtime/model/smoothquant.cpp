// SmoothQuant factors: activation statistics, factor computation, file I/O and folding
// (see smoothquant.h for the math and the file format).
#include "runtime/model/smoothquant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "base/error.h"
#include "runtime/arch/architecture.h"
#include "runtime/model/model.h"
#include "runtime/weights/safetensors.h"

namespace lattice {

std::string smooth_tensor_name(int64_t layer, int which) {
    return "model.layers." + std::to_string(layer) + (which == kSmoothAttn ? ".attn_smooth" : ".mlp_smooth");
}

ActivationStats::ActivationStats(int64_t n_layers, int64_t hidden)
    : n_layers_(n_layers),
      hidden_(hidden),
      max_(size_t(n_layers * 2), std::vector<float>(size_t(hidden), 0.0f)),
      tokens_(size_t(n_layers * 2), 0) {
    LATTICE_CHECK(n_layers >= 1 && hidden >= 1, "ActivationStats: {} layers of {} channels", n_layers, hidden);
}

void ActivationStats::observe(int64_t layer, int which, const View& x) {
    LATTICE_CHECK(layer >= 0 && layer < n_layers_ && (which == kSmoothAttn || which == kSmoothMlp),
                  "ActivationStats: layer {} / input {} outside {} layers", layer, which, n_layers_);
    LATTICE_CHECK(x.device == Device::kCpu && x.dtype == DType::kF32 && x.is_contiguous() && x.cols() == hidden_,
                  "ActivationStats: layer {}: expected a host f32 [tokens, {}] activation, got {} {} (calibrate on "
                  "the CPU backend)",
                  layer, hidden_, dtype_name(x.dtype), x.shape_str());
    std::vector<float>& m = max_[size_t(layer * 2 + which)];
    const float* p = x.ptr<float>();
    const int64_t rows = x.rows();
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = p + r * hidden_;
        for (int64_t j = 0; j < hidden_; ++j) {
            const float a = std::fabs(row[j]);
            LATTICE_CHECK(std::isfinite(a),
                          "calibration: non-finite activation {} at layer {} {} input, token {}, "
                          "channel {}",
                          row[j], layer, which == kSmoothAttn ? "attention" : "MLP", r, j);
            m[size_t(j)] = std::max(m[size_t(j)], a);
        }
    }
    tokens_[size_t(layer * 2 + which)] += rows;
}

const std::vector<float>& ActivationStats::max_abs(int64_t layer, int which) const {
    LATTICE_CHECK(layer >= 0 && layer < n_layers_ && (which == kSmoothAttn || which == kSmoothMlp),
                  "ActivationStats: layer {} / input {} outside {} layers", layer, which, n_layers_);
    return max_[size_t(layer * 2 + which)];
}

int64_t ActivationStats::tokens_seen(int64_t layer, int which) const {
    max_abs(layer, which);  // range check
    return tokens_[size_t(layer * 2 + which)];
}

std::vector<float> smoothing_factors(const std::vector<float>& act_max, const std::vector<float>& w_max, double alpha) {
    LATTICE_CHECK(act_max.size() == w_max.size(), "smoothing_factors: {} activation vs {} weight channels",
                  act_max.size(), w_max.size());
    LATTICE_CHECK(alpha >= 0.0 && alpha <= 1.0, "SmoothQuant alpha {} outside [0, 1]", alpha);
    std::vector<float> s(act_max.size(), 1.0f);
    for (size_t j = 0; j < s.size(); ++j) {
        const double a = act_max[j], w = w_max[j];
        if (!(a > 0.0) || !(w > 0.0)) continue;  // dead channel: nothing to migrate
        const double v = std::pow(a, alpha) / std::pow(w, 1.0 - alpha);
        s[j] = float(std::clamp(v, double(kMinSmooth), double(kMaxSmooth)));
    }
    return s;
}

std::vector<float> weight_column_max(const TensorSource& src, const std::vector<std::string>& names, int64_t cols) {
    std::vector<float> m(size_t(cols), 0.0f);
    constexpr int64_t kChunkElems = 1 << 22;  // 16 MiB of f32 per read
    std::vector<float> buf;
    for (const std::string& name : names) {
        const TensorInfo& ti = src.info(name);
        LATTICE_CHECK(ti.shape.size() == 2 && ti.cols() == cols,
                      "{}: tensor \"{}\" has {} dims / {} columns, "
                      "expected [rows, {}]",
                      ti.file, name, ti.shape.size(), ti.cols(), cols);
        const int64_t rows = ti.rows();
        const int64_t chunk = std::max<int64_t>(1, kChunkElems / cols);
        for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
            const int64_t n = std::min(chunk, rows - r0);
            buf.resize(size_t(n * cols));
            src.read(name, r0, n, 0, cols, DType::kF32, buf.data());
            for (int64_t r = 0; r < n; ++r)
                for (int64_t j = 0; j < cols; ++j) {
                    const float a = std::fabs(buf[size_t(r * cols + j)]);
                    LATTICE_CHECK(std::isfinite(a), "{}: tensor \"{}\" has a non-finite value at [{}, {}]", ti.file,
                                  name, r0 + r, j);
                    m[size_t(j)] = std::max(m[size_t(j)], a);
                }
        }
    }
    return m;
}

SmoothFactors compute_smooth_factors(const TensorSource& src, const ActivationStats& stats, double alpha) {
    const ModelConfig& c = src.config();
    LATTICE_CHECK(stats.n_layers() == c.n_layers && stats.hidden() == c.hidden,
                  "compute_smooth_factors: statistics for {} layers x {} channels, model {} has {} x {}",
                  stats.n_layers(), stats.hidden(), src.describe(), c.n_layers, c.hidden);
    SmoothFactors f;
    f.hidden = c.hidden;
    f.layer_begin = 0;
    auto name = [&](int64_t l, TensorRole r) { return tensor_name(c, r, l); };
    for (int64_t l = 0; l < c.n_layers; ++l) {
        LATTICE_CHECK(stats.tokens_seen(l, kSmoothAttn) > 0 && stats.tokens_seen(l, kSmoothMlp) > 0,
                      "compute_smooth_factors: layer {} saw no calibration tokens", l);
        std::vector<float> wa =
            weight_column_max(src,
                              {name(l, TensorRole::kWq), name(l, TensorRole::kWk), name(l, TensorRole::kWv)},
                              c.hidden);
        // The MLP input feeds gate/up, or in a MoE layer the router and every expert's gate/up.
        std::vector<std::string> mlp_in;
        if (c.is_moe()) {
            mlp_in.push_back(name(l, TensorRole::kRouter));
            for (int64_t e = 0; e < c.n_experts; ++e)
                for (TensorRole r : {TensorRole::kExpGate, TensorRole::kExpUp})
                    mlp_in.push_back(tensor_name(c, r, l, e));
        } else {
            mlp_in = {name(l, TensorRole::kWGate), name(l, TensorRole::kWUp)};
        }
        std::vector<float> wm = weight_column_max(src, mlp_in, c.hidden);
        f.attn.push_back(smoothing_factors(stats.max_abs(l, kSmoothAttn), wa, alpha));
        f.mlp.push_back(smoothing_factors(stats.max_abs(l, kSmoothMlp), wm, alpha));
    }
    return f;
}

void write_smooth_factors(const std::string& path, const SmoothFactors& f) {
    LATTICE_CHECK(f.attn.size() == f.mlp.size(), "write_smooth_factors: {} attention vs {} MLP layers", f.attn.size(),
                  f.mlp.size());
    std::vector<TensorToWrite> t;
    for (size_t i = 0; i < f.attn.size(); ++i) {
        const int64_t l = f.layer_begin + int64_t(i);
        LATTICE_CHECK(int64_t(f.attn[i].size()) == f.hidden && int64_t(f.mlp[i].size()) == f.hidden,
                      "write_smooth_factors: layer {} factors are not [{}]", l, f.hidden);
        t.push_back({smooth_tensor_name(l, kSmoothAttn), DType::kF32, {f.hidden}, f.attn[i].data()});
        t.push_back({smooth_tensor_name(l, kSmoothMlp), DType::kF32, {f.hidden}, f.mlp[i].data()});
    }
    write_safetensors(path, t);
}

SmoothFactors read_smooth_factors(const std::string& path, int64_t hidden, int64_t layer_begin, int64_t layer_end) {
    SafetensorsFile file(path);
    SmoothFactors f;
    f.hidden = hidden;
    f.layer_begin = layer_begin;
    for (int64_t l = layer_begin; l < layer_end; ++l) {
        for (int which : {kSmoothAttn, kSmoothMlp}) {
            const std::string name = smooth_tensor_name(l, which);
            const SafetensorsEntry* e = file.find(name);
            LATTICE_CHECK(e != nullptr, "smoothing file {}: tensor \"{}\" is missing (calibrated for another model?)",
                          path, name);
            LATTICE_CHECK(e->dtype == DType::kF32 && e->shape == std::vector<int64_t>{hidden},
                          "smoothing file {}: tensor \"{}\" is {} with {} dims, expected F32 [{}]", path, name,
                          dtype_name(e->dtype), e->shape.size(), hidden);
            std::vector<float> v(static_cast<size_t>(hidden));
            std::memcpy(v.data(), file.bytes(*e), size_t(hidden) * sizeof(float));
            for (int64_t j = 0; j < hidden; ++j)
                LATTICE_CHECK(std::isfinite(v[size_t(j)]) && v[size_t(j)] >= kMinSmooth && v[size_t(j)] <= kMaxSmooth,
                              "smoothing file {}: tensor \"{}\" element {} = {} is outside [{}, {}]", path, name, j,
                              v[size_t(j)], kMinSmooth, kMaxSmooth);
            (which == kSmoothAttn ? f.attn : f.mlp).push_back(std::move(v));
        }
    }
    return f;
}

void fold_smooth_columns(std::vector<uint8_t>& bytes, DType& dtype, int64_t rows, int64_t cols,
                         const std::vector<float>& s) {
    LATTICE_CHECK(int64_t(s.size()) == cols, "fold_smooth_columns: {} factors for {} columns", s.size(), cols);
    LATTICE_CHECK(int64_t(bytes.size()) == dtype_bytes(dtype, rows * cols),
                  "fold_smooth_columns: {} bytes for {} x {} {}", bytes.size(), rows, cols, dtype_name(dtype));
    std::vector<uint8_t> out(size_t(rows * cols) * sizeof(float));
    convert_elements(bytes.data(), dtype, out.data(), DType::kF32, rows * cols);
    float* w = reinterpret_cast<float*>(out.data());
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < cols; ++j) w[r * cols + j] *= s[size_t(j)];
    bytes = std::move(out);
    dtype = DType::kF32;
}

void fold_smooth_norm(float* g, int64_t n, const std::vector<float>& s) {
    LATTICE_CHECK(int64_t(s.size()) == n, "fold_smooth_norm: {} factors for {} channels", s.size(), n);
    for (int64_t j = 0; j < n; ++j) g[j] /= s[size_t(j)];
}

ActivationStats collect_activation_stats(Model& model, const std::vector<int32_t>& ids, int64_t window) {
    const ModelConfig& c = model.config();
    const ModelOptions& o = model.options();
    LATTICE_CHECK(o.first_stage && o.last_stage && o.tp == 1, "calibration needs a single-rank model (tp 1, pp 1)");
    LATTICE_CHECK(o.quant == QuantMode::kNone && o.smooth_path.empty(),
                  "calibration needs the float model without smoothing (--quant none, no --smooth)");
    LATTICE_CHECK(!ids.empty(), "calibration: no tokens");
    window = std::min(window > 0 ? window : model.max_seq(), model.max_seq());
    ActivationStats stats(c.n_layers, c.hidden);
    model.set_observer([&stats](int64_t layer, int which, const View& x) { stats.observe(layer, which, x); });
    struct Reset {
        Model& m;
        ~Reset() { m.set_observer({}); }
    } reset{model};
    const int64_t T = int64_t(ids.size()), chunk = o.max_batch_tokens;
    // One sequence at a time through a block table of the first blocks of the cache.
    const AttentionShape& a = model.attention_shape();
    const int64_t need = (window + a.block_size - 1) / a.block_size;
    if (model.kv_blocks() < need) model.allocate_kv(need);
    std::vector<int32_t> table(static_cast<size_t>(a.table_width), -1);
    std::iota(table.begin(), table.begin() + need, 0);
    std::vector<int32_t> pos(static_cast<size_t>(chunk)), seqs(static_cast<size_t>(chunk), 0);
    for (int64_t w0 = 0; w0 < T; w0 += window) {
        const int64_t wn = std::min(window, T - w0);
        for (int64_t b = 0; b < wn; b += chunk) {
            const int64_t n = std::min(chunk, wn - b);
            std::iota(pos.begin(), pos.begin() + n, int32_t(b));
            TokenBatch batch{ids.data() + w0 + b, pos.data(), seqs.data(), n, table.data(), 1, a.table_width};
            View hidden = model.hidden_scratch(n);
            model.embed(batch, hidden);
            model.run_layers(batch, hidden);
        }
    }
    model.backend().sync();
    return stats;
}

}  // namespace lattice
