// MpiComm: Communicator over an MPI communicator, host memory (Device::kCpu, contiguous views).
//
// Types: all_reduce_sum / reduce_scatter_sum take f32 and i32 natively and f16 / bf16 by
// converting to f32, summing in f32 and rounding once at the end (more accurate than summing in
// 16 bits; the host path is for CPUs and tests, NcclComm does the device fast path).
// all_gather, broadcast, send and recv move bytes, so any dtype works. Counts must fit MPI's int,
// except for broadcast / send / recv, which split messages above policy.max_chunk_bytes (1 GiB).
//
// Timeouts (see watchdog.h): every call is started non-blocking and polled against
// policy().timeout_s. On timeout the call throws an Error naming this communicator, the op, the
// call number, and the peer(s) at fault: for send/recv the peer, for collectives the ranks that did
// not answer a liveness ping (dead / alive-but-silent / on another host) or answered from another
// call. After a timeout or MPI error the communicator is broken (later calls throw at once) and
// MPI may still write into the buffers of the failed call: the caller's job is to exit.
//
// Sends are buffered (policy.send_buffers, default 4): send() copies the data, starts the transfer
// and returns, so a pipeline stage can go on computing while the next stage is busy, and a cycle of
// sends (stage ring) cannot deadlock. At most send_buffers sends are in flight; one more waits for
// the oldest. A send still undelivered `timeout_s` after it started fails the next call on this
// communicator (naming the receiver); barrier() first waits for every buffered send. The destructor
// never blocks: sends still in flight are handed to MPI (MPI_Request_free) and their copies kept.
// send_buffers = 0 restores synchronous sends (return when the receiver has matched). Messages
// above max_chunk_bytes are never copied: a size header, then synchronous chunks.
//
// Shared memory: when every rank of the communicator runs on this machine (and
// policy.shared_memory), all_reduce_sum (f32 / i32 / staged f16, bf16) and all_gather go through a
// ShmExchange instead of MPI: the same deadline and the same diagnosis on timeout, sums in rank order
// (every rank gets the same bits), 1 MiB per chunk. Set up in the constructor (bounded handshake);
// when /dev/shm cannot be used, a warning and MPI as before.
//
// Ordering: collectives must be called in the same order on every rank of the communicator
// (MPI rule); send/recv between a pair are non-overtaking (one tag).
// Thread safety: none; call from the thread that initialized MPI.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/mpi_session.h"
#include "parallel/shm_exchange.h"
#include "parallel/watchdog.h"

namespace lattice {

class MpiComm final : public Communicator {
public:
    // Takes ownership of `comm` (freed in the destructor) and sets MPI_ERRORS_RETURN on it.
    // Collective over `comm`: duplicates it for the control channel, bounded by policy.timeout_s.
    MpiComm(MPI_Comm comm, std::string name, const WaitPolicy& policy = {});
    ~MpiComm() override;
    MpiComm(const MpiComm&) = delete;
    MpiComm& operator=(const MpiComm&) = delete;

    // A duplicate of MPI_COMM_WORLD (collective over all ranks; initializes MPI if needed).
    static std::unique_ptr<MpiComm> world(const WaitPolicy& policy = {}, std::string name = "world");
    // MPI_Comm_split of this communicator: ranks with the same color form a group, ordered by key.
    // Collective; starts with a bounded barrier so a missing rank is an Error, not a hang.
    // color < 0: this rank joins no group and gets nullptr.
    std::unique_ptr<MpiComm> split(int color, int key, std::string name);

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string name() const override { return name_; }

    void all_reduce_sum(const View& inout) override;
    void all_gather(const View& out, const View& in) override;
    void reduce_scatter_sum(const View& out, const View& in) override;
    void broadcast(const View& inout, int root) override;
    void send(const View& in, int peer) override;
    void recv(const View& out, int peer) override;
    void barrier() override;
    double send_wait_seconds() const override { return send_wait_s_; }

    MPI_Comm handle() const { return comm_; }
    int world_rank_of(int comm_rank) const { return world_ranks_.at(size_t(comm_rank)); }
    const WaitPolicy& policy() const { return policy_; }
    void set_timeout(double seconds) override { policy_.timeout_s = seconds; }
    bool broken() const { return broken_; }
    int calls_started() const { return calls_; }
    int sends_in_flight() const { return int(sends_.size()); }
    // all_reduce_sum and all_gather use the shared-memory exchange (see above).
    bool shared_memory() const { return shm_ != nullptr; }

private:
    void start_call(const char* op, int peer);
    // Checks the return code of a just-started non-blocking call (error -> broken + Error).
    void issued(int rc, const char* op, const std::string& what, int peer);
    void wait(MPI_Request* req, MPI_Status* status, const char* op, const std::string& what, int peer);
    [[noreturn]] void fail_timeout(const char* op, const std::string& what, int peer, double waited_s);
    [[noreturn]] void fail_mpi(const char* op, const std::string& what, int peer, int rc);
    std::string describe_rank(int comm_rank) const;
    // Buffered sends: complete finished ones; fail on one older than the timeout.
    void reap_sends();
    // Waits for the oldest buffered send (deadline: its start + timeout).
    void wait_oldest_send();
    void leak_inflight();  // after a failure MPI may still touch our buffers
    int64_t chunk_bytes() const;
    void recv_exact(void* dst, int64_t bytes, int peer, const std::string& what, const View& out);
    void check_host(const View& v, const char* op, const char* which) const;
    void reduce_staged(const View& out, const View& in, bool scatter);
    void setup_shared_memory();
    // In-place sum of `count` f32 or i32 elements at `data` over every rank (the communicator's
    // call already started): through shm_ when set, else MPI_Iallreduce.
    void reduce_sum(void* data, int64_t count, DType t, const std::string& what);
    // Publishes this rank's slot of call `seq` (`bytes` long), waits for every peer's, and checks
    // that every rank passed the same count (an Error naming the one that did not).
    void shm_exchange(uint64_t seq, int64_t bytes, const char* op, const std::string& what);

    MPI_Comm comm_ = MPI_COMM_NULL;
    std::string name_;
    WaitPolicy policy_;
    int rank_ = 0;
    int size_ = 1;
    int calls_ = 0;
    double send_wait_s_ = 0;  // send(): waiting for room in the queue / a synchronous match
    bool broken_ = false;
    std::vector<int> world_ranks_;  // comm rank -> world rank
    std::unique_ptr<ControlChannel> ctl_;
    std::vector<float> scratch_;  // f16/bf16 staging, copy of an aliased reduce_scatter input
    struct PendingSend {
        MPI_Request req = MPI_REQUEST_NULL;
        std::vector<char> data;
        int peer = -1;
        int call = 0;
        std::chrono::steady_clock::time_point started;
        std::string what;
    };
    std::deque<PendingSend> sends_;              // oldest first
    std::vector<std::vector<char>> spare_bufs_;  // recycled send copies
    std::unique_ptr<ShmExchange> shm_;           // same-machine groups (see shared_memory())
    uint64_t shm_seq_ = 0;                       // shm_ calls so far (the same on every rank)
    bool shm_no_spin_ = false;                   // more ranks on this machine than cores
};

}  // namespace lattice
