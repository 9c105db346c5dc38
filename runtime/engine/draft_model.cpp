// DraftModel (see draft_model.h).
#include "runtime/engine/draft_model.h"

#include <algorithm>

#include "base/error.h"

namespace lattice {

DraftModel::DraftModel(Engine& draft, int64_t target_vocab)
    : draft_(draft), client_(draft, nullptr, true), max_seq_(draft.model().max_seq()), vocab_(draft.model().config().vocab) {
    LATTICE_CHECK(draft_.is_leader(), "the draft model runs on the leader");
    const int64_t v = draft_.model().config().vocab;
    LATTICE_CHECK(v <= target_vocab,
                  "draft model {}: its vocabulary of {} tokens is larger than the target's {} (a draft must share the "
                  "target's tokenizer)",
                  draft_.model().config().source, v, target_vocab);
}

std::vector<int32_t> DraftModel::propose(std::span<const int32_t> tokens, int64_t k) {
    k = std::min<int64_t>(k, max_seq_ - int64_t(tokens.size()));
    if (k <= 0 || tokens.empty()) return {};
    // A token the draft does not have (a target vocabulary padded beyond the draft's): no drafts.
    if (std::any_of(tokens.begin(), tokens.end(), [&](int32_t t) { return t >= vocab_; })) return {};
    GenerateRequest r;
    r.prompt.assign(tokens.begin(), tokens.end());
    r.max_new_tokens = k;
    r.ignore_eos = true;  // the target decides where the output ends
    return client_.generate(r).tokens;
}

}  // namespace lattice
