// ShmExchange: the shared-memory fast path of MpiComm's all_reduce_sum and all_gather when every
// rank of a communicator runs on this machine (CPU tensor parallelism within a node).
//
// Why by hand: a decode step of an L-layer model all-reduces one token's hidden row (8-32 KiB)
// 2 L times. OpenMPI 4.1's non-blocking MPI_Iallreduce over shared memory (libnbc over the vader
// BTL) takes 7-14 us for 8 KiB between two ranks, nearly all of it protocol, and the blocking
// MPI_Allreduce (3 us) cannot be bounded by the watchdog. Here each rank copies its part into its
// own slot of one shared mapping, publishes a sequence number, and reads every peer's slot once
// that peer's number has arrived (vLLM's CPU backend does the same, for the same reason).
// benchmarks/run.py allreduce measures both (--comm mpi vs mpi-noshm).
//
// Layout: one POSIX shared-memory object for the group; rank r's region at r * region_bytes():
// a 64-byte line holding its flag (the last call it published) and the byte count of each slot's
// message (so a rank that passed another count is named, not summed), then two slots of kSlotBytes.
// Invariants (no locks):
//   - call s of a rank writes only slot s % 2 of its own region, then stores flag = s (release);
//   - a rank reads a peer's slot of call s only after loading that peer's flag >= s (acquire);
//   - a rank starts call s + 2 (overwriting slot s % 2) only after it saw every peer's flag >= s + 1,
//     i.e. after every peer finished reading call s: two slots suffice.
// Every rank of the group must make the same calls in the same order (as with any collective).
// Lifetime: rank 0 creates the object under a fresh name, the others open it, and rank 0 unlinks the
// name once every rank has it mapped (MpiComm does that handshake), so nothing is left in /dev/shm
// when a rank dies. A peer that never publishes is a timeout (wait_all returns who is behind; the
// caller names it through the watchdog), never a hang.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/wait_policy.h"

namespace lattice {

class ShmExchange {
public:
    static constexpr int64_t kSlotBytes = int64_t(1) << 20;  // per message chunk and rank

    // Rank 0: creates `name` (O_EXCL) sized for `ranks`; others: opens it. nullptr and *err set when
    // the object cannot be made or mapped (no /dev/shm, limits): the caller falls back to MPI.
    static std::unique_ptr<ShmExchange> create(const std::string& name, int ranks, int rank, std::string* err);
    static std::unique_ptr<ShmExchange> open(const std::string& name, int ranks, int rank, std::string* err);
    ~ShmExchange();
    ShmExchange(const ShmExchange&) = delete;
    ShmExchange& operator=(const ShmExchange&) = delete;

    // Removes the name (rank 0, once every rank has mapped the object); the mapping stays.
    void unlink();

    int ranks() const { return ranks_; }
    // This rank's slot of call `seq` (seq >= 1, consecutive per group), kSlotBytes long.
    void* my_slot(uint64_t seq) { return slot_ptr(rank_, seq); }
    // Publishes call `seq`: its slot holds `bytes` bytes of message.
    void publish(uint64_t seq, int64_t bytes);
    // The byte count rank r published for call `seq` (after wait_all(seq) returned no laggards: a
    // peer may publish seq + 1 meanwhile, but that goes to the other slot's count).
    int64_t bytes(int r, uint64_t seq) const { return header(r)->bytes[seq & 1]; }
    // Rank r's slot of call `seq`: readable once wait_all(seq) returned no laggards.
    const void* slot(int r, uint64_t seq) const { return slot_ptr(r, seq); }
    // Waits (spin, yield, then sleep, as poll_request; answering watchdog pings) until every rank
    // published `seq` or policy.timeout_s passed. Returns the ranks still behind (empty: done).
    std::vector<int> wait_all(uint64_t seq, const WaitPolicy& policy) const;

    static int64_t region_bytes() { return kLine + 2 * kSlotBytes; }

private:
    static constexpr int64_t kLine = 64;
    ShmExchange(void* base, int64_t bytes, int ranks, int rank, std::string name);
    static std::unique_ptr<ShmExchange> map(const std::string& name, int ranks, int rank, bool make, std::string* err);
    char* slot_ptr(int r, uint64_t seq) const {
        return base_ + int64_t(r) * region_bytes() + kLine + int64_t(seq & 1) * kSlotBytes;
    }
    struct Header {
        std::atomic<uint64_t> flag;  // the last call published
        int64_t bytes[2];            // message bytes of the call in slot 0 / 1 (written before the flag)
    };
    static_assert(sizeof(Header) <= kLine);
    Header* header(int r) const { return reinterpret_cast<Header*>(base_ + int64_t(r) * region_bytes()); }
    std::atomic<uint64_t>* flag(int r) const { return &header(r)->flag; }

    char* base_;
    int64_t bytes_;
    int ranks_;
    int rank_;
    std::string name_;
};

}  // namespace lattice
