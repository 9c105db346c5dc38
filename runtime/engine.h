// Glue between the rank grid and the model: this rank's ModelOptions (TP shard, pipeline stage
// layers) and the pipeline links of its Generator, from a ParallelContext. Used by the CLI and the
// multi-rank tests so both build a rank's model the same way.
#pragma once

#include "parallel/parallel_context.h"
#include "runtime/generator.h"
#include "runtime/model.h"

#include <vector>

namespace lattice {

// `base` supplies quantization, KV sizes and batch limits; tp/pp fields are filled from ctx.
// pp_layer_counts: per-stage layer counts (empty: balanced).
ModelOptions rank_model_options(ModelOptions base, const ParallelContext& ctx, int64_t n_layers,
                                const std::vector<int64_t>& pp_layer_counts = {});
PipelineLinks rank_pipeline_links(const ParallelContext& ctx);

}  // namespace lattice
