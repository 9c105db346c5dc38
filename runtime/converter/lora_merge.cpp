// LoraMergedSource (see lora_merge.h): the base's tensors with one adapter merged into its targets.
#include "runtime/converter/lora_merge.h"

#include <cmath>
#include <limits>
#include <vector>

#include "base/convert.h"
#include "base/error.h"
#include "runtime/arch/architecture.h"

namespace lattice {

namespace {

// The base tensor each LoraTarget adds to (lora.h's LoraTarget order).
constexpr TensorRole kTargetRoles[kLoraTargets] = {TensorRole::kWq,    TensorRole::kWk, TensorRole::kWv,
                                                   TensorRole::kWo,    TensorRole::kWGate, TensorRole::kWUp,
                                                   TensorRole::kWDown};

}  // namespace

LoraMergedSource::LoraMergedSource(const TensorSource& base, const std::string& name, const std::string& path,
                                   double scale)
    : base_(base) {
    LATTICE_CHECK(std::isfinite(scale), "adapter '{}': --lora-scale {} is not finite", name, scale);
    LoraReadOptions ro;
    ro.max_rank = std::numeric_limits<int32_t>::max();  // merged, the rank costs nothing at run time
    adapter_ = std::make_shared<const LoraAdapter>(read_lora_adapter(name, path, base.config(), ro));
    scale_ = double(adapter_->scale) * scale;
    const ModelConfig& cfg = base.config();
    for (size_t l = 0; l < adapter_->layers.size(); ++l) {
        const int64_t layer = adapter_->layer_begin + int64_t(l);
        for (LoraTarget t : adapter_->targets) {
            const LoraMatrix& m = adapter_->layers[l][size_t(t)];
            if (!m.present()) continue;
            const std::string tn = tensor_name(cfg, kTargetRoles[size_t(t)], layer);
            Merged mg;
            mg.m = &m;
            mg.info = base.info(tn);
            const auto [in, out] = lora_target_dims(cfg, t);
            LATTICE_CHECK(mg.info.rows() == out && mg.info.cols() == in,
                          "adapter '{}': {} of layer {} is [{}, {}], the base's {} is {}: an adapter for another base?",
                          name, lora_target_name(t), layer, out, in, tn, shape_string(mg.info.shape));
            mg.info.dtype = DType::kF32;
            mg.info.int4_group = 0;
            mg.info.int4_perm = false;
            mg.info.int4_requant = false;
            merged_.emplace(tn, std::move(mg));
        }
    }
}

const TensorInfo& LoraMergedSource::info(const std::string& name) const {
    const auto it = merged_.find(name);
    return it == merged_.end() ? base_.info(name) : it->second.info;
}

void LoraMergedSource::read(const std::string& name, int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                            DType out_dtype, void* dst) const {
    const auto it = merged_.find(name);
    if (it == merged_.end()) return base_.read(name, row0, rows, col0, cols, out_dtype, dst);
    const TensorInfo& ti = it->second.info;
    check_slice(ti, row0, rows, col0, cols);
    // The base's rows: whole rows when its blocks would not allow the column slice (GGUF block types).
    const TensorInfo& stored = base_.info(name);
    const int64_t g = dtype_block_elems(stored.dtype);
    const bool whole = g > 1 && (col0 % g != 0 || cols % g != 0);
    const int64_t c0 = whole ? 0 : col0, nc = whole ? ti.cols() : cols;
    std::vector<float> w(size_t(rows * nc));
    base_.read(name, row0, rows, c0, nc, DType::kF32, w.data());
    const LoraMatrix& m = *it->second.m;
    const int64_t r = adapter_->rank, in = ti.cols();
    std::vector<float> out(size_t(rows * cols));
    std::vector<double> acc(static_cast<size_t>(cols));
    for (int64_t i = 0; i < rows; ++i) {  // row by row, each rank-1 term over contiguous columns (vectorized)
        for (int64_t j = 0; j < cols; ++j) acc[size_t(j)] = double(w[size_t(i * nc + (col0 - c0) + j)]);
        for (int64_t k = 0; k < r; ++k) {
            const double bk = scale_ * double(m.b[size_t((row0 + i) * r + k)]);
            const float* a = m.a.data() + k * in + col0;
            for (int64_t j = 0; j < cols; ++j) acc[size_t(j)] += bk * double(a[j]);
        }
        for (int64_t j = 0; j < cols; ++j) out[size_t(i * cols + j)] = float(acc[size_t(j)]);
    }
    for (float v : out)
        LATTICE_CHECK(std::isfinite(v), "adapter '{}': merging into {} gives a non-finite value", adapter_->name, name);
    convert_elements(out.data(), DType::kF32, dst, out_dtype, rows * cols);
}

Int4Weights LoraMergedSource::read_int4(const std::string& name, int64_t row0, int64_t rows, int64_t col0,
                                        int64_t cols) const {
    LATTICE_CHECK(merged_.count(name) == 0, "{}: merged with adapter '{}', it has no 4-bit form", name,
                  adapter_->name);
    return base_.read_int4(name, row0, rows, col0, cols);
}

std::string LoraMergedSource::describe() const {
    return base_.describe() + fmt::format(" + LoRA '{}' ({}, merged at scale {:g})", adapter_->name, adapter_->path,
                                          scale_);
}

}  // namespace lattice
