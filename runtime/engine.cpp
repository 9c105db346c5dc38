// rank_model_options / rank_pipeline_links (see engine.h).
#include "runtime/engine.h"

namespace lattice {

ModelOptions rank_model_options(ModelOptions o, const ParallelContext& ctx, int64_t n_layers,
                                const std::vector<int64_t>& pp_layer_counts) {
    const WorldConfig& w = ctx.world;
    o.tp = w.tp;
    o.tp_rank = w.tp_rank();
    const auto stages = stage_layer_ranges(n_layers, w.pp, pp_layer_counts);
    o.layer_begin = stages[size_t(w.pp_rank())].first;
    o.layer_end = stages[size_t(w.pp_rank())].second;
    o.first_stage = w.is_first_stage();
    o.last_stage = w.is_last_stage();
    return o;
}

PipelineLinks rank_pipeline_links(const ParallelContext& ctx) {
    PipelineLinks links;
    if (ctx.world.world > 1) {
        links.pipe = ctx.pp_world.get();
        links.prev = ctx.prev_stage();
        links.next = ctx.next_stage();
        links.world = ctx.world_comm.get();
        links.sampler = ctx.world.sampler_rank();
    }
    return links;
}

}  // namespace lattice
