// The watchdog's pings between ranks (ControlChannel, part of test_mpi_comm: np 2, 3, 4):
//  - peers waiting in poll_request answer rank 0's probe with their call count and what they wait
//    in (communicator, op, call number, peer): no peer that answers is taken for silent;
//  - peers blocked outside the watchdog's loop (a plain MPI_Recv, which never services pings) are
//    reported silent (no report) once the grace period ends: the case a timed-out rank turns into
//    "no answer from rank N".
// Ordering through MPI messages only: rank 0 releases the peers after each probe returns, and the
// peers tell rank 0 when they have left poll_request before the second probe starts.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "parallel/mpi_session.h"
#include "parallel/watchdog.h"

using namespace lattice;

TEST_CASE("ControlChannel::probe: polling peers report what they wait in; blocked peers stay silent") {
    mpi_session();
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    REQUIRE(size >= 2);
    MPI_Comm ctl = MPI_COMM_NULL, data = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &ctl);
    MPI_Comm_dup(MPI_COMM_WORLD, &data);
    int calls = 5 + rank;
    {
        ControlChannel ch(ctl, &calls);  // owns ctl from here
        std::vector<int> peers;
        for (int r = 1; r < size; ++r) peers.push_back(r);
        int token = 0;

        // 1. Peers wait in poll_request for rank 0's message: they answer, whatever the machine's load
        //    (the grace is long; probe returns as soon as every report is in).
        if (rank == 0) {
            const auto reps = ch.probe(peers, 120.0);
            REQUIRE(reps.size() == peers.size());
            for (size_t i = 0; i < peers.size(); ++i) {
                CAPTURE(peers[i]);
                REQUIRE(reps[i].has_value());
                CHECK(reps[i]->calls_started == 5 + peers[i]);
                CHECK(std::string(reps[i]->now.comm) == "watchdog-test");
                CHECK(std::string(reps[i]->now.op) == "recv");
                CHECK(reps[i]->now.call == 7);
                CHECK(reps[i]->now.peer == 0);
            }
            for (int p : peers) MPI_Send(&token, 1, MPI_INT, p, 1, data);
            // Every peer has left poll_request (it says so) before the second probe: a peer still in
            // it, slowed by a busy machine, would answer that probe too.
            for (int p : peers) MPI_Recv(&token, 1, MPI_INT, p, 3, data, MPI_STATUS_IGNORE);
        } else {
            set_activity("watchdog-test", "recv", 7, 0);
            MPI_Request req = MPI_REQUEST_NULL;
            MPI_Irecv(&token, 1, MPI_INT, 0, 1, data, &req);
            WaitPolicy p;
            p.timeout_s = 120.0;
            CHECK(poll_request(&req, MPI_STATUS_IGNORE, p, nullptr) == WaitResult::kDone);
            clear_activity();
            MPI_Send(&token, 1, MPI_INT, 0, 3, data);
        }

        // 2. Peers blocked in a plain MPI_Recv never service pings: rank 0's probe gets no report from
        //    any of them, and only then releases them.
        if (rank == 0) {
            const auto reps = ch.probe(peers, 0.3);
            for (size_t i = 0; i < peers.size(); ++i) {
                CAPTURE(peers[i]);
                CHECK_FALSE(reps[i].has_value());
            }
            for (int p : peers) MPI_Send(&token, 1, MPI_INT, p, 2, data);
        } else {
            MPI_Recv(&token, 1, MPI_INT, 0, 2, data, MPI_STATUS_IGNORE);
        }
        MPI_Barrier(data);
    }
    MPI_Comm_free(&data);
}
