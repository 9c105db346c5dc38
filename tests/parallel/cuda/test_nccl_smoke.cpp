// NcclComm on one rank and one GPU, no MPI (the GPU machine has none): the NCCL path the 2-rank
// test_nccl_comm cannot take there. The communicator is made the product's way (NcclComm over a host
// group, here LocalComm: ncclGetUniqueId, ncclCommInitRankConfig with a non-blocking ncclConfig_t,
// polled), then every collective runs on device buffers (one rank: each is the identity, checked
// exactly), an all-gather into another buffer and an in-place all-reduce are captured in a CUDA graph
// and replayed with new inputs (the output follows the input, so the captured NCCL kernels ran), and
// the destructor finalizes within its bound. Also reported: the NCCL version of the header this was
// compiled with and of the library loaded (the wheel's), whose major versions must agree.
// Ordering: DevBuf's poisoning memset and upload run on the legacy default stream (cudaMemset is
// asynchronous to the host; a pageable cudaMemcpy may return once the data is staged, before the DMA
// lands), while NCCL and the graph run on a cudaStreamNonBlocking stream, which does NOT wait for the
// legacy stream. So every such host-side preparation is followed by settle() (cudaDeviceSynchronize)
// before the next collective: without it a collective may read the input before its upload lands, or
// the poison may land after a collective wrote the output, and the exact checks fail at random.
#include <nccl.h>

#include "parallel/communicator.h"
#include "parallel/cuda/nccl_comm.h"
#include "tests/kernels/cuda/cuda_test_util.h"

using namespace lattice;
using namespace lattice::test;

namespace {

View dview(const DevBuf& b, DType t, int64_t n) {
    return View::contiguous(b.get(), t, {n}, Device::kCuda);
}

// Legacy-stream work (DevBuf's memset, upload, poison) done before the non-blocking stream runs more.
void settle() {
    CUDA_OK(cudaDeviceSynchronize());
}

}  // namespace

TEST_CASE("NcclComm on one rank: init, collectives, graph capture and replay, finalize" * doctest::test_suite("cuda")) {
    int version = 0;
    REQUIRE(ncclGetVersion(&version) == ncclSuccess);
    MESSAGE("NCCL header " << NCCL_MAJOR << "." << NCCL_MINOR << "." << NCCL_PATCH << ", library " << version / 10000
                           << "." << version / 100 % 100 << "." << version % 100);
    CHECK(version / 10000 == NCCL_MAJOR);
    CUDA_OK(cudaSetDevice(0));
    cudaStream_t stream = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const int64_t n = 1003;
    std::vector<float> a(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) a[size_t(i)] = float(i % 17) - 8.0f;
    {
        LocalComm host;
        NcclComm comm(host, stream, 0, "smoke", 20.0);
        CHECK(comm.rank() == 0);
        CHECK(comm.size() == 1);
        DevBuf in(a), out(size_t(n) * 4);
        settle();
        comm.all_reduce_sum(dview(in, DType::kF32, n));
        CHECK(in.download<float>(size_t(n)) == a);
        comm.all_gather(dview(out, DType::kF32, n), dview(in, DType::kF32, n));
        CHECK(out.download<float>(size_t(n)) == a);
        out.poison();
        settle();
        comm.reduce_scatter_sum(dview(out, DType::kF32, n), dview(in, DType::kF32, n));
        CHECK(out.download<float>(size_t(n)) == a);
        comm.broadcast(dview(in, DType::kF32, n), 0);
        CHECK(in.download<float>(size_t(n)) == a);
        comm.barrier();

        // Captured: out = all_gather(in); out = all_reduce(out). Replayed with new inputs.
        out.poison();
        settle();
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        comm.all_gather(dview(out, DType::kF32, n), dview(in, DType::kF32, n));
        comm.all_reduce_sum(dview(out, DType::kF32, n));
        CUDA_OK(cudaStreamEndCapture(stream, &graph));
        CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
        for (int r = 0; r < 3; ++r) {
            INFO("replay " << r);
            std::vector<float> b(static_cast<size_t>(n));
            for (int64_t i = 0; i < n; ++i) b[size_t(i)] = float((i * (r + 3)) % 101) - 50.0f;
            in.upload(b);
            settle();
            CUDA_OK(cudaGraphLaunch(exec, stream));
            comm.wait_idle();
            CUDA_OK(cudaStreamSynchronize(stream));
            CHECK(out.download<float>(size_t(n)) == b);
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        CHECK(!comm.broken());
    }  // ~NcclComm: ncclCommFinalize polled within the timeout, then ncclCommDestroy
    CHECK(cudaStreamDestroy(stream) == cudaSuccess);
    CHECK(cudaGetLastError() == cudaSuccess);
}
