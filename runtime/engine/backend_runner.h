// BackendRunner: the ModelRunner (model_runner.h) that runs the model on its Backend, CPU or CUDA
// (vLLM v1's GPUModelRunner, CUDA graphs included).
// A step: the plan's tokens become a TokenBatch (positions, each token's sequence, block tables);
// the first stage embeds, a later one receives the previous stage's hidden rows; the layers run;
// a stage hands its rows on, the last computes the logits of the rows to sample (the last token
// and the draft rows of each sampled sequence; every row of a kScore plan) and the sampler rank
// samples them (StepSampler) or, for kScore, downloads them.
// Step graphs: a decode-only step (one sampled token per sequence, at most the largest bucket) runs
// as the captured graph of the smallest bucket that holds it, padded with dummy sequences (token 0 at
// position 0, writing the reserved last KV block): the first step of a bucket runs eagerly (sizing
// scratch), the second captures and replays, the rest replay. With pipeline stages every stage pads
// alike; the hand-offs stay outside the graphs.
// Invariant: every rank decides alike whether graphs are on (the options, the backend kind and the
// model are the same everywhere), so the leader's pool and every stage agree on the reserved block.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "runtime/engine/model_runner.h"
#include "runtime/engine/step_sampler.h"
#include "runtime/model/model.h"

namespace lattice {

struct BackendRunnerOptions {
    bool step_graphs = true;             // EngineOptions::step_graphs
    std::vector<int64_t> graph_buckets;  // EngineOptions::graph_buckets (empty: the default list)
    int64_t max_seqs = 64;
};

class BackendRunner final : public ModelRunner {
public:
    BackendRunner(Model& model, PipelineLinks links, int rank, const BackendRunnerOptions& opt,
                  EngineCounters& counters);
    void execute(const StepPlan& p, StepResults* out) override;
    void release(std::span<const int64_t> ids) override { sampler_.release(ids); }
    int64_t reserved_blocks() const override { return graphs_on_ ? 1 : 0; }

    // The step graphs' batch sizes: `given` (increasing, positive; those above cap dropped), or by
    // default vLLM's list: 1, 2, 4, then every multiple of 8 up to cap, and cap itself as the last.
    static std::vector<int64_t> bucket_list(const std::vector<int64_t>& given, int64_t cap);

private:
    bool is_sampler() const { return rank_ == links_.sampler; }
    // A decode-only step through the captured graph of its bucket; false when the step is not one.
    bool graph_step(const StepPlan& p, const TokenBatch& b, StepResults* out, double* waited);
    void pad_batch(const StepPlan& p, const TokenBatch& b, int64_t bucket);  // b into graph_*, `bucket` rows
    void sample(const StepPlan& p, const View& logits, StepResults* out);

    Model& model_;
    PipelineLinks links_;
    int rank_ = 0;
    EngineCounters& counters_;
    StepSampler sampler_;
    std::vector<int32_t> pos_, seq_of_;
    std::vector<int32_t> seq_loras_;
    void load_loras(const StepPlan& p);  // [seqs] the plan's LoRA slots (TokenBatch::seq_loras)
    struct GraphSlot {
        bool warmed = false;  // one eager step of this bucket ran (scratch sized)
        std::unique_ptr<StepGraph> graph;
        View hidden;  // the bucket's hidden rows [bucket, hidden] (a later stage receives into them)
        View logits;  // where the graph leaves the bucket's logits [bucket, vocab] (last stage)
    };
    bool graphs_on_ = false;
    std::vector<int64_t> graph_buckets_;  // increasing batch sizes
    int64_t graph_max_ = 0;               // largest bucket
    int32_t trash_block_ = -1;            // the KV block the padding rows write (never in the pool)
    std::unordered_map<int64_t, GraphSlot> graphs_;
    // The padded batch a step graph replays (capacity fixed at start).
    std::vector<int32_t> graph_tokens_, graph_positions_, graph_seqs_, graph_tables_;
    std::vector<int64_t> graph_rows_;
};

}  // namespace lattice
