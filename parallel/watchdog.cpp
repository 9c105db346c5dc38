// Polling wait with a deadline, liveness pings between ranks, and the termination reporter
// (design in watchdog.h). Single-threaded by design: everything here runs on the MPI thread,
// except the signal handler, which only uses async-signal-safe calls on preformatted data.
#include "parallel/watchdog.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <thread>

namespace lattice {

namespace {

constexpr int kPingTag = 30001;
constexpr int kPongTag = 30002;

using Clock = std::chrono::steady_clock;

Activity g_activity;
std::vector<ControlChannel*>& registry() {
    static std::vector<ControlChannel*> r;
    return r;
}

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

void copy_str(char* dst, size_t cap, const char* src) {
    size_t n = std::min(cap - 1, std::strlen(src));
    std::memcpy(dst, src, n);
    dst[n] = 0;
}

}  // namespace

void set_activity(const std::string& comm, const char* op, int call, int peer) {
    copy_str(g_activity.comm, sizeof(g_activity.comm), comm.c_str());
    copy_str(g_activity.op, sizeof(g_activity.op), op);
    g_activity.call = call;
    g_activity.peer = peer;
}

void clear_activity() {
    g_activity = Activity{};
}

WaitPacer::WaitPacer(const WaitPolicy& policy)
    : backoff_(policy), timeout_us_(policy.timeout_s * 1e6), last_service_(Clock::now()) {}

bool WaitPacer::next() {
    const Clock::time_point now = Clock::now();
    const double el_us = backoff_.elapsed_us(now);
    if (timeout_us_ > 0 && el_us > timeout_us_) return false;
    if (now - last_service_ > std::chrono::milliseconds(1)) {
        service_all_channels();
        last_service_ = now;
    }
    backoff_.pause_at(el_us);
    return true;
}

WaitResult poll_request(MPI_Request* req, MPI_Status* status, const WaitPolicy& policy, int* mpi_rc) {
    WaitPacer pace(policy);
    for (;;) {
        int flag = 0;
        int rc = MPI_Test(req, &flag, status);
        if (rc != MPI_SUCCESS) {
            if (mpi_rc) *mpi_rc = rc;
            return WaitResult::kMpiError;
        }
        if (flag) return WaitResult::kDone;
        if (!pace.next()) return WaitResult::kTimedOut;
    }
}

// ---------------------------------------------------------------------------------------------
// ControlChannel

ControlChannel::ControlChannel(MPI_Comm ctl, const int* calls_started) : ctl_(ctl), calls_started_(calls_started) {
    registry().push_back(this);
}

ControlChannel::~ControlChannel() {
    auto& r = registry();
    r.erase(std::remove(r.begin(), r.end(), this), r.end());
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin) return;
    reap();
    for (size_t i = 0; i < pending_.size(); ++i) {
        MPI_Request_free(&pending_[i]);
        (void)pending_buf_[i].release();  // MPI may still read it: leak (only after a failure)
    }
    if (ctl_ != MPI_COMM_NULL) MPI_Comm_free(&ctl_);
}

void ControlChannel::reap() {
    for (size_t i = 0; i < pending_.size();) {
        int flag = 0;
        if (MPI_Test(&pending_[i], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag) {
            pending_.erase(pending_.begin() + long(i));
            pending_buf_.erase(pending_buf_.begin() + long(i));
        } else {
            ++i;
        }
    }
}

void ControlChannel::service() {
    // Diagnostics must never throw into the middle of an operation: MPI failures here end the
    // servicing quietly; the operation itself reports what went wrong.
    for (int guard = 0; guard < 1024; ++guard) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, kPingTag, ctl_, &flag, &st) != MPI_SUCCESS || !flag) break;
        int32_t their_calls = 0;
        if (MPI_Recv(&their_calls, 1, MPI_INT32_T, st.MPI_SOURCE, kPingTag, ctl_, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            break;
        auto rep = std::make_unique<PeerReport>();
        rep->calls_started = *calls_started_;
        rep->now = g_activity;
        MPI_Request r = MPI_REQUEST_NULL;
        if (MPI_Isend(rep.get(), int(sizeof(PeerReport)), MPI_BYTE, st.MPI_SOURCE, kPongTag, ctl_, &r) != MPI_SUCCESS)
            break;
        pending_.push_back(r);
        pending_buf_.push_back(std::move(rep));
    }
    reap();
}

std::vector<std::optional<PeerReport>> ControlChannel::probe(const std::vector<int>& peers, double grace_s) {
    const size_t n = peers.size();
    std::vector<std::optional<PeerReport>> out(n);
    // Buffers live on the heap and are leaked when MPI may still touch them (failure path only).
    auto* ping = new int32_t(*calls_started_);
    auto* reps = new PeerReport[n > 0 ? n : 1];
    std::vector<MPI_Request> sends(n, MPI_REQUEST_NULL), recvs(n, MPI_REQUEST_NULL);
    for (size_t i = 0; i < n; ++i) {
        MPI_Isend(ping, 1, MPI_INT32_T, peers[i], kPingTag, ctl_, &sends[i]);
        MPI_Irecv(&reps[i], int(sizeof(PeerReport)), MPI_BYTE, peers[i], kPongTag, ctl_, &recvs[i]);
    }
    std::vector<bool> got(n, false);
    const Clock::time_point t0 = Clock::now();
    size_t n_got = 0;
    while (n_got < n && seconds_since(t0) < grace_s) {
        for (size_t i = 0; i < n; ++i) {
            if (got[i] || recvs[i] == MPI_REQUEST_NULL) continue;
            int flag = 0;
            if (MPI_Test(&recvs[i], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
                recvs[i] = MPI_REQUEST_NULL;
                continue;
            }
            if (flag) {
                got[i] = true;
                out[i] = reps[i];
                ++n_got;
            }
        }
        service_all_channels();
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    bool leak = false;
    for (size_t i = 0; i < n; ++i) {
        if (!got[i] && recvs[i] != MPI_REQUEST_NULL) {
            MPI_Cancel(&recvs[i]);
            MPI_Status st;
            int flag = 0;
            for (int k = 0; k < 1000 && !flag; ++k) {
                if (MPI_Test(&recvs[i], &flag, &st) != MPI_SUCCESS) break;
                if (!flag) std::this_thread::sleep_for(std::chrono::microseconds(100));
            }
            if (flag) {
                int cancelled = 0;
                MPI_Test_cancelled(&st, &cancelled);
                if (!cancelled) out[i] = reps[i];  // answered just in time
            } else {
                MPI_Request_free(&recvs[i]);
                leak = true;
            }
        }
        int flag = 0;
        if (sends[i] != MPI_REQUEST_NULL && (MPI_Test(&sends[i], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag)) {
            if (sends[i] != MPI_REQUEST_NULL) MPI_Request_free(&sends[i]);
            leak = true;
        }
    }
    if (!leak) {
        delete ping;
        delete[] reps;
    }
    return out;
}

void service_all_channels() {
    // Copy: servicing never registers channels, but stay safe against reentrancy.
    std::vector<ControlChannel*> chans = registry();
    for (ControlChannel* c : chans) c->service();
}

// ---------------------------------------------------------------------------------------------
// Process liveness (async-signal-safe)

namespace {

// Reads /proc/<pid>/stat into buf; returns bytes read or -1.
long read_stat(int pid, char* buf, long cap) {
    char path[64] = "/proc/";
    char digits[16];
    int nd = 0;
    unsigned v = unsigned(pid);
    do {
        digits[nd++] = char('0' + v % 10);
        v /= 10;
    } while (v && nd < 15);
    int p = 6;
    while (nd) path[p++] = digits[--nd];
    const char* tail = "/stat";
    for (int i = 0; tail[i]; ++i) path[p++] = tail[i];
    path[p] = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    long n = read(fd, buf, size_t(cap - 1));
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    return n;
}

// Parses state (field 3) and starttime (field 22) after the last ')'.
bool parse_stat(const char* buf, long n, char* state, uint64_t* start) {
    long rp = -1;
    for (long i = 0; i < n; ++i)
        if (buf[i] == ')') rp = i;
    if (rp < 0) return false;
    int field = 2;
    long i = rp + 1;
    *state = '?';
    *start = 0;
    while (i < n) {
        while (i < n && buf[i] == ' ') ++i;
        if (i >= n) break;
        ++field;
        if (field == 3) *state = buf[i];
        if (field == 22) {
            uint64_t v = 0;
            while (i < n && buf[i] >= '0' && buf[i] <= '9') v = v * 10 + uint64_t(buf[i++] - '0');
            *start = v;
            return true;
        }
        while (i < n && buf[i] != ' ') ++i;
    }
    return false;
}

}  // namespace

uint64_t process_start_ticks(int pid) {
    char buf[1024];
    long n = read_stat(pid, buf, sizeof(buf));
    char state;
    uint64_t start = 0;
    if (n <= 0 || !parse_stat(buf, n, &state, &start)) return 0;
    return start;
}

int local_process_alive(int pid, uint64_t start_ticks) {
    if (pid <= 0) return -1;
    int saved = errno;
    int result = 1;
    if (kill(pid, 0) != 0) {
        result = errno == ESRCH ? 0 : 1;  // EPERM: exists, not ours
    } else {
        char buf[1024];
        long n = read_stat(pid, buf, sizeof(buf));
        char state;
        uint64_t start = 0;
        if (n > 0 && parse_stat(buf, n, &state, &start)) {
            if (state == 'Z' || state == 'X' || (start_ticks != 0 && start != start_ticks)) result = 0;
        }
    }
    errno = saved;
    return result;
}

// ---------------------------------------------------------------------------------------------
// Termination reporter

namespace {

struct TermPeer {
    int pid;
    uint64_t start;
    bool local;
    char line[160];
};
TermPeer* g_term_peers = nullptr;
int g_term_n = 0;
int g_term_self = -1;
char g_term_self_str[200];

void append(char* buf, size_t cap, size_t* len, const char* s) {
    while (*s && *len + 1 < cap) buf[(*len)++] = *s++;
}

extern "C" void lattice_termination_handler(int sig) {
    static char line[4000];
    size_t len = 0;
    append(line, sizeof(line), &len, "lattice: ");
    append(line, sizeof(line), &len, g_term_self_str);
    append(line, sizeof(line), &len,
           sig == SIGTERM  ? ": terminated by SIGTERM (the launcher is stopping the job)"
           : sig == SIGINT ? ": interrupted (SIGINT)"
                           : ": hung up (SIGHUP)");
    int dead = 0;
    for (int i = 0; i < g_term_n; ++i) {
        if (i == g_term_self || !g_term_peers[i].local) continue;
        if (local_process_alive(g_term_peers[i].pid, g_term_peers[i].start) == 0) {
            append(line, sizeof(line), &len,
                   dead == 0 ? "; peers already gone (the failed one, or stopped first): " : ", ");
            append(line, sizeof(line), &len, g_term_peers[i].line);
            ++dead;
        }
    }
    if (dead == 0) append(line, sizeof(line), &len, "; no peer on this machine is dead");
    append(line, sizeof(line), &len, "\n");
    ssize_t w = write(2, line, len);
    (void)w;
    _exit(128 + sig);
}

}  // namespace

void install_termination_handlers(const std::string& self, int self_rank, const std::vector<int>& pids,
                                  const std::vector<uint64_t>& start_ticks, const std::vector<bool>& local,
                                  const std::vector<std::string>& lines) {
    const int n = int(pids.size());
    auto* peers = new TermPeer[size_t(std::max(n, 1))];  // lives until exit (read by the handler)
    for (int i = 0; i < n; ++i) {
        peers[i].pid = pids[size_t(i)];
        peers[i].start = start_ticks[size_t(i)];
        peers[i].local = local[size_t(i)];
        copy_str(peers[i].line, sizeof(peers[i].line), lines[size_t(i)].c_str());
    }
    copy_str(g_term_self_str, sizeof(g_term_self_str), self.c_str());
    g_term_self = self_rank;
    g_term_n = n;
    g_term_peers = peers;
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_handler = lattice_termination_handler;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGHUP, &sa, nullptr);
}

}  // namespace lattice
