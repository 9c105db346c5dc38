// NcclComm: Communicator over NCCL on device memory (Device::kCuda, contiguous views), enqueued on
// the compute stream given at construction (the backend's), so all-reduces stay ordered with the
// kernels and can be captured into the decode CUDA graph.
//
// Creation (collective over the host group `host`, e.g. an MpiComm over the same ranks): rank 0
// makes the ncclUniqueId, the host group broadcasts it (under that group's deadline, so a missing
// rank is an Error), then a non-blocking ncclCommInitRankConfig is polled against timeout_s.
//
// Never a hang: the communicator is non-blocking (config.blocking = 0). After each call NCCL's
// enqueue state is polled with ncclCommGetAsyncError, then (outside graph capture, in the default
// kEachCall mode) completion is polled with cudaEventQuery + ncclCommGetAsyncError against
// timeout_s. On an NCCL error or timeout the communicator is aborted (ncclCommAbort: the stuck
// kernels exit) and an Error names this rank, the op, the call number and, for send/recv, the peer;
// later calls throw at once. kDeferred mode skips the per-call completion wait (full asynchrony);
// the caller must then call wait_idle() before any host-blocking stream sync.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "parallel/communicator.h"

namespace lattice {

class NcclComm final : public Communicator {
public:
    enum class WaitMode { kEachCall, kDeferred };

    // Collective over `host` (not kept). device: the CUDA ordinal of this rank's backend.
    NcclComm(Communicator& host, cudaStream_t stream, int device, std::string name, double timeout_s = 60.0);
    ~NcclComm() override;
    NcclComm(const NcclComm&) = delete;
    NcclComm& operator=(const NcclComm&) = delete;

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

    void set_wait_mode(WaitMode m) { mode_ = m; }
    void set_timeout(double seconds) override { timeout_s_ = seconds; }
    // Waits (bounded) until everything this communicator enqueued has finished.
    void wait_idle() override;
    bool broken() const { return broken_; }
    ncclComm_t handle() const { return comm_; }

private:
    void begin(const char* op, int peer);
    // Checks the enqueue result, polls the enqueue state, then waits for completion per mode.
    void finish(const char* op, int peer, ncclResult_t enqueue_result);
    void poll_async(const char* op, int peer);  // until not ncclInProgress (bounded)
    void wait_event(const char* op, int peer);  // until event_ done (bounded)
    [[noreturn]] void fail(const char* op, int peer, const std::string& why);
    void check_view(const View& v, const char* op, const char* which) const;
    bool capturing() const;

    ncclComm_t comm_ = nullptr;
    cudaStream_t stream_ = nullptr;
    cudaEvent_t event_ = nullptr;
    int device_ = 0;
    std::string name_;
    double timeout_s_ = 60.0;
    int rank_ = 0;
    int size_ = 1;
    int calls_ = 0;
    bool broken_ = false;
    WaitMode mode_ = WaitMode::kEachCall;
};

}  // namespace lattice
