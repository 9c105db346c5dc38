// Watchdog: how lattice turns "a peer never answers" into an Error that names the peer, without a
// watchdog thread.
//
// Design (why no background thread): MPI is initialized FUNNELED, so only the main thread may call
// MPI; a watchdog thread would need MPI_THREAD_MULTIPLE (slow paths in OpenMPI, not always built)
// and could not cancel a blocking MPI_Allreduce anyway. Instead every operation that can wait on a
// peer is started non-blocking (MPI_Iallreduce, MPI_Isend/Irecv, MPI_Ibarrier, ...) and completed
// by poll_request(): MPI_Test in a loop with a deadline. The loop spins for `spin_us`, then
// sched_yield()s until `yield_us`, then sleeps in growing steps (short ones, up to `short_sleep_us`,
// for the first `long_wait_us`, then up to `max_sleep_us`; WaitPacer), so 4 ranks on 2 cores still
// make progress while latency stays in microseconds when ranks arrive together.
//
// Naming the culprit: every MpiComm owns a control communicator (a dup of its data communicator)
// registered here as a ControlChannel. While any rank polls (in any operation, on any
// communicator) it also answers "pings" on every channel with a PeerReport: how many calls it has
// started on that communicator and what it is blocked in right now (communicator, op, call number,
// peer). When an operation times out, the rank pings the peers involved and waits a short grace
// period for reports. Peers that answer and wait in the same call are innocent; a peer that answers
// from a different call/communicator is named with what it is doing (mismatched collectives or a
// cross-communicator deadlock); a peer that does not answer is checked with kill(pid, 0) + /proc
// when it runs on this machine ("dead" vs "alive: busy outside communication, or hung"), or named
// with its host otherwise. A communicator that timed out is broken: later calls throw at once.
//
// A rank that dies under OpenMPI's default policy makes the launcher SIGTERM every other rank at
// once; the termination reporter (opt-in signal handler) then prints which local peers are dead.
#pragma once

#include <mpi.h>

#include "parallel/wait_policy.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace lattice {

enum class WaitResult { kDone, kTimedOut, kMpiError };

// Polls `req` (MPI_Test) until it completes or `timeout_s` passes, answering liveness pings on
// every ControlChannel meanwhile. On kMpiError, *mpi_rc holds the code. `status` may be
// MPI_STATUS_IGNORE.
WaitResult poll_request(MPI_Request* req, MPI_Status* status, const WaitPolicy& policy, int* mpi_rc);

// The pacing of one waiting loop (poll_request's, ShmExchange's): call next() after each failed
// check; it returns false once policy.timeout_s has passed, else answers pings on every
// ControlChannel (at most every 1 ms) and spins, yields or sleeps as the policy says.
class WaitPacer {
public:
    explicit WaitPacer(const WaitPolicy& policy);
    bool next();

private:
    Backoff backoff_;
    double timeout_us_;
    std::chrono::steady_clock::time_point last_service_;
};

// What a rank is blocked in right now; published in PeerReports. Set by MpiComm around each call.
struct Activity {
    char comm[40] = {0};  // communicator name ("" = not inside a communication call)
    char op[24] = {0};
    int32_t call = 0;   // call number on that communicator (1-based)
    int32_t peer = -1;  // peer rank in that communicator for send/recv, -1 for collectives
};
void set_activity(const std::string& comm, const char* op, int call, int peer);
void clear_activity();

// A peer's answer to a ping (fixed layout: sent as bytes).
struct PeerReport {
    int32_t calls_started = 0;  // calls the peer has started on the pinged communicator
    int32_t pad = 0;
    Activity now;  // what the peer is blocked in
};

// Control communicator of one MpiComm. Registered process-wide while alive so that every polling
// loop answers its pings. Not copyable; owns `ctl` (freed in the destructor while MPI is active).
class ControlChannel {
public:
    ControlChannel(MPI_Comm ctl, const int* calls_started);
    ~ControlChannel();
    ControlChannel(const ControlChannel&) = delete;
    ControlChannel& operator=(const ControlChannel&) = delete;

    // Answers pending pings on this channel.
    void service();
    // Pings `peers` (ranks of the channel's communicator) and waits up to `grace_s` for their
    // reports (answering others' pings meanwhile). Entry i is empty when peers[i] did not answer.
    std::vector<std::optional<PeerReport>> probe(const std::vector<int>& peers, double grace_s);

private:
    void reap();

    MPI_Comm ctl_;
    const int* calls_started_;
    std::vector<MPI_Request> pending_;                      // answers in flight
    std::vector<std::unique_ptr<PeerReport>> pending_buf_;  // their buffers (same index)
    int32_t ping_buf_ = 0;
    bool probed_ = false;
};

// Answers pings on every registered channel (called by poll_request).
void service_all_channels();

// Liveness of a process on this machine: 1 alive, 0 dead (gone, zombie, or pid reused: start time
// differs), -1 unknown. Async-signal-safe (kill, open, read).
int local_process_alive(int pid, uint64_t start_ticks);
// Start time (field 22 of /proc/<pid>/stat), 0 when unreadable. Async-signal-safe.
uint64_t process_start_ticks(int pid);

// Peer table for the termination reporter: `lines[i]` describes world rank i; `local[i]` says
// whether it can be checked from here. Installs SIGTERM/SIGINT/SIGHUP handlers.
void install_termination_handlers(const std::string& self, int self_rank, const std::vector<int>& pids,
                                  const std::vector<uint64_t>& start_ticks, const std::vector<bool>& local,
                                  const std::vector<std::string>& lines);

}  // namespace lattice
