// NcclComm under mpirun -np 2: every collective and send/recv on device buffers with exact
// expected values (f32, bf16, i32), then the never-hang path: a rank that skips a collective makes
// the other rank's call throw an Error naming the op and rank within the timeout (communicator
// aborted). Needs one CUDA device per rank; otherwise every rank prints the skip message.
#include <chrono>
#include <thread>

#include "tests/kernels/cuda/cuda_test_util.h"
#include "parallel/cuda/nccl_comm.h"
#include "parallel/mpi_comm.h"
#include "parallel/mpi_session.h"

using namespace lattice;
using namespace lattice::test;

namespace {

struct Ctx {
    int rank = 0, size = 1;
    cudaStream_t stream = nullptr;
};

bool setup(Ctx& c) {
    mpi_session();
    MPI_Comm_rank(MPI_COMM_WORLD, &c.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c.size);
    REQUIRE(cuda_devices() >= c.size);  // the test main skips (exit 77) with fewer devices
    CUDA_OK(cudaSetDevice(c.rank));
    CUDA_OK(cudaStreamCreate(&c.stream));
    return true;
}

View dview(DevBuf& b, DType t, int64_t n) {
    return View::contiguous(b.get(), t, {n}, Device::kCuda);
}

}  // namespace

TEST_CASE("NcclComm collectives and send/recv are exact" * doctest::test_suite("cuda")) {
    Ctx c;
    if (!setup(c)) return;
    MpiComm host(MPI_COMM_WORLD, "host");
    NcclComm comm(host, c.stream, c.rank, "test", 30.0);
    REQUIRE(comm.size() == c.size);
    const int64_t n = 1003;  // not a multiple of anything NCCL likes

    std::vector<float> a(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) a[size_t(i)] = float(c.rank + 1) * float(i % 17);
    DevBuf da(a);
    comm.all_reduce_sum(dview(da, DType::kF32, n));
    std::vector<float> got = da.download<float>(size_t(n));
    const float ranks_sum = float(c.size * (c.size + 1) / 2);
    for (int64_t i = 0; i < n; ++i) REQUIRE(got[size_t(i)] == ranks_sum * float(i % 17));

    std::vector<uint16_t> b(size_t(n), f32_to_bf16(float(c.rank + 1)));  // small integers: exact in bf16
    DevBuf db(b);
    comm.all_reduce_sum(dview(db, DType::kBF16, n));
    for (uint16_t v : db.download<uint16_t>(size_t(n))) REQUIRE(bf16_to_f32(v) == ranks_sum);

    std::vector<int32_t> mine(size_t(n), c.rank * 1000 + 7);
    DevBuf dm(mine), dall(size_t(n * c.size) * 4);
    comm.all_gather(dview(dall, DType::kI32, n * c.size), dview(dm, DType::kI32, n));
    std::vector<int32_t> all = dall.download<int32_t>(size_t(n * c.size));
    for (int r = 0; r < c.size; ++r)
        for (int64_t i = 0; i < n; ++i) REQUIRE(all[size_t(r * n + i)] == r * 1000 + 7);

    std::vector<int32_t> big(static_cast<size_t>(n * c.size));
    for (size_t i = 0; i < big.size(); ++i) big[i] = int32_t(i) + c.rank;
    DevBuf dbig(big), dpart(size_t(n) * 4);
    comm.reduce_scatter_sum(dview(dpart, DType::kI32, n), dview(dbig, DType::kI32, n * c.size));
    std::vector<int32_t> part = dpart.download<int32_t>(size_t(n));
    for (int64_t i = 0; i < n; ++i)
        REQUIRE(part[size_t(i)] == c.size * int32_t(c.rank * n + i) + c.size * (c.size - 1) / 2);

    std::vector<int32_t> bc(size_t(n), c.rank == 1 ? 42 : -1);
    DevBuf dbc(bc);
    comm.broadcast(dview(dbc, DType::kI32, n), 1 % c.size);
    for (int32_t v : dbc.download<int32_t>(size_t(n))) REQUIRE(v == (c.size > 1 ? 42 : -1));

    if (c.size >= 2) {  // ring: send to next, receive from previous
        std::vector<int32_t> s(size_t(n), c.rank + 100);
        DevBuf ds(s), dr(size_t(n) * 4);
        const int next = (c.rank + 1) % c.size, prev = (c.rank + c.size - 1) % c.size;
        if (c.rank % 2 == 0) {
            comm.send(dview(ds, DType::kI32, n), next);
            comm.recv(dview(dr, DType::kI32, n), prev);
        } else {
            comm.recv(dview(dr, DType::kI32, n), prev);
            comm.send(dview(ds, DType::kI32, n), next);
        }
        for (int32_t v : dr.download<int32_t>(size_t(n))) REQUIRE(v == prev + 100);
    }
    comm.barrier();
    CHECK_THROWS_AS(comm.send(dview(da, DType::kF32, n), c.rank), Error);  // self is not a peer
}

TEST_CASE("NcclComm: a missing peer is an Error within the timeout, never a hang" * doctest::test_suite("cuda")) {
    Ctx c;
    if (!setup(c)) return;
    if (c.size < 2) return;
    {
        MpiComm host(MPI_COMM_WORLD, "host");
        NcclComm comm(host, c.stream, c.rank, "timeout-test", 30.0);
        comm.set_timeout(3.0);
        DevBuf d(size_t(64) * 4);
        if (c.rank == 0) {
            const auto t0 = std::chrono::steady_clock::now();
            std::string msg;
            try {
                comm.all_reduce_sum(dview(d, DType::kF32, 64));
            } catch (const Error& e) {
                msg = e.what();
            }
            const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            INFO(msg);
            CHECK(msg.find("all_reduce_sum") != std::string::npos);
            CHECK(msg.find("rank 0/") != std::string::npos);
            CHECK(msg.find("aborted") != std::string::npos);
            CHECK(waited < 20.0);
            CHECK(comm.broken());
            CHECK_THROWS_AS(comm.all_reduce_sum(dview(d, DType::kF32, 64)), Error);  // stays broken
        } else {
            std::this_thread::sleep_for(std::chrono::seconds(6));  // never joins the all-reduce
        }
    }  // destructors: bounded finalize, abort on failure
    MPI_Barrier(MPI_COMM_WORLD);
}
