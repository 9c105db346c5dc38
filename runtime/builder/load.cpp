// The checked, agreed load of a rank (see load.h).
#include "runtime/builder/load.h"

#include <algorithm>
#include <new>
#include <optional>

#include "base/log.h"
#include "parallel/rank_agreement.h"
#include "parallel/world_config.h"

namespace lattice {

void check_load(const ModelSpec& spec, const WorldConfig& world) {
    ModelSpec check = spec;
    check.verify = false;  // hashing is the load's job; sizes are checked when opening
    const std::unique_ptr<TensorSource> src = open_spec(check, world);
    if (!src->prepared() && !spec.random) check_tensor_set(*src);
    check_model_layout(src->config().dims(), world.tp, world.pp);
}

void check_draft_vocabulary(const Tokenizer& target, const Tokenizer& draft, const std::string& draft_name) {
    const int32_t n = std::min(target.vocab_size(), draft.vocab_size());
    for (int32_t id = 0; id < n; ++id) {
        const std::string& t = target.token_text(id);
        const std::string& d = draft.token_text(id);
        LATTICE_CHECK(t == d,
                      "draft model {}: token {} is {:?} in the draft but {:?} in the target (a draft must share the "
                      "target's vocabulary: the same tokenizer)",
                      draft_name, id, d, t);
    }
}

namespace {

// The leader's draft check (only rank 0 loads the draft): skipped, with a line, where either side has no
// tokenizer to compare (random weights, a converted folder without one).
void check_draft(const BuildOptions& opt, const ModelSpec& spec, int rank) {
    if (rank != 0 || opt.draft.path.empty() || opt.draft.random || spec.random) return;
    std::unique_ptr<Tokenizer> target, draft;
    try {
        target = load_tokenizer(spec.path);
        draft = load_tokenizer(opt.draft.path);
    } catch (const Error& e) {
        LOG_WARN("speculative decoding: the draft's vocabulary is not compared with the target's: {}", e.message());
        return;
    }
    check_draft_vocabulary(*target, *draft, opt.draft.path);
}

}  // namespace

RankRuntime load(const BuildOptions& opt, const ModelSpec& spec, const LoadAgreement& agreement) {
    if (agreement.world <= 1) check_draft(opt, spec, 0);
    if (agreement.world > 1) {
        // Every rank opens and checks the checkpoint and the layout here, before MPI's first
        // collective, and the ranks agree: a failure every rank meets is one verdict everywhere.
        int code = 0;
        std::string message, detail;
        std::optional<Error> own;
        try {
            check_load(spec, WorldConfig::make(agreement.world, opt.tp, opt.pp, agreement.rank));
            check_draft(opt, spec, agreement.rank);
        } catch (const Error& e) {
            code = 1, message = e.message(), detail = e.what();
            own = e;
        } catch (const std::bad_alloc&) {
            code = 1, message = detail = "out of memory opening the model";
            own = Error(message);
        }
        int agreed = 0;
        if (agreement.agree) {
            agreed = agreement.agree(code, message, detail);
        } else {
            const RankAgreement v = agree_on_failure(code, message);
            agreed = v.peers_silent() ? -1 : v.code;
        }
        if (agreed > 0) throw AgreedFailure{agreed};
        if (agreed < 0 && own) throw *own;  // the peers are silent: this rank reports alone
    }
    return build(opt, spec);
}

}  // namespace lattice
