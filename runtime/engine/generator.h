// Generator: prompt prefill + token-by-token decode of one or several sequences over a (possibly
// pipelined, tensor-parallel) Model.
//
// Every rank walks the same list of work items in the same order:
//   prefill items P(i, c): chunk c (micro_batch_tokens tokens) of sequence i's prompt, i = 0..S-1;
//   decode items  D(r, g): round r for sequence group g (G = min(S, pp) groups, seq i in group i % G),
//                          one token per still-active sequence of the group, batched into one pass.
// For an item, the first stage embeds, other stages receive the hidden rows from the previous stage
// (pipe rank - 1 = world rank - tp), each stage runs its layers and sends to the next, the last
// stage computes logits. Sampling happens once, on the sampler rank (last stage, TP rank 0), which
// sends the sampled tokens point-to-point to every other rank (host MPI, in item order). A rank
// reads those messages lazily, only when an item needs tokens it does not have yet, so no rank
// waits on a collective and stages overlap:
//   prefill: stage s works on chunk c while stage s+1 works on chunk c-1 (bubble
//            (pp-1)/(n_chunks+pp-1) for one sequence);
//   decode:  with S >= pp sequences, stage s works on group g while stage s+1 works on group g-1
//            and the last stage samples group g-2 ..., so no stage idles in steady state; with one
//            sequence decode is inherently sequential across stages (bubble (pp-1)/pp).
// Each rank measures its own idle time (blocked in receives) to report the bubble.
#pragma once

#include "parallel/communicator.h"
#include "runtime/model/model.h"
#include "runtime/engine/sampler.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace lattice {

struct PipelineLinks {
    Communicator* pipe = nullptr;   // this rank's pipeline group (one rank per stage); null: one stage
    int prev = -1;                  // pipe rank of the previous stage, -1 on the first
    int next = -1;                  // pipe rank of the next stage, -1 on the last
    Communicator* world = nullptr;  // all ranks (host memory); null: a single rank
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
    int64_t prompt_tokens = 0;     // over all sequences
    double prefill_seconds = 0;
    int64_t generated_tokens = 0;  // over all sequences
    double decode_seconds = 0;
    double idle_seconds = 0;       // this rank, blocked waiting for peers (prefill + decode)
    double compute_seconds = 0;    // this rank, inside the model (embed, layers, head)
    int64_t sequences = 1;
};

struct GenerateResult {
    std::vector<int32_t> tokens;  // generated ids (eos included when it ended the run)
    GenerateStats stats;
};

class Generator {
public:
    Generator(Model& model, PipelineLinks links = {}, int64_t micro_batch_tokens = 0);

    // One sequence. on_token (sampler rank only) sees each new id as it is produced.
    GenerateResult generate(const GenerateRequest& req, const std::function<void(int32_t)>& on_token = {});
    // Several sequences at once (slot i for request i; the model needs at least that many slots).
    // Every rank returns every sequence's tokens; stats are summed over sequences.
    std::vector<GenerateResult> generate_batch(const std::vector<GenerateRequest>& reqs,
                                               const std::function<void(int64_t, int32_t)>& on_token = {},
                                               GenerateStats* total = nullptr);
    // Logits of every prompt position, [prompt.size(), vocab] row-major (on world rank 0).
    std::vector<float> score(const std::vector<int32_t>& prompt);

    bool is_sampler() const;

private:
    // Moves one batch of tokens through this rank's stage; on the last stage, writes the logits of
    // `logit_rows` into logits. Returns the seconds spent waiting in the pipeline receive.
    double step(const TokenBatch& batch, const std::vector<int64_t>& logit_rows, float* logits);
    void check_prompt(const std::vector<int32_t>& prompt) const;

    Model& model_;
    PipelineLinks links_;
    int64_t micro_;
    double compute_seconds_ = 0;
};

}  // namespace lattice
