// Helpers for the quantization tests: a TensorSource wrapper that plants an activation outlier
// (one hidden channel of every input/post-attention norm weight scaled), wrappers that serve the layer
// matrices rounded through the int8 and the 4-bit schemes, pseudo-random token ids,
// and a one-call "load this source with these options and score these prompts".
#pragma once

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/quantize.h"
#include "kernels/cpu/int4_gemm.h"
#include "runtime/arch/architecture.h"
#include "runtime/backend/cpu/cpu_backend.h"
#include "runtime/builder/build.h"
#include "runtime/model/model.h"
#include "runtime/weights/tensor_source.h"

namespace lattice::testing {

// Delegates to `inner`; reads of model.layers.*.{input,post_attention}_layernorm.weight get
// element `channel` multiplied by `factor`, so the activation entering wqkv / w_gate_up has an
// outlier channel like the ones real LLMs develop.
class OutlierSource final : public TensorSource {
public:
    OutlierSource(std::unique_ptr<TensorSource> inner, int64_t channel, float factor)
        : inner_(std::move(inner)), channel_(channel), factor_(factor) {}
    const ModelConfig& config() const override { return inner_->config(); }
    bool has(const std::string& n) const override { return inner_->has(n); }
    const TensorInfo& info(const std::string& n) const override { return inner_->info(n); }
    void read(const std::string& name, int64_t row0, int64_t rows, int64_t col0, int64_t cols, DType out,
              void* dst) const override {
        inner_->read(name, row0, rows, col0, cols, out, dst);
        const bool norm =
            name.ends_with(".input_layernorm.weight") || name.ends_with(".post_attention_layernorm.weight");
        if (!norm || channel_ < col0 || channel_ >= col0 + cols) return;
        LATTICE_CHECK(out == DType::kF32, "OutlierSource: norm read as {}", dtype_name(out));
        static_cast<float*>(dst)[channel_ - col0] *= factor_;
    }
    std::vector<float> rope_freq_factors() const override { return inner_->rope_freq_factors(); }
    std::string describe() const override { return inner_->describe() + " (outlier channel)"; }
    int64_t total_bytes() const override { return inner_->total_bytes(); }

private:
    std::unique_ptr<TensorSource> inner_;
    int64_t channel_;
    float factor_;
};

// The matrices the engine quantizes: the table's layer linears (a MoE family's experts too), not
// the router, which stays float.
inline bool quantized_layer_matrix(const ModelConfig& c, const std::string& n) {
    TensorRole role{};
    if (hf_layer_of(n) < 0 || !hf_role_of(architecture_of(c), n, &role)) return false;
    switch (role) {
        case TensorRole::kWq:
        case TensorRole::kWk:
        case TensorRole::kWv:
        case TensorRole::kWo:
        case TensorRole::kWGate:
        case TensorRole::kWUp:
        case TensorRole::kWDown:
        case TensorRole::kExpGate:
        case TensorRole::kExpUp:
        case TensorRole::kExpDown: return true;
        default: return false;
    }
}

// Delegates to `inner`; the layer matrices (q k v o gate up down, and a MoE family's experts) are
// served as f32 after a round trip through a weight scheme: Round::apply(name, inner, row0, rows, col0,
// cols, dst) writes the rounded slice. The fake sources below are its two instances.
template <class Round>
class RoundedSource final : public TensorSource {
public:
    explicit RoundedSource(std::unique_ptr<TensorSource> inner) : inner_(std::move(inner)) {}
    const ModelConfig& config() const override { return inner_->config(); }
    bool has(const std::string& n) const override { return inner_->has(n); }
    const TensorInfo& info(const std::string& n) const override {
        if (!is_layer_matrix(n)) return inner_->info(n);
        auto it = infos_.find(n);
        if (it == infos_.end()) {
            TensorInfo ti = inner_->info(n);
            ti.dtype = DType::kF32;
            it = infos_.emplace(n, ti).first;
        }
        return it->second;
    }
    void read(const std::string& name, int64_t row0, int64_t rows, int64_t col0, int64_t cols, DType out,
              void* dst) const override {
        if (!is_layer_matrix(name)) return inner_->read(name, row0, rows, col0, cols, out, dst);
        LATTICE_CHECK(out == DType::kF32, "{}: {} read as {}", Round::kName, name, dtype_name(out));
        Round::apply(name, *inner_, row0, rows, col0, cols, static_cast<float*>(dst));
    }
    std::vector<float> rope_freq_factors() const override { return inner_->rope_freq_factors(); }
    std::string describe() const override { return inner_->describe() + " (" + Round::kName + ")"; }
    int64_t total_bytes() const override { return inner_->total_bytes(); }

private:
    bool is_layer_matrix(const std::string& n) const { return quantized_layer_matrix(inner_->config(), n); }
    std::unique_ptr<TensorSource> inner_;
    mutable std::map<std::string, TensorInfo> infos_;
};

// The engine's int8 weight scheme (per output row over the whole row: s = max|w| / 127, w' = q s), so an
// fp32 run computes what W8A16 computes, with float GEMMs.
struct Int8Rounding {
    static constexpr const char* kName = "fake-quantized";
    static void apply(const std::string& name, const TensorSource& inner, int64_t row0, int64_t rows, int64_t col0,
                      int64_t cols, float* dst) {
        const int64_t K = inner.info(name).cols();
        std::vector<float> full(static_cast<size_t>(rows * K));
        inner.read(name, row0, rows, 0, K, DType::kF32, full.data());
        for (int64_t r = 0; r < rows; ++r) {
            float* w = full.data() + r * K;
            const float sc = int8_scale_from_absmax(absmax_row(w, K));
            for (int64_t j = 0; j < K; ++j) w[j] = float(quantize_int8_value(w[j], sc)) * sc;
            std::copy(w + col0, w + col0 + cols, dst + r * cols);
        }
    }
};
using FakeQuantSource = RoundedSource<Int8Rounding>;

// The 4-bit scheme a backend applies to float weights (kernels/cpu/int4_gemm.h quantize_weights_int4: affine
// groups of 32 along each row of the slice read, from its first column, as the backend gets the slice), so
// an fp32 run at a layout computes with exactly the dequantized weights a W4A16 or W4A8 run at that layout
// holds, with float GEMMs and float activations.
struct Int4Rounding {
    static constexpr const char* kName = "fake-quantized to 4 bits";
    static void apply(const std::string& name, const TensorSource& inner, int64_t row0, int64_t rows, int64_t col0,
                      int64_t cols, float* dst) {
        std::vector<float> w(static_cast<size_t>(rows * cols));
        inner.read(name, row0, rows, col0, cols, DType::kF32, w.data());
        const Int4Weights q = quantize_weights_int4(w.data(), rows, cols, kInt4Block);
        const Int4Matrix m = q.matrix();
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = int4_value(m, r, c);
    }
};
using FakeInt4Source = RoundedSource<Int4Rounding>;

inline std::vector<int32_t> random_ids(size_t n, int64_t vocab, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> d(3, int32_t(vocab - 1));
    std::vector<int32_t> ids(n);
    for (auto& x : ids) x = d(rng);
    return ids;
}

// Logits [T, vocab] of each prompt (each scored from position 0) under `mo`.
inline std::vector<std::vector<float>> score_all(const TensorSource& src, const ModelOptions& mo,
                                                 const std::vector<std::vector<int32_t>>& prompts, int threads = 2) {
    CpuBackend be(CpuBackendOptions{threads, false, false});
    Model model(src, be, mo, nullptr);
    auto gen = make_local_engine(model);
    std::vector<std::vector<float>> out;
    for (const auto& p : prompts) out.push_back(gen->score(p));
    return out;
}

inline ModelOptions quant_options(QuantMode q, const std::string& smooth = {}, int64_t max_seq = 0) {
    ModelOptions mo;
    mo.quant = q;
    mo.smooth_path = smooth;
    mo.max_seq = max_seq;
    return mo;
}

}  // namespace lattice::testing
