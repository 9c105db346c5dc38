// ParallelContext: this rank's place in the TP x PP grid and the communicators the model uses.
//
// Groups (rank = pp_rank * tp + tp_rank, see world_config.h):
//   tp         ranks of one pipeline stage: world ranks [pp_rank*tp, pp_rank*tp + tp), consecutive
//              (one node); comm rank == tp_rank. The Megatron all-reduces run here.
//   pp_world   the pipeline group of this rank: the pp ranks with the same tp_rank, one per stage;
//              comm rank == pp_rank. A pipeline send from stage s goes to stage s+1 with the same
//              tp_rank, i.e. `pp_world->send(x, pp_rank + 1)`, which is world rank + tp; a receive
//              on stage s comes from `pp_rank - 1` (world rank - tp).
//   world_comm all ranks; comm rank == world rank (sampled-token broadcast from sampler_rank()).
//   plans      all ranks again (a duplicate of world_comm), for the leader's step plans only: its
//              send queue holds kPlanQueue plans for every other rank (two messages each: size,
//              bytes), so the leader, which is also pipeline stage 0, hands a plan to MPI and goes
//              on computing instead of waiting for a follower that is busy with an earlier step;
//              it blocks only when a follower is kPlanQueue plans behind (see RankExecutor::send_plan).
//
// World size 1 (no mpirun, or mpirun -np 1): all three are LocalComm. make_parallel_context still
// initializes MPI (OpenMPI singleton init, ~0.3 s) because only MPI knows whether this process is
// one of several; make_local_context() skips MPI entirely (tests, tools that never run multi-rank).
//
// Validation happens before any communicator is built: every rank evaluates WorldConfig::make on
// the same (world, tp, pp) and throws the same message, so a bad layout never leaves a rank waiting.
// Each MpiComm gets `comm_timeout_s` as its per-call deadline (see watchdog.h).
#pragma once

#include <memory>

#include "parallel/communicator.h"
#include "parallel/wait_policy.h"
#include "parallel/world_config.h"

namespace lattice {

// Step plans a follower may be behind before the leader waits for it (ParallelContext::plans).
inline constexpr int kPlanQueue = 16;

struct ParallelContext {
    WorldConfig world;
    std::unique_ptr<Communicator> tp;          // this stage's tensor-parallel group (size tp)
    std::unique_ptr<Communicator> pp_world;    // this rank's pipeline group (size pp)
    std::unique_ptr<Communicator> world_comm;  // all ranks
    std::unique_ptr<Communicator> plans;       // all ranks: the leader's step plans (deep send queue)

    // Pipeline neighbours as pp_world ranks (-1 at the ends).
    int next_stage() const { return world.is_last_stage() ? -1 : world.pp_rank() + 1; }
    int prev_stage() const { return world.is_first_stage() ? -1 : world.pp_rank() - 1; }
};

// Initializes MPI if needed, validates world == tp * pp on every rank (same message everywhere),
// splits the TP and PP groups, and sets process_identity() (rank, world, tp_rank, pp_rank).
ParallelContext make_parallel_context(int tp, int pp, double comm_timeout_s = 60.0);
// Same, with the full polling policy (spin / yield / sleep steps, grace period; see watchdog.h).
ParallelContext make_parallel_context(int tp, int pp, const WaitPolicy& policy);

// One rank, no MPI: LocalComm everywhere.
ParallelContext make_local_context();

}  // namespace lattice
