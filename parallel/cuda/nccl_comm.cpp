// NcclComm implementation: see nccl_comm.h for the creation and never-hang protocol.
#include "parallel/cuda/nccl_comm.h"

#include <chrono>
#include <thread>

#include "base/cuda_check.h"
#include "base/error.h"
#include "parallel/wait_policy.h"

namespace lattice {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t) {
    switch (t) {
        case DType::kF32:
            return ncclFloat32;
        case DType::kF16:
            return ncclFloat16;
        case DType::kBF16:
            return ncclBfloat16;
        case DType::kI32:
            return ncclInt32;
        case DType::kI8:
            return ncclInt8;
        case DType::kU8:
            return ncclUint8;
        case DType::kI64:
            return ncclInt64;
        default:
            LATTICE_FAIL("NcclComm: dtype {} has no NCCL type", dtype_name(t));
    }
}

// Spin, then yield, then sleep in growing steps: microsecond latency when the op is quick,
// little CPU when it is not.
double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

NcclComm::NcclComm(Communicator& host, cudaStream_t stream, int device, std::string name, double timeout_s)
    : stream_(stream), device_(device), name_(std::move(name)), timeout_s_(timeout_s) {
    rank_ = host.rank();
    size_ = host.size();
    CUDA_CHECK(cudaSetDevice(device));
    ncclUniqueId id{};
    if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    // The host group's broadcast runs under its own deadline (a missing rank 0 becomes an Error).
    host.broadcast(View::contiguous(&id, DType::kU8, {int64_t(sizeof(id))}), 0);

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    NCCL_CHECK(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config));
    poll_async("init", -1);
    CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
}

NcclComm::~NcclComm() {
    if (event_) cudaEventDestroy(event_);
    if (!comm_) return;
    if (broken_) {
        ncclCommAbort(comm_);
        return;
    }
    // Bounded teardown: finalize (non-blocking), poll, and abort instead of waiting forever.
    ncclResult_t r = ncclCommFinalize(comm_);
    const auto t0 = Clock::now();
    Backoff b{WaitPolicy{}};
    while (r == ncclSuccess || r == ncclInProgress) {
        ncclResult_t st = ncclSuccess;
        ncclCommGetAsyncError(comm_, &st);
        if (st != ncclInProgress) {
            r = st;
            break;
        }
        if (seconds_since(t0) > timeout_s_) {
            r = ncclInternalError;
            break;
        }
        b.pause();
    }
    if (r == ncclSuccess)
        ncclCommDestroy(comm_);
    else
        ncclCommAbort(comm_);
}

bool NcclComm::capturing() const {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream_, &st));
    return st != cudaStreamCaptureStatusNone;
}

void NcclComm::fail(const char* op, int peer, const std::string& why) {
    if (comm_ && !broken_) ncclCommAbort(comm_);  // makes the stuck NCCL kernels return
    comm_ = nullptr;
    broken_ = true;
    const std::string who = peer >= 0 ? fmt::format(", peer rank {}", peer) : std::string();
    LATTICE_FAIL("NCCL {} #{} on '{}' (rank {}/{}, device {}{}): {}; communicator aborted", op, calls_, name_, rank_,
                 size_, device_, who, why);
}

void NcclComm::poll_async(const char* op, int peer) {
    const auto t0 = Clock::now();
    Backoff b{WaitPolicy{}};
    for (;;) {
        ncclResult_t st = ncclSuccess;
        const ncclResult_t r = ncclCommGetAsyncError(comm_, &st);
        if (r != ncclSuccess) fail(op, peer, fmt::format("ncclCommGetAsyncError: {}", ncclGetErrorString(r)));
        if (st == ncclSuccess) return;
        if (st != ncclInProgress)
            fail(op, peer, fmt::format("{} ({})", ncclGetErrorString(st), ncclGetLastError(comm_)));
        if (seconds_since(t0) > timeout_s_)
            fail(op, peer, fmt::format("not started after {} s (a peer is missing or stuck)", timeout_s_));
        b.pause();
    }
}

void NcclComm::wait_event(const char* op, int peer) {
    const auto t0 = Clock::now();
    Backoff b{WaitPolicy{}};
    for (;;) {
        const cudaError_t e = cudaEventQuery(event_);
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) fail(op, peer, fmt::format("CUDA error {}", cudaGetErrorString(e)));
        ncclResult_t st = ncclSuccess;
        ncclCommGetAsyncError(comm_, &st);
        if (st != ncclSuccess && st != ncclInProgress)
            fail(op, peer, fmt::format("{} ({})", ncclGetErrorString(st), ncclGetLastError(comm_)));
        if (seconds_since(t0) > timeout_s_)
            fail(op, peer,
                 fmt::format("did not complete within {} s ({})", timeout_s_,
                             peer >= 0 ? "that peer is dead or stuck" : "a peer of the group is dead or stuck"));
        b.pause();
    }
}

void NcclComm::begin(const char* op, int peer) {
    LATTICE_CHECK(!broken_, "NCCL {} on '{}' (rank {}/{}): communicator was aborted by an earlier failure", op, name_,
                  rank_, size_);
    LATTICE_CHECK(peer < size_, "NCCL {} on '{}': peer {} of a {}-rank group", op, name_, peer, size_);
    ++calls_;
}

void NcclComm::finish(const char* op, int peer, ncclResult_t enqueue_result) {
    if (enqueue_result != ncclSuccess && enqueue_result != ncclInProgress)
        fail(op, peer, fmt::format("{} ({})", ncclGetErrorString(enqueue_result), ncclGetLastError(comm_)));
    poll_async(op, peer);
    if (mode_ == WaitMode::kDeferred || capturing()) return;
    CUDA_CHECK(cudaEventRecord(event_, stream_));
    wait_event(op, peer);
}

void NcclComm::wait_idle() {
    LATTICE_CHECK(!broken_, "NcclComm '{}': communicator was aborted by an earlier failure", name_);
    if (capturing()) return;  // inside a graph capture nothing runs: the replay's caller waits
    CUDA_CHECK(cudaEventRecord(event_, stream_));
    wait_event("wait_idle", -1);
}

void NcclComm::check_view(const View& v, const char* op, const char* which) const {
    LATTICE_CHECK(v.device == Device::kCuda && v.is_contiguous() && (v.data || v.numel() == 0),
                  "NCCL {} on '{}': {} must be a contiguous device tensor", op, name_, which);
}

void NcclComm::all_reduce_sum(const View& inout) {
    check_view(inout, "all_reduce_sum", "inout");
    begin("all_reduce_sum", -1);
    finish(
        "all_reduce_sum", -1,
        ncclAllReduce(inout.data, inout.data, size_t(inout.numel()), nccl_type(inout.dtype), ncclSum, comm_, stream_));
}

void NcclComm::all_gather(const View& out, const View& in) {
    check_view(out, "all_gather", "out");
    check_view(in, "all_gather", "in");
    LATTICE_CHECK(out.dtype == in.dtype && out.numel() == in.numel() * size_,
                  "NCCL all_gather on '{}': out has {} elements, expected {} x {}", name_, out.numel(), size_,
                  in.numel());
    begin("all_gather", -1);
    finish("all_gather", -1, ncclAllGather(in.data, out.data, size_t(in.numel()), nccl_type(in.dtype), comm_, stream_));
}

void NcclComm::reduce_scatter_sum(const View& out, const View& in) {
    check_view(out, "reduce_scatter_sum", "out");
    check_view(in, "reduce_scatter_sum", "in");
    LATTICE_CHECK(out.dtype == in.dtype && in.numel() == out.numel() * size_,
                  "NCCL reduce_scatter_sum on '{}': in has {} elements, expected {} x {}", name_, in.numel(), size_,
                  out.numel());
    begin("reduce_scatter_sum", -1);
    finish("reduce_scatter_sum", -1,
           ncclReduceScatter(in.data, out.data, size_t(out.numel()), nccl_type(in.dtype), ncclSum, comm_, stream_));
}

void NcclComm::broadcast(const View& inout, int root) {
    check_view(inout, "broadcast", "inout");
    LATTICE_CHECK(root >= 0 && root < size_, "NCCL broadcast on '{}': root {} of {}", name_, root, size_);
    begin("broadcast", -1);
    finish("broadcast", -1,
           ncclBroadcast(inout.data, inout.data, size_t(inout.numel()), nccl_type(inout.dtype), root, comm_, stream_));
}

void NcclComm::send(const View& in, int peer) {
    check_view(in, "send", "in");
    LATTICE_CHECK(peer >= 0 && peer != rank_, "NCCL send on '{}': bad peer {}", name_, peer);
    begin("send", peer);
    finish("send", peer, ncclSend(in.data, size_t(in.numel()), nccl_type(in.dtype), peer, comm_, stream_));
}

void NcclComm::recv(const View& out, int peer) {
    check_view(out, "recv", "out");
    LATTICE_CHECK(peer >= 0 && peer != rank_, "NCCL recv on '{}': bad peer {}", name_, peer);
    begin("recv", peer);
    finish("recv", peer, ncclRecv(out.data, size_t(out.numel()), nccl_type(out.dtype), peer, comm_, stream_));
}

void NcclComm::barrier() {
    // NCCL has no barrier: a 1-element all-reduce on a scratch int, then a bounded wait.
    int32_t* d = nullptr;
    CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&d), 4, stream_));
    CUDA_CHECK(cudaMemsetAsync(d, 0, 4, stream_));
    begin("barrier", -1);
    const ncclResult_t r = ncclAllReduce(d, d, 1, ncclInt32, ncclSum, comm_, stream_);
    if (r != ncclSuccess && r != ncclInProgress) fail("barrier", -1, ncclGetErrorString(r));
    poll_async("barrier", -1);
    CUDA_CHECK(cudaFreeAsync(d, stream_));
    CUDA_CHECK(cudaEventRecord(event_, stream_));
    wait_event("barrier", -1);
}

}  // namespace lattice
