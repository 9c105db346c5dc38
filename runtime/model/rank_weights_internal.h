// Internals shared by RankWeights' plan (rank_weights.cpp) and its reads (rank_weights_read.cpp);
// not part of the model room's interface. Included only by those two files.
#pragma once

#include "base/dtype.h"
#include "runtime/arch/architecture.h"
#include "runtime/model/rank_weights.h"

namespace lattice::rank_weights_internal {

inline constexpr char kScale[] = "_scale";  // == kScaleSuffix of runtime/weights/manifest.h

// The dtype a float tensor keeps on the host (f32, f16, bf16 as stored; anything else widens to f32).
inline DType keep_dtype(DType t) {
    return (t == DType::kF32 || t == DType::kF16 || t == DType::kBF16) ? t : DType::kF32;
}

// The per-layer norm weights beyond Llama's two (QK-norm, sandwich norms): read whole, as f32, no smoothing.
inline bool is_extra_norm(WeightRole r) {
    return r == WeightRole::kQNorm || r == WeightRole::kKNorm || r == WeightRole::kPostAttnNorm ||
           r == WeightRole::kPostFfnNorm;
}
inline TensorRole extra_norm_role(WeightRole r) {
    return r == WeightRole::kQNorm          ? TensorRole::kQNorm
           : r == WeightRole::kKNorm        ? TensorRole::kKNorm
           : r == WeightRole::kPostAttnNorm ? TensorRole::kPostAttnNorm
                                            : TensorRole::kPostFfnNorm;
}

}  // namespace lattice::rank_weights_internal
