// The checked, agreed load of a rank (see load.h).
#include "runtime/builder/load.h"

#include <new>
#include <optional>

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

RankRuntime load(const BuildOptions& opt, const ModelSpec& spec, const LoadAgreement& agreement) {
    if (agreement.world > 1) {
        // Every rank opens and checks the checkpoint and the layout here, before MPI's first
        // collective, and the ranks agree: a failure every rank meets is one verdict everywhere.
        int code = 0;
        std::string message, detail;
        std::optional<Error> own;
        try {
            check_load(spec, WorldConfig::make(agreement.world, opt.tp, opt.pp, agreement.rank));
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
