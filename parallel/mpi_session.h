// MpiSession: the process's one MPI initialization (RAII), its place in the world, and what it
// knows about its peers.
//
// - `mpi_session()` initializes MPI on first use (MPI_Init_thread, FUNNELED: only the thread that
//   initialized MPI makes MPI calls; nothing in lattice calls MPI from a second thread) and returns
//   the same object afterwards. Started without mpirun, OpenMPI's singleton init gives a 1-rank
//   world (~0.3 s). If something else already initialized MPI, the session adopts it and leaves
//   MPI_Finalize to its owner.
// - At start-up every rank publishes {pid, process start time, hostname, boot id} with one
//   all-gather (bounded by a timeout). That table lets a rank whose peer stopped answering tell
//   "dead" from "alive but silent" for peers on the same machine (kill(pid, 0) + /proc start time,
//   so a recycled pid is not mistaken for the peer), and name host + pid for every peer.
// - MPI_COMM_WORLD gets MPI_ERRORS_RETURN: MPI failures become lattice::Error via MPI_CHECK, which
//   is never compiled out and reports host, rank and file:line (through LATTICE_FAIL's prefix).
// - process_identity() gets rank and world; tp_rank/pp_rank are set by make_parallel_context.
// Invariants: peers().size() == size(); peers()[rank()] is this process.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"

namespace lattice {

// Message of an MPI error code ("MPI_ERR_TRUNCATE: message truncated").
std::string mpi_error_string(int code);

// Throws lattice::Error (host, rank, file:line, the call and MPI's message) when the call fails.
#define MPI_CHECK(call)                                                                                      \
    do {                                                                                                     \
        int mpi_check_rc_ = (call);                                                                          \
        if (mpi_check_rc_ != MPI_SUCCESS) [[unlikely]]                                                       \
            ::lattice::throw_error(                                                                          \
                __FILE__, __LINE__,                                                                          \
                ::fmt::format("MPI call {} failed: {}", #call, ::lattice::mpi_error_string(mpi_check_rc_))); \
    } while (0)

struct PeerInfo {
    int pid = 0;
    uint64_t start_ticks = 0;  // field 22 of /proc/<pid>/stat: tells a recycled pid from the peer
    std::string host;
    std::string boot_id;  // /proc/sys/kernel/random/boot_id: same machine (and kernel) as us?
    int local_rank = 0;
};

enum class PeerState { kAlive, kDead, kUnknown /* on another machine: cannot look */ };

class MpiSession {
public:
    MpiSession(const MpiSession&) = delete;
    MpiSession& operator=(const MpiSession&) = delete;
    ~MpiSession();

    int rank() const { return rank_; }
    int size() const { return size_; }
    int local_rank() const { return local_rank_; }  // among the ranks of this machine
    int local_size() const { return local_size_; }
    const std::string& host() const { return peers_[size_t(rank_)].host; }
    int thread_level() const { return thread_level_; }
    // MPI_COMM_WORLD (errors return instead of aborting).
    MPI_Comm world() const { return MPI_COMM_WORLD; }

    const std::vector<PeerInfo>& peers() const { return peers_; }
    // Same machine as this process (same boot id and hostname)?
    bool is_local(int world_rank) const;
    // Local peers: alive or dead by kill(pid, 0) and /proc; remote peers: kUnknown.
    PeerState peer_state(int world_rank) const;
    // "world rank 3 (pid 4242 on node7)".
    std::string describe_peer(int world_rank) const;

    // Finalizes MPI now if this session initialized it (idempotent; communicators must be gone).
    void finalize();

    // Installs SIGTERM/SIGINT/SIGHUP handlers that, when the launcher tears the job down (OpenMPI's
    // daemon SIGTERMs every rank when one dies), print one line naming the local peers that are
    // dead, then _exit(128 + signal). Async-signal-safe (lines preformatted here). Opt-in: launch/
    // calls it; library code never installs handlers on its own.
    void install_termination_reporter();

private:
    MpiSession();
    friend MpiSession& mpi_session();

    bool owns_init_ = false;
    int thread_level_ = 0;
    int rank_ = 0;
    int size_ = 1;
    int local_rank_ = 0;
    int local_size_ = 1;
    std::vector<PeerInfo> peers_;
};

// The process's session; initializes MPI on first call. Throws Error when MPI cannot start.
MpiSession& mpi_session();

// True when MPI is initialized and not yet finalized.
bool mpi_active();

}  // namespace lattice
