// MpiComm's shared-memory exchange among the ranks of one host: its setup (one object per communicator,
// chosen by every rank alike) and the all-reduce through it (slots summed in rank order, so every rank
// gets the same bits). Split from mpi_comm.cpp, which holds the MPI calls and the diagnosis of a peer.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

#include "base/log.h"
#include "parallel/mpi_comm.h"
#include "parallel/mpi_comm_internal.h"

namespace lattice {

using mpi_detail::join_ints;
using mpi_detail::wait_setup;

// Rank 0 creates the shared object under a fresh name and broadcasts it; the others map it; a MIN
// over "mapped" makes the choice common (one failure anywhere: everyone stays on MPI); then rank 0
// unlinks the name. These setup messages are not calls of the communicator (calls_ stays 0).
void MpiComm::setup_shared_memory() {
    if (size_ < 2 || !policy_.shared_memory) return;
    const MpiSession& s = mpi_session();
    for (int w : world_ranks_)  // every rank sees the same table, so every rank decides the same
        if (!s.is_local(w)) return;
    char name[64] = {0};
    std::unique_ptr<ShmExchange> x;
    std::string err;
    if (rank_ == 0) {
        static std::atomic<int> serial{0};
        const auto ticks = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
        fmt::format_to_n(name, sizeof(name) - 1, "/lattice-{}-{}-{:x}", int(getpid()), serial++, ticks & 0xffffff);
        x = ShmExchange::create(name, size_, 0, &err);
        if (!x) name[0] = 0;
    }
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_CHECK(MPI_Ibcast(name, int(sizeof(name)), MPI_CHAR, 0, comm_, &req));
    wait_setup(&req, policy_, name_, ": shared-memory name");
    if (rank_ != 0 && name[0]) x = ShmExchange::open(name, size_, rank_, &err);
    int mapped = x ? 1 : 0, all = 0;
    MPI_CHECK(MPI_Iallreduce(&mapped, &all, 1, MPI_INT, MPI_MIN, comm_, &req));
    wait_setup(&req, policy_, name_, ": shared-memory handshake");
    if (x && rank_ == 0) x->unlink();
    if (!err.empty())
        LOG_WARN("communicator '{}': no shared-memory exchange ({}); all-reduces go through MPI", name_, err);
    if (all == 1) shm_ = std::move(x);
    // More ranks here than cores (tests, 4 ranks on 2 cores): a spinning waiter would hold the core
    // the rank it waits for needs, so waits yield at once (4 KiB at np 4 on 2 cores: 77 -> 7 us).
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    shm_no_spin_ = cpus > 0 && s.local_size() > cpus;
}

void MpiComm::shm_exchange(uint64_t seq, int64_t bytes, const char* op, const std::string& what) {
    shm_->publish(seq, bytes);
    WaitPolicy p = policy_;
    if (shm_no_spin_) p.spin_us = 0;
    const std::vector<int> behind = shm_->wait_all(seq, p);
    if (!behind.empty()) {
        broken_ = true;
        fail_timeout(op,
                     fmt::format("{}, shared memory: rank{} {} did not arrive", what, behind.size() > 1 ? "s" : "",
                                 join_ints(behind)),
                     -1, policy_.timeout_s);
    }
    for (int r = 0; r < size_; ++r) {
        if (shm_->bytes(r, seq) == bytes) continue;
        broken_ = true;  // the ranks are out of step: every later call would mis-pair
        clear_activity();
        LATTICE_FAIL("{} on communicator '{}' (call #{}, {}): {} passed {} bytes, this rank {}: every rank must "
                     "pass the same count",
                     op, name_, calls_, what, describe_rank(r), shm_->bytes(r, seq), bytes);
    }
}

namespace {

// out = slot 0 + slot 1 + ... (in rank order, so every rank gets the same bits); T unsigned for i32
// (wrapping like two's complement, no signed overflow).
template <class T>
void sum_slots(T* out, const ShmExchange& x, uint64_t seq, int64_t n) {
    const T* s0 = static_cast<const T*>(x.slot(0, seq));
    const T* s1 = static_cast<const T*>(x.slot(1, seq));
    for (int64_t i = 0; i < n; ++i) out[i] = T(s0[i] + s1[i]);
    for (int r = 2; r < x.ranks(); ++r) {
        const T* sr = static_cast<const T*>(x.slot(r, seq));
        for (int64_t i = 0; i < n; ++i) out[i] = T(out[i] + sr[i]);
    }
}

}  // namespace

void MpiComm::reduce_sum(void* data, int64_t count, DType t, const std::string& what) {
    if (!shm_) {
        MPI_Request req = MPI_REQUEST_NULL;
        issued(MPI_Iallreduce(MPI_IN_PLACE, data, int(count), t == DType::kF32 ? MPI_FLOAT : MPI_INT32_T, MPI_SUM,
                              comm_, &req),
               "all_reduce_sum", what, -1);
        wait(&req, MPI_STATUS_IGNORE, "all_reduce_sum", what, -1);
        return;
    }
    constexpr int64_t per = ShmExchange::kSlotBytes / 4;  // f32 and i32 elements per chunk
    for (int64_t off = 0; off < count; off += per) {
        const int64_t n = std::min(per, count - off);
        const uint64_t seq = ++shm_seq_;
        char* mine = static_cast<char*>(data) + off * 4;
        std::memcpy(shm_->my_slot(seq), mine, size_t(n * 4));
        shm_exchange(seq, n * 4, "all_reduce_sum", what);
        if (t == DType::kF32)
            sum_slots(reinterpret_cast<float*>(mine), *shm_, seq, n);
        else
            sum_slots(reinterpret_cast<uint32_t*>(mine), *shm_, seq, n);
    }
    clear_activity();
}

}  // namespace lattice
