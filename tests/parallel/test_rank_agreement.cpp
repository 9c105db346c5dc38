// The ranks' failure agreement (parallel/rank_agreement.h) under mpirun -np 3: no failure; rank 2
// alone fails and every rank learns rank 2, its code and its message; two ranks fail and every rank
// learns the lower; rank 0 fails; a long message arrives truncated; and a rank that never joins makes
// the others return kPeersSilent within the (short) hang guard instead of hanging.
// Rounds run one after another in one process, as a command and main() would call them.
#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include "parallel/rank_agreement.h"
#include "parallel/world_session.h"

using namespace lattice;

namespace {

constexpr double kGuardS = 10.0;  // generous: the agreement itself takes milliseconds

std::string failure_message(int rank) { return "rank " + std::to_string(rank) + " could not open model.gguf"; }

}  // namespace

TEST_CASE("rank agreement at np 3: every rank learns the same verdict") {
    const WorldPlace me = join_world();
    REQUIRE(me.size == 3);

    SUBCASE("no rank fails") {
        const RankAgreement v = agree_on_failure(0, "", kGuardS);
        CHECK(v.outcome == RankAgreement::Outcome::kNoFailure);
        CHECK_FALSE(v.failed());
        CHECK(v.code == 0);
        CHECK(v.failed_rank == -1);
        CHECK(v.own_rank == me.rank);
    }
    SUBCASE("rank 2 alone fails: every rank learns rank 2, its code and its message") {
        const bool fails = me.rank == 2;
        const RankAgreement v = agree_on_failure(fails ? 7 : 0, fails ? failure_message(2) : "", kGuardS);
        CHECK(v.failed());
        CHECK(v.failed_rank == 2);
        CHECK(v.code == 7);
        CHECK(v.message == failure_message(2));
        CHECK(v.own_rank == me.rank);
    }
    SUBCASE("ranks 1 and 2 fail: every rank learns the lower") {
        const bool fails = me.rank >= 1;
        const RankAgreement v = agree_on_failure(fails ? me.rank : 0, fails ? failure_message(me.rank) : "", kGuardS);
        CHECK(v.failed());
        CHECK(v.failed_rank == 1);
        CHECK(v.code == 1);
        CHECK(v.message == failure_message(1));
    }
    SUBCASE("every rank fails: rank 0's failure wins") {
        const RankAgreement v = agree_on_failure(2 + me.rank, failure_message(me.rank), kGuardS);
        CHECK(v.failed_rank == 0);
        CHECK(v.code == 2);
        CHECK(v.message == failure_message(0));
    }
    SUBCASE("a message longer than the limit arrives truncated, with any bytes") {
        const std::string longer = std::string("a b\nc\t") + std::string(2 * kMaxAgreementMessageBytes, 'x');
        const RankAgreement v = agree_on_failure(me.rank == 1 ? 1 : 0, me.rank == 1 ? longer : "", kGuardS);
        CHECK(v.failed_rank == 1);
        CHECK(v.message == longer.substr(0, kMaxAgreementMessageBytes));
    }
}

// Last: it leaves the world without a matching round (rank 2 never joins this one).
TEST_CASE("rank agreement at np 3: a peer that never answers gives kPeersSilent, not a hang") {
    const WorldPlace me = join_world();
    REQUIRE(me.size == 3);
    if (me.rank == 2) {
        // Stays away until both peers gave up, then leaves with them.
        broadcast_int_from_root(0);
        return;
    }
    const auto start = std::chrono::steady_clock::now();
    const RankAgreement v = agree_on_failure(me.rank == 1 ? 1 : 0, me.rank == 1 ? failure_message(1) : "", 0.5);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECK(v.peers_silent());
    CHECK_FALSE(v.failed());
    CHECK(waited >= 0.4);
    CHECK(waited < 5.0);
    broadcast_int_from_root(0);
}
