// RandomSource: a TensorSource that fabricates a checkpoint of a given config from a seed, so
// benchmarks of 1B..70B shapes need no file. Every element is a pure function of
// (seed, tensor name, row, col), so any TP x PP slicing sees the same global weights as a single rank.
// Matrices: uniform in [-1, 1] / sqrt(cols); norms: 1 + small noise. Stored as `dtype` (default bf16).
// Reads of large slices are spread over the cores (the 70B shapes would take seconds per layer).
#pragma once

#include "runtime/weights/tensor_source.h"

#include <map>
#include <memory>

namespace lattice {

std::unique_ptr<TensorSource> make_random_source(const ModelConfig& cfg, uint64_t seed, DType dtype = DType::kBF16);

}  // namespace lattice
