// LoraMergedSource: a checkpoint seen with one LoRA adapter merged into its weights, W + s * B A, for
// `lattice convert --lora` (one fine-tune at the base's full speed, no adapter product per step).
//
// It wraps the base's TensorSource: every tensor an adapter targets (per layer: q/k/v/o, gate/up/down, as
// the architecture table names them, runtime/model/lora.h) reads as f32, the base's values plus
// s * B A accumulated in float64 and rounded once; every other tensor is the base's as stored. The merge is
// per element of the full (HF-order) tensor, so a slice read for a tensor-parallel shard, a fused q|k|v or
// gate|up, SmoothQuant folding and the quantization after it all see the merged full weight: merge first,
// then shard, fold and quantize, as a merged checkpoint would be. Merged tensors report no 4-bit form
// (int4_group 0): a 4-bit run quantizes them from the merged floats.
//
// s = the adapter's own scale (lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora) times `scale`
// (--lora-scale, llama.cpp's --lora-scaled). The adapter is read whole with read_lora_adapter's checks (an
// adapter for another base, a missing target module, a corrupt file: an Error naming the adapter).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "runtime/model/lora.h"
#include "runtime/weights/tensor_source.h"

namespace lattice {

class LoraMergedSource : public TensorSource {
public:
    // `base` must outlive this source. `name` names the adapter in errors and in describe().
    LoraMergedSource(const TensorSource& base, const std::string& name, const std::string& path, double scale = 1.0);

    const ModelConfig& config() const override { return base_.config(); }
    bool has(const std::string& name) const override { return base_.has(name); }
    const TensorInfo& info(const std::string& name) const override;
    void read(const std::string& name, int64_t row0, int64_t rows, int64_t col0, int64_t cols, DType out_dtype,
              void* dst) const override;
    Int4Weights read_int4(const std::string& name, int64_t row0, int64_t rows, int64_t col0,
                          int64_t cols) const override;
    std::vector<float> rope_freq_factors() const override { return base_.rope_freq_factors(); }
    std::string describe() const override;
    int64_t total_bytes() const override { return base_.total_bytes(); }
    std::vector<std::string> tensor_names() const override { return base_.tensor_names(); }
    void release_pages() const override { base_.release_pages(); }

    const LoraAdapter& adapter() const { return *adapter_; }
    double scale() const { return scale_; }  // the s of W + s B A
    int64_t merged_tensors() const { return int64_t(merged_.size()); }

private:
    struct Merged {
        const LoraMatrix* m = nullptr;
        TensorInfo info;  // the base's, as f32 without a 4-bit form
    };
    const TensorSource& base_;
    std::shared_ptr<const LoraAdapter> adapter_;
    double scale_ = 0;
    std::map<std::string, Merged> merged_;  // by HF tensor name
};

}  // namespace lattice
