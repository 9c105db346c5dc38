// SmoothQuant (Xiao et al., 2022): per-input-channel smoothing factors that move activation
// outliers into the weights before W8A8 quantization.
//
// For a GEMM y = x . W^T whose input x = rmsnorm(h) * g is produced by a norm with weight g:
//   s_j = max|X_j|^alpha / max|W[:, j]|^(1 - alpha)        (j = input channel, 0 <= j < hidden)
//   g'_j = g_j / s_j,  W'[:, j] = W[:, j] * s_j             => x' . W'^T == x . W^T exactly in reals.
// Only the two norm-preceded GEMMs of each layer are smoothed: attention input (W = [q|k|v] rows,
// norm = input_layernorm) and MLP input (W = [gate|up] rows, norm = post_attention_layernorm);
// o_proj and down_proj have no norm to absorb 1/s.
// s = 1 where max|X_j| == 0 or max|W[:, j]| == 0 (a dead channel); otherwise clamped to
// [kMinSmooth, kMaxSmooth].
//
// File format (safetensors, written by `lattice calibrate`): for every layer N,
//   model.layers.N.attn_smooth  f32 [hidden]
//   model.layers.N.mlp_smooth   f32 [hidden]
// Every value must be finite and inside [kMinSmooth, kMaxSmooth]; anything else is rejected with
// an Error naming the file and tensor. The factors are per input channel (= hidden), which tensor
// parallelism never shards for these two GEMMs, so every TP rank applies the whole vector.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/view.h"
#include "runtime/weights/tensor_source.h"

namespace lattice {

constexpr float kMinSmooth = 1e-4f;
constexpr float kMaxSmooth = 1e4f;
constexpr int kSmoothAttn = 0;  // `which` of an observed activation: attention input (before wqkv)
constexpr int kSmoothMlp = 1;   // MLP input (before w_gate_up)

// Per-layer smoothing factors of layers [layer_begin, layer_begin + attn.size()), each [hidden].
struct SmoothFactors {
    int64_t hidden = 0;
    int64_t layer_begin = 0;
    std::vector<std::vector<float>> attn, mlp;
};

// Running per-channel max|x| of the activations entering the smoothed GEMMs, for `n_layers`
// layers of `hidden` channels. observe() takes host f32 [tokens, hidden]; non-finite values are
// an Error naming the layer (a calibration run that overflows is not a calibration).
class ActivationStats {
public:
    ActivationStats(int64_t n_layers, int64_t hidden);
    void observe(int64_t layer, int which, const View& x);
    const std::vector<float>& max_abs(int64_t layer, int which) const;
    int64_t n_layers() const { return n_layers_; }
    int64_t hidden() const { return hidden_; }
    int64_t tokens_seen(int64_t layer, int which) const;

private:
    int64_t n_layers_, hidden_;
    std::vector<std::vector<float>> max_;  // [layer * 2 + which][hidden]
    std::vector<int64_t> tokens_;
};

// s_j from the two maxima (see the header comment).
std::vector<float> smoothing_factors(const std::vector<float>& act_max, const std::vector<float>& w_max, double alpha);

// max over rows of |W[:, j]| of the row-concatenation of `names` (each [rows, cols]), read from
// src in f32 row chunks.
std::vector<float> weight_column_max(const TensorSource& src, const std::vector<std::string>& names, int64_t cols);

// Factors for every layer of src from the activation maxima (stats covers all layers).
SmoothFactors compute_smooth_factors(const TensorSource& src, const ActivationStats& stats, double alpha);

void write_smooth_factors(const std::string& path, const SmoothFactors& f);
// Reads the factors of layers [layer_begin, layer_end) from `path`, checking names, dtype, shape
// [hidden] and value range.
SmoothFactors read_smooth_factors(const std::string& path, int64_t hidden, int64_t layer_begin, int64_t layer_end);

// Folding helpers used by Model::load on host weights.
// W [rows, cols] of `dtype` (f32/f16/bf16) -> f32 with W[:, j] *= s[j]; `bytes` is replaced
// (f32 so the product is not rounded back to 16 bits, which would break the float identity).
void fold_smooth_columns(std::vector<uint8_t>& bytes, DType& dtype, int64_t rows, int64_t cols,
                         const std::vector<float>& s);
// g[j] /= s[j]
void fold_smooth_norm(float* g, int64_t n, const std::vector<float>& s);

std::string smooth_tensor_name(int64_t layer, int which);

class Model;
// Runs `ids` through a single-stage float model (embed + layers, no LM head) in independent
// windows of `window` tokens (each starting at position 0 of slot 0, so any text length works),
// observing the smoothed GEMM inputs. The model must be loaded with QuantMode::kNone and no
// smoothing (the maxima must be those of the original model).
ActivationStats collect_activation_stats(Model& model, const std::vector<int32_t>& ids, int64_t window);

}  // namespace lattice
