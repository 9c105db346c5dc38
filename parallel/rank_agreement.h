// The ranks' failure agreement: at one point of a run every rank says whether it failed (an exit
// code and a one-line message) and every rank learns the same verdict: no rank failed, or the
// lowest failing rank with its code and message, or that its peers did not answer in time.
//
// Why: an error every rank meets (a bad argument, a malformed model) should be one line printed by
// one rank, with the same exit code everywhere; a rank that exits alone would leave its peers
// waiting in their first collective. The agreement runs before any collective of the run.
//
// Protocol (MPI_COMM_WORLD, tags of its own; the run's communicators are duplicates of the world,
// so nothing else matches these messages): every rank but 0 sends "code rank message" to rank 0;
// rank 0 picks the lowest failing rank and sends the verdict back to each. Every send and receive
// is polled under one deadline (the hang guard): a peer stuck elsewhere, or past this point
// already, makes the call return kPeersSilent instead of hanging.
// Without MPI, with one rank, or after MPI was finalized, the verdict is this rank's own.
// Invariants: every rank of the world calls agree_on_failure the same number of times; a message
// travels truncated to kMaxAgreementMessageBytes.
#pragma once

#include <cstddef>
#include <string>

namespace lattice {

inline constexpr double kAgreementTimeoutS = 30.0;  // the hang guard's default
inline constexpr size_t kMaxAgreementMessageBytes = 4096;

struct RankAgreement {
    enum class Outcome {
        kNoFailure,    // every rank reported code 0
        kFailure,      // some rank failed: failed_rank, code and message say which and why
        kPeersSilent,  // the peers did not answer within the hang guard (or MPI is gone)
    };
    Outcome outcome = Outcome::kNoFailure;
    int own_rank = 0;      // this process's world rank (rank 0 is the one that reports)
    int failed_rank = -1;  // lowest failing world rank (kFailure)
    int code = 0;          // its exit code (kFailure; 0 otherwise)
    std::string message;   // its one-line message (kFailure)

    bool failed() const { return outcome == Outcome::kFailure; }
    bool peers_silent() const { return outcome == Outcome::kPeersSilent; }
};

// This rank's share: `code` 0 (fine) or its non-zero exit code and one-line `message`. Initializes
// MPI when it is not yet. Waits at most `timeout_s` for the peers.
RankAgreement agree_on_failure(int code, const std::string& message, double timeout_s = kAgreementTimeoutS);

}  // namespace lattice
