// The ranks' failure agreement over MPI point-to-point messages (see rank_agreement.h).
// Wire format of a report and of the verdict: "code rank message" (text; message last, any bytes).
#include "parallel/rank_agreement.h"

#if !defined(LATTICE_NO_MPI)
#include "parallel/mpi_session.h"
#endif

#include <algorithm>
#include <chrono>
#include <sstream>
#include <thread>

#include <fmt/format.h>

namespace lattice {

namespace {

using Deadline = std::chrono::steady_clock::time_point;

// The verdict when this rank is alone: its own report.
RankAgreement own_verdict(int code, const std::string& message, int rank) {
    RankAgreement v;
    v.own_rank = rank;
    if (code != 0) {
        v.outcome = RankAgreement::Outcome::kFailure;
        v.failed_rank = rank, v.code = code, v.message = message;
    }
    return v;
}

[[maybe_unused]] RankAgreement silent(int rank) {
    RankAgreement v;
    v.outcome = RankAgreement::Outcome::kPeersSilent;
    v.own_rank = rank;
    return v;
}

#if !defined(LATTICE_NO_MPI)
constexpr int kReportTag = 7101, kVerdictTag = 7102;
constexpr auto kPollInterval = std::chrono::milliseconds(2);  // polling interval, not ordering

struct Report {
    int code = 0;
    int rank = 0;
    std::string message;
};

std::string encode(const Report& r) {
    return fmt::format("{} {} {}", r.code, r.rank, r.message.substr(0, kMaxAgreementMessageBytes));
}

Report decode(const std::string& s) {
    Report r;
    std::istringstream in(s);
    in >> r.code >> r.rank;
    in.get();
    std::getline(in, r.message, '\0');
    return r;
}

// Waits for a message with `tag` from `source` (MPI_ANY_SOURCE too) until `deadline`; false when none came.
bool receive(int source, int tag, std::string& out, Deadline deadline) {
    for (;;) {
        int flag = 0;
        MPI_Status st{};
        if (MPI_Iprobe(source, tag, MPI_COMM_WORLD, &flag, &st) != MPI_SUCCESS) return false;
        if (flag) {
            int n = 0;
            MPI_Get_count(&st, MPI_CHAR, &n);
            out.assign(size_t(std::max(n, 0)), '\0');
            return MPI_Recv(out.data(), n, MPI_CHAR, st.MPI_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE) ==
                   MPI_SUCCESS;
        }
        if (std::chrono::steady_clock::now() > deadline) return false;
        std::this_thread::sleep_for(kPollInterval);
    }
}

// Sends without blocking past `deadline` (a peer that never receives must not hang this rank).
bool send(int dest, int tag, const std::string& s, Deadline deadline) {
    MPI_Request req = MPI_REQUEST_NULL;
    if (MPI_Isend(s.data(), int(s.size()), MPI_CHAR, dest, tag, MPI_COMM_WORLD, &req) != MPI_SUCCESS) return false;
    for (;;) {
        int done = 0;
        if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
        if (done) return true;
        if (std::chrono::steady_clock::now() > deadline) {
            MPI_Cancel(&req);
            return false;
        }
        std::this_thread::sleep_for(kPollInterval);
    }
}

// Rank 0: collects the other ranks' reports, keeps the lowest failing rank, sends it to everyone.
bool decide_on_root(Report& verdict, int size, Deadline deadline) {
    std::string buf;
    for (int got = 0; got < size - 1; ++got) {
        if (!receive(MPI_ANY_SOURCE, kReportTag, buf, deadline)) return false;
        Report r = decode(buf);
        if (r.code != 0 && r.rank < verdict.rank) verdict = std::move(r);
    }
    const std::string text = encode(verdict);
    for (int r = 1; r < size; ++r)
        if (!send(r, kVerdictTag, text, deadline)) return false;
    return true;
}

// Other ranks: report to rank 0, then wait for its verdict.
bool learn_from_root(const Report& mine, Report& verdict, Deadline deadline) {
    std::string buf;
    if (!send(0, kReportTag, encode(mine), deadline) || !receive(0, kVerdictTag, buf, deadline)) return false;
    verdict = decode(buf);
    return true;
}
#endif

}  // namespace

RankAgreement agree_on_failure(int code, const std::string& message, double timeout_s) {
#if defined(LATTICE_NO_MPI)
    (void)timeout_s;
    return own_verdict(code, message, 0);
#else
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return code != 0 ? silent(0) : own_verdict(0, "", 0);  // nobody left to agree with
    const MpiSession& s = mpi_session();
    const int rank = s.rank(), size = s.size();
    if (size == 1) return own_verdict(code, message, rank);
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(timeout_s));
    // A rank that is fine reports rank `size`: above every failing rank.
    const Report mine{code, code != 0 ? rank : size, message};
    Report verdict = mine;
    const bool answered = rank == 0 ? decide_on_root(verdict, size, deadline)
                                    : learn_from_root(mine, verdict, deadline);
    if (!answered) return silent(rank);
    RankAgreement v = own_verdict(verdict.code, verdict.message, verdict.rank);
    v.own_rank = rank;
    return v;
#endif
}

}  // namespace lattice
