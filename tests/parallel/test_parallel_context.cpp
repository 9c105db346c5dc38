// make_parallel_context under mpirun -np 1/2/4: for every (tp, pp) in {1..4}^2 either the layout is
// valid (tp * pp == world) and the TP / PP / world groups contain exactly the ranks the header
// promises (checked with sums of world ranks and a stage-to-stage send), or every rank throws the
// same message and nobody hangs.
#include <doctest/doctest.h>

#include <algorithm>

#include "parallel/mpi_comm.h"
#include "parallel/mpi_session.h"
#include "parallel/parallel_context.h"

using namespace lattice;

namespace {

std::string body(const std::string& s) {
    size_t p = s.find("] ");
    return p == std::string::npos ? s : s.substr(p + 2);
}

View vi(std::vector<int32_t>& v) {
    return View::contiguous(v.data(), DType::kI32, {int64_t(v.size())});
}

MpiComm& checker() {
    static std::unique_ptr<MpiComm> w = [] {
        WaitPolicy p;
        p.timeout_s = 20.0;
        return MpiComm::world(p, "checker");
    }();
    return *w;
}

// True when every rank passes the same string.
bool same_on_every_rank(const std::string& s) {
    MpiComm& w = checker();
    std::vector<int32_t> len(1, int32_t(s.size())), lens(size_t(w.size()));
    w.all_gather(vi(lens), vi(len));
    for (int32_t l : lens)
        if (l != len[0]) return false;
    std::vector<char> mine(s.begin(), s.end()), all(s.size() * size_t(w.size()));
    if (s.empty()) return true;
    w.all_gather(View::contiguous(all.data(), DType::kI8, {int64_t(all.size())}),
                 View::contiguous(mine.data(), DType::kI8, {int64_t(mine.size())}));
    for (int r = 0; r < w.size(); ++r)
        if (std::string(all.begin() + r * long(s.size()), all.begin() + (r + 1) * long(s.size())) != s) return false;
    return true;
}

}  // namespace

TEST_CASE("make_parallel_context: every (tp, pp) in 1..4 x 1..4") {
    const int world = checker().size();
    const int me = checker().rank();
    for (int tp = 1; tp <= 4; ++tp) {
        for (int pp = 1; pp <= 4; ++pp) {
            CAPTURE(tp);
            CAPTURE(pp);
            if (tp * pp != world) {
                std::string msg;
                try {
                    ParallelContext bad = make_parallel_context(tp, pp, 10.0);
                    msg = "accepted";
                } catch (const Error& e) {
                    msg = body(e.what());
                }
                CHECK(msg.find(fmt::format("world size {} != tp {} x pp {}", world, tp, pp)) != std::string::npos);
                CHECK(same_on_every_rank(msg));
                continue;
            }
            ParallelContext ctx = make_parallel_context(tp, pp, 10.0);
            const WorldConfig& w = ctx.world;
            REQUIRE(w.world == world);
            REQUIRE(w.rank == me);
            CHECK(process_identity().tp_rank == w.tp_rank());
            CHECK(process_identity().pp_rank == w.pp_rank());
            REQUIRE(ctx.tp->size() == tp);
            REQUIRE(ctx.tp->rank() == w.tp_rank());
            REQUIRE(ctx.pp_world->size() == pp);
            REQUIRE(ctx.pp_world->rank() == w.pp_rank());
            REQUIRE(ctx.world_comm->size() == world);
            REQUIRE(ctx.world_comm->rank() == me);

            // TP group = consecutive world ranks [pp_rank*tp, pp_rank*tp + tp).
            std::vector<int32_t> x{me + 1, 1};
            ctx.tp->all_reduce_sum(vi(x));
            int32_t e = 0;
            for (int t = 0; t < tp; ++t) e += w.rank_of(t, w.pp_rank()) + 1;
            CHECK(x[0] == e);
            CHECK(x[1] == tp);
            // PP group = same tp_rank across stages.
            std::vector<int32_t> y{me + 1};
            ctx.pp_world->all_reduce_sum(vi(y));
            e = 0;
            for (int s = 0; s < pp; ++s) e += w.rank_of(w.tp_rank(), s) + 1;
            CHECK(y[0] == e);
            // Pipeline hand-off: stage s sends to pp_world rank s+1 = world rank + tp.
            std::vector<int32_t> act{me * 100 + 7};
            if (ctx.prev_stage() >= 0) {
                std::vector<int32_t> got{-1};
                ctx.pp_world->recv(vi(got), ctx.prev_stage());
                CHECK(got[0] == (me - tp) * 100 + 7);
            }
            if (ctx.next_stage() >= 0) ctx.pp_world->send(vi(act), ctx.next_stage());
            CHECK((ctx.next_stage() < 0) == w.is_last_stage());
            CHECK((ctx.prev_stage() < 0) == w.is_first_stage());
            // Sampled token from the sampler rank reaches everyone.
            std::vector<int32_t> tok{me == w.sampler_rank() ? 31337 : -1};
            ctx.world_comm->broadcast(vi(tok), w.sampler_rank());
            CHECK(tok[0] == 31337);
            ctx.world_comm->barrier();
        }
    }
}

// The leader hands kPlanQueue plans (a size, then a body too large to go eagerly) to every
// follower before any follower receives one: it reaches the barrier only if none of those sends
// waited for its receiver (with a shallower queue this times out, naming the follower).
TEST_CASE("the plans communicator queues kPlanQueue plans per follower without waiting for them") {
    const int world = mpi_session().size();
    if (world == 1) return;  // (one rank: LocalComm, nothing to queue)
    ParallelContext ctx = make_parallel_context(world, 1, 10.0);
    REQUIRE(ctx.plans);
    REQUIRE(ctx.plans->size() == world);
    const int me = ctx.world.rank;
    std::vector<int32_t> body(64 * 1024), size{int32_t(body.size())};
    if (me == 0) {
        for (int q = 0; q < kPlanQueue; ++q)
            for (int r = 1; r < world; ++r) {
                std::fill(body.begin(), body.end(), q * 100 + r);
                ctx.plans->send(vi(size), r);
                ctx.plans->send(vi(body), r);
            }
    }
    ctx.world_comm->barrier();  // followers wait here until the leader has queued everything
    if (me != 0)
        for (int q = 0; q < kPlanQueue; ++q) {
            std::vector<int32_t> n{0};
            ctx.plans->recv(vi(n), 0);
            REQUIRE(n[0] == int32_t(body.size()));
            ctx.plans->recv(vi(body), 0);
            CHECK(body.front() == q * 100 + me);
            CHECK(body.back() == q * 100 + me);
        }
    ctx.plans->barrier();  // (the leader's queued sends are delivered)
}

TEST_CASE("make_parallel_context rejects a bad timeout before touching peers") {
    CHECK_THROWS_WITH_AS(make_parallel_context(1, checker().size(), 0.0), doctest::Contains("--comm-timeout"), Error);
    CHECK_THROWS_WITH_AS(make_parallel_context(1, checker().size(), -5.0), doctest::Contains("--comm-timeout"), Error);
}

TEST_CASE("make_local_context needs no MPI and gives LocalComm everywhere") {
    ParallelContext ctx = make_local_context();
    CHECK(ctx.world.world == 1);
    CHECK(ctx.tp->size() == 1);
    CHECK(ctx.pp_world->size() == 1);
    CHECK(ctx.next_stage() == -1);
    CHECK(ctx.prev_stage() == -1);
    std::vector<int32_t> x{5};
    ctx.tp->all_reduce_sum(vi(x));
    CHECK(x[0] == 5);
}
