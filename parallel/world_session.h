// The process's place among the ranks of its job, with MPI hidden: what launch/ needs of the world
// (join it, learn rank and node placement, end it, small rank-0 collectives for reports) without
// including <mpi.h> or naming an MPI call. launch/ includes this header, never parallel/mpi_*.h.
//
// - With MPI, join_world() initializes MPI on first use (mpi_session(), mpi_session.h) and every
//   collective here runs on the world communicator with MPI errors turned into lattice::Error.
// - Without MPI (LATTICE_NO_MPI) the world is this one process: join_world() gives rank 0 of 1,
//   the gather returns this rank's own string, and finalize/abort/reporter do nothing.
// Invariants: rank 0 is the root of every collective here; every rank of the world must call a
// collective (gather, broadcast), as with any MPI collective.
#pragma once

#include <string>
#include <vector>

namespace lattice {

#if defined(LATTICE_NO_MPI)
inline constexpr bool kBuiltWithMpi = false;
#else
inline constexpr bool kBuiltWithMpi = true;
#endif

// This process in the world: its rank, the world's size, and its place among the ranks of its node.
struct WorldPlace {
    int rank = 0;
    int size = 1;
    int local_rank = 0;  // among the processes of this machine
    int local_size = 1;
};

// Joins the world (initializes MPI on the first call) and says where this process sits.
WorldPlace join_world();

// Finalizes MPI when it is initialized and not yet finalized (idempotent; nothing without MPI).
void finalize_world();

// Ends every rank of the job with `code` when MPI is running with more than one rank, so that no
// peer waits forever for this one; returns (doing nothing) otherwise. A rank whose MPI_Abort has not
// ended it kAbortSelfExitAfterS later (the launcher or this host's MPI daemon unreachable) prints one
// line naming its rank and host and exits with kAbortSelfExitCode: it never depends on the launcher
// to die.
inline constexpr double kAbortSelfExitAfterS = 10.0;
inline constexpr int kAbortSelfExitCode = 69;  // EX_UNAVAILABLE: the launcher could not end the job
void abort_world(int code);

// When the job's launcher tears it down (a rank died), print one line naming the dead local peers
// before exiting (MpiSession::install_termination_reporter). Only with MPI running and > 1 rank.
void report_dead_peers_on_termination();

// The MPI library's name and version ("Open MPI v4.1.2"), or "not built (single rank only)".
std::string mpi_library_name();

// Every rank's string, gathered on rank 0 in rank order; other ranks get an empty vector.
std::vector<std::string> gather_strings_to_root(const std::string& mine);

// Rank 0's `value` on every rank.
int broadcast_int_from_root(int value);

}  // namespace lattice
