// A rank's load as the first step of a job whose ranks start together: the fronts' one way into the
// builder. Before any collective every rank opens and checks what it will load (check_load: the
// checkpoint for its rank, its tensors against the config, the layout against the model), the
// ranks agree on the outcome (parallel/rank_agreement.h), and only then does build() start the
// parallel context and read weights. So a bad model, layout or argument that every rank meets is
// one verdict on every rank (the lowest failing rank's code and message) instead of ranks leaving
// their peers waiting in the first collective.
// Who prints the verdict is the front's business (LoadAgreement::agree); what is checked, when, and
// that every rank takes part is this room's.
// Invariants: the agreement runs at most once per load and before the parallel context exists;
// with world <= 1 there is no agreement and load() is build().
#pragma once

#include <functional>
#include <string>

#include "runtime/builder/build.h"
#include "runtime/tokenizer/tokenizer.h"

namespace lattice {

struct LoadAgreement {
    int world = 1;  // ranks the job's starter launched; <= 1: nothing to agree on
    int rank = 0;   // this process's rank among them (known before MPI starts)
    // This rank's share: code 0 (fine) or its exit code with the failure's one-line message and its
    // detailed form (with the origin). Returns the agreed code: 0 (no rank failed), > 0 (the lowest
    // failing rank's code; the reporter has said so), or -1 (the peers did not answer in time).
    // Empty: parallel/rank_agreement.h agree_on_failure, reporting nothing.
    std::function<int(int code, const std::string& message, const std::string& detail)> agree;
};

// Thrown on every rank once the ranks agreed that some rank failed: its line is reported, the job
// exits with `code` everywhere.
struct AgreedFailure {
    int code = 1;
};

// What the load of `spec` on world rank `world.rank` of world.tp x world.pp will meet, checked
// without reading weights: the checkpoint (a converted folder: this rank's file, its sizes) opens,
// its tensors match its config (check_tensor_set; random weights and converted folders are checked
// as they load), and the model takes the layout (check_model_layout). Error naming the culprit.
void check_load(const ModelSpec& spec, const WorldConfig& world);

// The load: with agreement.world > 1, check_load on the launched layout and the agreement first
// (AgreedFailure when some rank failed; this rank's own Error when it failed and the peers did not
// answer), then build(opt, spec).
RankRuntime load(const BuildOptions& opt, const ModelSpec& spec, const LoadAgreement& agreement = {});

// A draft model of speculative decoding proposes token ids that the target reads as its own: every id
// the two share must be the same token text. Throws Error naming the draft and the first id whose
// pieces differ (same size or not: a draft larger than the target is DraftModel's error). load() runs
// it on the leader when both checkpoints carry a tokenizer.
void check_draft_vocabulary(const Tokenizer& target, const Tokenizer& draft, const std::string& draft_name);

}  // namespace lattice
