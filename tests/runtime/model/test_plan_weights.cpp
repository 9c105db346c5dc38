// The planner's weight bytes per rank (parallel/plan_model.h, arithmetic on the model's dimensions)
// against what the loader would really hold (RankWeights::resident_bytes over the tensors a rank
// loads), for every stage of several layouts, quantizations and devices.
#include <doctest/doctest.h>

#include "parallel/plan_model.h"
#include "runtime/arch/config.h"
#include "runtime/model/model.h"
#include "runtime/model/rank_weights.h"
#include "runtime/weights/random_source.h"

#include <algorithm>

using namespace lattice;

namespace {
// The heaviest stage's tp rank 0, as the planner reports it.
double loaded_bytes(const TensorSource& src, QuantMode q, bool quant_head, int tp, int pp, bool cuda) {
    const ModelConfig& c = src.config();
    const auto stages = stage_layer_ranges(c.n_layers, pp);
    double best = 0;
    for (int p = 0; p < pp; ++p) {
        ModelOptions o;
        o.quant = q;
        o.quant_head = quant_head;
        o.tp = tp;
        o.layer_begin = stages[size_t(p)].first;
        o.layer_end = stages[size_t(p)].second;
        o.first_stage = p == 0;
        o.last_stage = p == pp - 1;
        best = std::max(best, RankWeights(src, o).resident_bytes({.cuda = cuda}));
    }
    return best;
}
}  // namespace

TEST_CASE("planner weight bytes match the loader's within 1%") {
    struct Case {
        const char* preset;
        DType dtype;
        QuantMode q;
        bool quant_head;
        int tp, pp;
        bool cuda;
    };
    const Case cases[] = {
        {"tinyllama-1.1b", DType::kF32, QuantMode::kNone, false, 1, 1, false},
        {"tinyllama-1.1b", DType::kBF16, QuantMode::kW8A8, false, 2, 1, false},
        {"tinyllama-1.1b", DType::kBF16, QuantMode::kW8A8, true, 1, 2, false},
        {"llama-2-7b", DType::kBF16, QuantMode::kW8A8, false, 2, 2, true},
        {"llama-2-7b", DType::kBF16, QuantMode::kNone, false, 4, 1, true},
        {"llama-3-8b", DType::kBF16, QuantMode::kW8A16, false, 2, 4, true},
        // MoE: every expert's shard and the float router are held.
        {"mixtral-tiny-8x1.1b", DType::kBF16, QuantMode::kW8A8, false, 2, 1, false},
        {"mixtral-tiny-8x1.1b", DType::kF32, QuantMode::kNone, false, 1, 2, false},
        {"mixtral-8x7b", DType::kBF16, QuantMode::kW8A16, false, 4, 2, true},
        {"tinyllama-1.1b", DType::kBF16, QuantMode::kW4A8, true, 2, 1, false},  // 4-bit layers, int8 head
        {"tinyllama-1.1b", DType::kBF16, QuantMode::kW4A16, false, 1, 2, false},
        {"mixtral-tiny-8x1.1b", DType::kBF16, QuantMode::kW4A8, false, 2, 1, false},  // 4-bit experts
        {"llama-2-7b", DType::kBF16, QuantMode::kW4A16, false, 2, 1, true},  // CUDA's 4-bit layout: unpadded channels
        {"llama-3-8b", DType::kBF16, QuantMode::kW4A16, true, 1, 2, true},
    };
    for (const Case& k : cases) {
        CAPTURE(k.preset);
        CAPTURE(k.tp);
        CAPTURE(k.pp);
        CAPTURE(int(k.q));
        const ModelConfig cfg = preset_config(k.preset);
        auto src = make_random_source(cfg, 7, k.dtype);
        PlanRequest r;
        r.model = cfg.dims();
        r.device = find_device(k.cuda ? "a100-pcie-40gb" : "cpu");
        r.link = find_link(r.device.link);
        r.inter_node = find_link("ib-hdr");
        r.devices = k.tp * k.pp;
        r.quant = k.q == QuantMode::kW8A8   ? PlanQuant::kW8A8
                  : k.q == QuantMode::kW8A16 ? PlanQuant::kW8A16
                  : k.q == QuantMode::kW4A8  ? PlanQuant::kW4A8
                  : k.q == QuantMode::kW4A16 ? PlanQuant::kW4A16
                  : k.cuda                   ? PlanQuant::kFp16
                                             : PlanQuant::kF32;
        r.quant_head = k.quant_head;
        const double planned = estimate_memory(r, k.tp, k.pp).weights;
        const double loaded = loaded_bytes(*src, k.q, k.quant_head, k.tp, k.pp, k.cuda);
        REQUIRE(loaded > 0);
        CHECK(planned == doctest::Approx(loaded).epsilon(0.01));
    }
}
