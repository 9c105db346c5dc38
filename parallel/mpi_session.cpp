// MpiSession: MPI init/finalize, world and node placement, and the peer table (see mpi_session.h).
#include "parallel/mpi_session.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include "base/sched_slice.h"
#include "parallel/watchdog.h"

namespace lattice {

namespace {

constexpr double kStartupTimeoutS = 120.0;

// Fixed-size record exchanged at start-up (bytes; every rank runs the same binary).
struct WirePeer {
    int32_t pid = 0;
    int32_t pad = 0;
    uint64_t start_ticks = 0;
    char host[64] = {0};
    char boot_id[40] = {0};
};

std::string read_boot_id() {
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "";
    char buf[64] = {0};
    long n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    std::string s(buf, n > 0 ? size_t(n) : 0);
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
}

void copy_field(char* dst, size_t cap, const std::string& src) {
    size_t n = std::min(cap - 1, src.size());
    std::memcpy(dst, src.data(), n);
    dst[n] = 0;
}

}  // namespace

std::string mpi_error_string(int code) {
    char buf[MPI_MAX_ERROR_STRING + 1] = {0};
    int len = 0;
    if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return fmt::format("MPI error code {}", code);
    return std::string(buf, size_t(len));
}

bool mpi_active() {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

MpiSession::MpiSession() {
    request_short_sched_slice();  // this rank waits on its peers at every hand-off (base/sched_slice.h)
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    LATTICE_CHECK(!fin, "MPI was already finalized in this process: cannot start an MPI session");
    if (!init) {
        int provided = 0;
        int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
        LATTICE_CHECK(rc == MPI_SUCCESS, "MPI_Init_thread failed on host {} (error code {})", host_name(), rc);
        owns_init_ = true;
        thread_level_ = provided;
    } else {
        MPI_Query_thread(&thread_level_);
    }
    LATTICE_CHECK(thread_level_ >= MPI_THREAD_FUNNELED,
                  "MPI provides thread level {} on host {}; lattice needs MPI_THREAD_FUNNELED or higher", thread_level_,
                  host_name());
    MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
    process_identity().rank = rank_;
    process_identity().world = size_;

    MPI_Comm node = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
    MPI_CHECK(MPI_Comm_size(node, &local_size_));
    MPI_CHECK(MPI_Comm_free(&node));

    WirePeer me;
    me.pid = int32_t(getpid());
    me.start_ticks = process_start_ticks(int(getpid()));
    copy_field(me.host, sizeof(me.host), host_name());
    copy_field(me.boot_id, sizeof(me.boot_id), read_boot_id());
    std::vector<WirePeer> all(static_cast<size_t>(size_));
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_CHECK(MPI_Iallgather(&me, int(sizeof(WirePeer)), MPI_BYTE, all.data(), int(sizeof(WirePeer)), MPI_BYTE,
                             MPI_COMM_WORLD, &req));
    WaitPolicy policy;
    policy.timeout_s = kStartupTimeoutS;
    int rc = MPI_SUCCESS;
    WaitResult wr = poll_request(&req, MPI_STATUS_IGNORE, policy, &rc);
    LATTICE_CHECK(wr != WaitResult::kTimedOut,
                  "MPI start-up: not all {} ranks exchanged their identity within {} s (a rank failed to start?)",
                  size_, kStartupTimeoutS);
    LATTICE_CHECK(wr == WaitResult::kDone, "MPI start-up exchange failed: {}", mpi_error_string(rc));

    // Local ranks are counted from the table too; MPI's shared-memory split is authoritative.
    peers_.resize(size_t(size_));
    for (int r = 0; r < size_; ++r) {
        const WirePeer& w = all[size_t(r)];
        PeerInfo& p = peers_[size_t(r)];
        p.pid = w.pid;
        p.start_ticks = w.start_ticks;
        p.host.assign(w.host, strnlen(w.host, sizeof(w.host)));
        p.boot_id.assign(w.boot_id, strnlen(w.boot_id, sizeof(w.boot_id)));
    }
    for (int r = 0, seen = 0; r < size_; ++r)
        if (is_local(r)) peers_[size_t(r)].local_rank = seen++;
}

MpiSession::~MpiSession() {
    try {
        finalize();
    } catch (...) {
    }
}

void MpiSession::finalize() {
    if (owns_init_ && mpi_active()) MPI_Finalize();
}

bool MpiSession::is_local(int r) const {
    if (r < 0 || r >= size_) return false;
    const PeerInfo& me = peers_[size_t(rank_)];
    const PeerInfo& p = peers_[size_t(r)];
    return p.host == me.host && p.boot_id == me.boot_id;
}

PeerState MpiSession::peer_state(int r) const {
    if (r == rank_) return PeerState::kAlive;
    if (!is_local(r)) return PeerState::kUnknown;
    int a = local_process_alive(peers_[size_t(r)].pid, peers_[size_t(r)].start_ticks);
    return a == 0 ? PeerState::kDead : a == 1 ? PeerState::kAlive : PeerState::kUnknown;
}

std::string MpiSession::describe_peer(int r) const {
    if (r < 0 || r >= size_) return fmt::format("world rank {} (out of range)", r);
    return fmt::format("world rank {} (pid {} on {})", r, peers_[size_t(r)].pid, peers_[size_t(r)].host);
}

void MpiSession::install_termination_reporter() {
    std::vector<int> pids;
    std::vector<uint64_t> starts;
    std::vector<bool> local;
    std::vector<std::string> lines;
    for (int r = 0; r < size_; ++r) {
        pids.push_back(peers_[size_t(r)].pid);
        starts.push_back(peers_[size_t(r)].start_ticks);
        local.push_back(is_local(r));
        lines.push_back(describe_peer(r));
    }
    install_termination_handlers(describe_peer(rank_), rank_, pids, starts, local, lines);
}

MpiSession& mpi_session() {
    static MpiSession session;
    return session;
}

}  // namespace lattice
