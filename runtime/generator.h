// Generator: prompt prefill + token-by-token decode over a (possibly pipelined) Model.
//
// Every rank runs the same loop. A step moves a batch of tokens through the pipeline:
// the first stage embeds, other stages receive the hidden rows from the previous stage
// (pipe rank - 1 = world rank - tp), every stage runs its layers and sends to the next, the last
// stage computes logits. Sampling happens once, on the sampler rank (last stage, TP rank 0), and
// the token is broadcast to all ranks, so every rank agrees on every step.
// Pipeline schedule: the prompt is split into micro-batches of `micro_batch_tokens`; a stage sends
// micro-batch i and goes on to i + 1 while the next stage works on i, so stages overlap during
// prefill (bubble (pp - 1) / (n_micro + pp - 1)). Single-sequence decode is sequential across stages.
#pragma once

#include "parallel/communicator.h"
#include "runtime/model.h"
#include "runtime/sampler.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace lattice {

struct PipelineLinks {
    Communicator* pipe = nullptr;   // this rank's pipeline group (one rank per stage); null: one stage
    int prev = -1;                  // pipe rank of the previous stage, -1 on the first
    int next = -1;                  // pipe rank of the next stage, -1 on the last
    Communicator* world = nullptr;  // all ranks; null: a single rank
    int sampler = 0;                // world rank that samples
};

struct GenerateRequest {
    std::vector<int32_t> prompt;
    int64_t max_new_tokens = 16;
    SamplingParams sampling;
    bool ignore_eos = false;
    std::vector<int32_t> stop_ids;  // extra end-of-generation ids (e.g. the tokenizer's <|im_end|>)
};

struct GenerateStats {
    int64_t prompt_tokens = 0;
    double prefill_seconds = 0;
    int64_t generated_tokens = 0;
    double decode_seconds = 0;
};

struct GenerateResult {
    std::vector<int32_t> tokens;  // generated ids (eos included when it ended the run)
    GenerateStats stats;
};

class Generator {
public:
    Generator(Model& model, PipelineLinks links = {}, int64_t micro_batch_tokens = 0);

    // on_token (sampler rank only) sees each new id as it is produced.
    GenerateResult generate(const GenerateRequest& req, const std::function<void(int32_t)>& on_token = {});
    // Logits of every prompt position, [prompt.size(), vocab] row-major (filled on the sampler rank).
    std::vector<float> score(const std::vector<int32_t>& prompt);

    bool is_sampler() const;

private:
    // Runs tokens [begin, end) of `ids` (positions start at pos0, slot 0) through the pipeline.
    // On the last stage, writes the logits of `logit_rows` (relative to begin) into logits.
    void step(const int32_t* ids, int64_t count, int64_t pos0, const std::vector<int64_t>& logit_rows, float* logits);
    void check_prompt(const std::vector<int32_t>& prompt, int64_t extra) const;

    Model& model_;
    PipelineLinks links_;
    int64_t micro_;
};

}  // namespace lattice
