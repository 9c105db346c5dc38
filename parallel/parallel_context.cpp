// make_parallel_context: layout validation, then TP / PP communicator splits (see parallel_context.h).
#include "parallel/parallel_context.h"

#include <algorithm>

#if !defined(LATTICE_NO_MPI)
#include "parallel/mpi_comm.h"
#include "parallel/mpi_session.h"
#endif

namespace lattice {

namespace {

void set_identity(const WorldConfig& w) {
    ProcessIdentity& id = process_identity();
    id.rank = w.rank;
    id.world = w.world;
    id.tp_rank = w.tp_rank();
    id.pp_rank = w.pp_rank();
}

}  // namespace

ParallelContext make_parallel_context(int tp, int pp, double comm_timeout_s) {
    WaitPolicy policy;
    policy.timeout_s = comm_timeout_s;
    return make_parallel_context(tp, pp, policy);
}

ParallelContext make_parallel_context(int tp, int pp, const WaitPolicy& policy) {
    const double comm_timeout_s = policy.timeout_s;
    LATTICE_CHECK(comm_timeout_s > 0 && comm_timeout_s <= 7 * 86400,
                  "--comm-timeout must be in (0, 604800] s (a week), got {}", comm_timeout_s);
#if defined(LATTICE_NO_MPI)
    // Built without MPI (configure found none): one rank, and any larger layout is an Error.
    LATTICE_CHECK(tp < 1 || pp < 1 || int64_t(tp) * pp == 1,
                  "--tp {} --pp {} needs {} ranks, but this lattice was built without MPI (configure found no MPI "
                  "library): only single-rank layouts run; rebuild with MPI installed for multi-rank",
                  tp, pp, int64_t(tp) * pp);
    ParallelContext ctx = make_local_context();
    ctx.world = WorldConfig::make(1, tp, pp, 0);  // the usual message for tp or pp < 1
    set_identity(ctx.world);
    return ctx;
#else
    MpiSession& s = mpi_session();
    // Same inputs on every rank -> same verdict and message on every rank, before any collective.
    ParallelContext ctx;
    ctx.world = WorldConfig::make(s.size(), tp, pp, s.rank(), s.local_rank(), s.local_size());
    set_identity(ctx.world);
    if (ctx.world.world == 1) {
        ctx.tp = std::make_unique<LocalComm>();
        ctx.pp_world = std::make_unique<LocalComm>();
        ctx.world_comm = std::make_unique<LocalComm>();
        ctx.plans = std::make_unique<LocalComm>();
        return ctx;
    }
    // The plans' communicator first (same order on every rank: MPI_Comm_dup is collective).
    WaitPolicy plan_policy = policy;
    plan_policy.send_buffers = std::max(policy.send_buffers, 2 * kPlanQueue * (ctx.world.world - 1));
    ctx.plans = MpiComm::world(plan_policy, "plans");
    auto world = MpiComm::world(policy, "world");
    const WorldConfig& w = ctx.world;
    std::unique_ptr<MpiComm> tpc = world->split(w.pp_rank(), w.tp_rank(), fmt::format("tp{}", w.pp_rank()));
    std::unique_ptr<MpiComm> ppc = world->split(w.tp_rank(), w.pp_rank(), fmt::format("pp{}", w.tp_rank()));
    LATTICE_CHECK(tpc && tpc->size() == w.tp && tpc->rank() == w.tp_rank(),
                  "TP group split gave {} ranks (rank {}), expected {}", tpc ? tpc->size() : 0, tpc ? tpc->rank() : -1,
                  w.tp);
    LATTICE_CHECK(ppc && ppc->size() == w.pp && ppc->rank() == w.pp_rank(),
                  "PP group split gave {} ranks (rank {}), expected {}", ppc ? ppc->size() : 0, ppc ? ppc->rank() : -1,
                  w.pp);
    // A group of one needs no MPI at all.
    if (w.tp == 1)
        ctx.tp = std::make_unique<LocalComm>();
    else
        ctx.tp = std::move(tpc);
    if (w.pp == 1)
        ctx.pp_world = std::make_unique<LocalComm>();
    else
        ctx.pp_world = std::move(ppc);
    ctx.world_comm = std::move(world);
    return ctx;
#endif
}

ParallelContext make_local_context() {
    ParallelContext ctx;
    ctx.world = WorldConfig::make(1, 1, 1, 0);
    ctx.tp = std::make_unique<LocalComm>();
    ctx.pp_world = std::make_unique<LocalComm>();
    ctx.world_comm = std::make_unique<LocalComm>();
    ctx.plans = std::make_unique<LocalComm>();
    return ctx;
}

}  // namespace lattice
