// Timeouts under mpirun -np 3 with a 2 s deadline:
//  - a rank that sleeps instead of joining an all-reduce (over the shared-memory exchange: all ranks
//    run here) is named ("no answer from rank 1", alive; "rank 1 did not arrive") by the others within
//    timeout + grace + slack, and the others name each other as waiting;
//  - two ranks that both recv from each other (a deadlock): the one with the shorter deadline names
//    the other's blocking recv; the other (a deadline 3x longer, so it is certainly still blocked
//    when asked, however loaded the machine) later names whatever the first is doing by then;
//  - a timed-out communicator is broken: the next call throws at once;
//  - communicator creation waits for a late rank up to the setup deadline, not the per-call one.
// Timing assumptions hold on a loaded machine: the late rank sleeps three deadlines past the
// others' timeout, and "reported within" bounds allow seconds of scheduling delay.
// Buffers of a timed-out call are leaked on purpose (MPI may still write them), and the late rank
// completes its call against the others' abandoned requests, so the job ends cleanly.
#include <doctest/doctest.h>

#include <chrono>
#include <thread>

#include "parallel/mpi_comm.h"

using namespace lattice;

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kTimeout = 2.0;

std::unique_ptr<MpiComm> make(const char* name, double timeout, int send_buffers = 4) {
    WaitPolicy p;
    p.timeout_s = timeout;
    p.grace_s = 1.0;
    p.send_buffers = send_buffers;
    return MpiComm::world(p, name);
}

double since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

TEST_CASE("a rank that does not join an all-reduce is named by the others") {
    auto sync = make("sync", 30.0);
    auto a = make("coll", kTimeout);
    REQUIRE(a->size() == 3);
    CHECK(a->shared_memory());  // one machine: the all-reduce waits on the shared-memory exchange
    auto* buf = new std::vector<float>(1000, 1.0f);  // leaked: an abandoned MPI call may write it
    View v = View::contiguous(buf->data(), DType::kF32, {1000});
    sync->barrier();
    if (a->rank() == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(9000));
        // The others abandoned their call, but their requests are still posted: this completes.
        a->all_reduce_sum(v);
        CHECK((*buf)[999] == 3.0f);
    } else {
        auto t0 = Clock::now();
        std::string msg;
        try {
            a->all_reduce_sum(v);
            msg = "completed";
        } catch (const Error& e) {
            msg = e.what();
        }
        const double took = since(t0);
        MESSAGE(msg);
        CHECK(took >= kTimeout);
        CHECK(took < kTimeout + 1.0 + 5.0);  // deadline + grace + slack (well before rank 1 wakes)
        CHECK(msg.find("all_reduce_sum on communicator 'coll'") != std::string::npos);
        CHECK(msg.find("no answer from rank 1") != std::string::npos);
        CHECK(msg.find("shared memory: rank 1 did not arrive") != std::string::npos);
        CHECK(msg.find("the process is alive") != std::string::npos);
        const int other = a->rank() == 0 ? 2 : 0;
        CHECK(msg.find(fmt::format("rank {} is waiting in the same call", other)) != std::string::npos);
        CHECK(a->broken());
        CHECK_THROWS_WITH_AS(a->barrier(), doctest::Contains("broken"), Error);
    }
    sync->barrier();
}

TEST_CASE("two ranks receiving from each other: the first to time out names the other's blocking recv") {
    auto sync = make("sync2", 30.0);
    const int rank = sync->rank();
    auto c = make("p2p", rank == 2 ? 3 * kTimeout : kTimeout);
    sync->barrier();
    if (c->rank() != 1) {
        const int peer = c->rank() == 0 ? 2 : 0;
        auto* buf = new std::vector<int32_t>(16, -1);  // leaked: the recv stays posted
        std::string msg;
        auto t0 = Clock::now();
        try {
            c->recv(View::contiguous(buf->data(), DType::kI32, {16}), peer);
            msg = "completed";
        } catch (const Error& e) {
            msg = e.what();
        }
        MESSAGE(msg);
        CHECK(since(t0) < (rank == 2 ? 3 * kTimeout : kTimeout) + 1.0 + 5.0);
        CHECK(msg.find(fmt::format("recv on communicator 'p2p'")) != std::string::npos);
        CHECK(msg.find(fmt::format("from rank {}", peer)) != std::string::npos);
        CHECK(msg.find(fmt::format("rank {} [pid", peer)) != std::string::npos);
        if (rank == 0)  // rank 2 is still inside its recv (its deadline is 3x longer)
            CHECK(msg.find(fmt::format("is blocked in recv with rank {} (call #1) on 'p2p'", c->rank())) !=
                  std::string::npos);
    }
    sync->barrier();
}

TEST_CASE("a synchronous send nobody receives times out naming what the peer is doing") {
    auto sync = make("sync3", 30.0);
    auto c = make("p2p_send", kTimeout, /*send_buffers=*/0);
    sync->barrier();
    if (c->rank() == 0) {
        // 4 MB: beyond the eager limit, so the send needs the receiver.
        auto* buf = new std::vector<float>(1 << 20, 2.0f);
        std::string msg;
        try {
            c->send(View::contiguous(buf->data(), DType::kF32, {1 << 20}), 1);
            msg = "completed";
        } catch (const Error& e) {
            msg = e.what();
        }
        MESSAGE(msg);
        CHECK(msg.find("send on communicator 'p2p_send'") != std::string::npos);
        // Rank 1 is inside the sync barrier: it answers from there.
        CHECK(msg.find("rank 1 [pid") != std::string::npos);
        CHECK(msg.find("is blocked in barrier") != std::string::npos);
    }
    sync->barrier();
    if (c->rank() == 1) {
        // Drain the abandoned message so the job ends with no half-sent data.
        std::vector<float> sink(1 << 20);
        c->recv(View::contiguous(sink.data(), DType::kF32, {1 << 20}), 0);
        CHECK(sink[12345] == 2.0f);
    }
    sync->barrier();
}

TEST_CASE("a buffered send nobody receives fails the barrier that waits for it, naming the receiver") {
    auto sync = make("sync4", 30.0);
    auto c = make("bsend", kTimeout);
    sync->barrier();
    if (c->rank() == 0) {
        std::vector<float> data(1 << 20, 3.0f);
        auto t0 = Clock::now();
        c->send(View::contiguous(data.data(), DType::kF32, {1 << 20}), 1);
        CHECK(since(t0) < 0.5);  // buffered: returns before anyone receives
        CHECK(c->sends_in_flight() == 1);
        std::fill(data.begin(), data.end(), -1.0f);  // the copy in flight must not see this
        std::string msg;
        try {
            c->barrier();
            msg = "completed";
        } catch (const Error& e) {
            msg = e.what();
        }
        MESSAGE(msg);
        CHECK(since(t0) < kTimeout + 1.0 + 2.0);
        CHECK(msg.find("send on communicator 'bsend'") != std::string::npos);
        CHECK(msg.find("to rank 1 (buffered, call #1)") != std::string::npos);
        CHECK(msg.find("rank 1 [pid") != std::string::npos);
        CHECK(msg.find("is blocked in barrier (call #2) on 'sync4'") != std::string::npos);
        CHECK(c->broken());
    }
    sync->barrier();
    if (c->rank() == 1) {
        std::vector<float> sink(1 << 20);
        c->recv(View::contiguous(sink.data(), DType::kF32, {1 << 20}), 0);
        CHECK(sink[777] == 3.0f);
    }
    sync->barrier();
}

TEST_CASE("in a sub-communicator the silent rank is named with its world rank too") {
    auto sync = make("sync5", 30.0);
    auto w = make("split_parent", kTimeout);
    // World ranks 0 and 2 form 'evens' (comm ranks 0 and 1); world rank 1 is alone in 'odds'.
    auto sub = w->split(w->rank() % 2, w->rank(), w->rank() % 2 ? "odds" : "evens");
    REQUIRE(sub);
    auto* buf = new std::vector<int32_t>(33, 1);  // leaked: an abandoned MPI call may write it
    View v = View::contiguous(buf->data(), DType::kI32, {33});
    sync->barrier();
    if (w->rank() == 0) {
        std::string msg;
        try {
            sub->all_reduce_sum(v);
            msg = "completed";
        } catch (const Error& e) {
            msg = e.what();
        }
        MESSAGE(msg);
        CHECK(msg.find("all_reduce_sum on communicator 'evens' (2 ranks, this is rank 0)") != std::string::npos);
        CHECK(msg.find("no answer from rank 1; rank 1 [world rank 2, pid") != std::string::npos);
    } else if (w->rank() == 2) {
        std::this_thread::sleep_for(std::chrono::milliseconds(3800));
        sub->all_reduce_sum(v);  // completes against rank 0's abandoned request
        CHECK((*buf)[32] == 2);
    }
    sync->barrier();
}

TEST_CASE("creating a communicator waits for a late rank up to setup_timeout_s, not timeout_s") {
    auto sync = make("sync6", 30.0);
    sync->barrier();
    // Rank 1 comes 2 s late (ten of the others' per-call deadlines; a busy machine only makes it later):
    // creation is the ranks' first meeting, which skew at start-up does not fail.
    if (sync->rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2000));
    WaitPolicy p;
    p.timeout_s = 0.2;
    p.setup_timeout_s = 60.0;
    auto c = MpiComm::world(p, "late_start");
    std::vector<int32_t> one(1, 1);
    c->all_reduce_sum(View::contiguous(one.data(), DType::kI32, {1}));
    CHECK(one[0] == 3);
    CHECK(c->policy().timeout_s == 0.2);  // later calls keep the per-call deadline
    sync->barrier();
}
