// parallel/watchdog.h without MPI (no MPI_Init: nothing here touches a communicator):
//  - process_start_ticks / local_process_alive, which tell "dead" from "alive: busy or hung" for a
//    silent peer on this machine: this process and a blocked child are alive; a child that exited
//    is dead while a zombie and once reaped; a pid whose start time differs (reused) is dead; EPERM
//    (pid 1 for a non-root user) counts as alive; pid <= 0 is unknown;
//  - WaitPacer: never gives up before the policy's timeout (no false fire while a peer is merely
//    slow), gives up after it, and never with timeout_s <= 0;
//  - the termination reporter: a rank SIGTERMed by the launcher prints one line naming the local peers
//    already dead (and not the live or remote ones), or says none is, and exits 128 + signal.
// Ordering between processes goes through pipes and waitid(), never through sleeps. The MPI half
// (pings, reports, a silent rank named in the Error) runs in test_mpi_timeout and test_mpi_failure.
#include "parallel/watchdog.h"

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <string>
#include <vector>

using namespace lattice;

namespace {

using Clock = std::chrono::steady_clock;

// A child that blocks reading a pipe and exits 0 when the parent closes it: alive (sleeping) until
// release(), a zombie after exited(), gone after reap().
struct BlockedChild {
    pid_t pid = -1;
    int wr = -1;
    BlockedChild() {
        int fds[2];
        REQUIRE(::pipe(fds) == 0);
        pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            ::close(fds[1]);
            char c;
            while (::read(fds[0], &c, 1) > 0) {
            }
            ::_exit(0);
        }
        ::close(fds[0]);
        wr = fds[1];
    }
    void release() {
        if (wr >= 0) ::close(wr);
        wr = -1;
    }
    // Waits until the child has exited, leaving it a zombie (WNOWAIT).
    void exited() {
        release();
        siginfo_t info{};
        REQUIRE(::waitid(P_PID, id_t(pid), &info, WEXITED | WNOWAIT) == 0);
    }
    void reap() {
        release();
        int status = 0;
        REQUIRE(::waitpid(pid, &status, 0) == pid);
        pid = -1;
    }
    ~BlockedChild() {
        if (pid > 0) {
            release();
            ::waitpid(pid, nullptr, 0);
        }
    }
};

std::string read_all(int fd) {
    std::string out;
    char buf[512];
    for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        out.append(buf, size_t(n));
    }
    return out;
}

// Forks a rank that installs the termination handlers with `peers` (its own pid goes in entry 0),
// says it is ready, and waits for a signal; sends it `sig`, returns its stderr and wait status.
// `dead` is a pid that has exited and been reaped (entry 1), `alive` this test process (entry 2),
// entry 3 a remote peer (not checkable from here, whatever its pid).
struct ReporterRun {
    std::string err;
    int status = 0;
};
ReporterRun run_reporter(int sig, pid_t dead, uint64_t dead_ticks) {
    int ready[2], err[2];
    REQUIRE(::pipe(ready) == 0);
    REQUIRE(::pipe(err) == 0);
    const pid_t parent = ::getpid();
    const uint64_t parent_ticks = process_start_ticks(parent);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        ::close(ready[0]);
        ::close(err[0]);
        ::dup2(err[1], 2);
        const int self = int(::getpid());
        install_termination_handlers("rank 0 on node-a", 0, {self, int(dead), int(parent), int(dead)},
                                     {process_start_ticks(self), dead_ticks, parent_ticks, dead_ticks},
                                     {true, true, true, false},
                                     {"rank 0 (self)", "rank 1 (pid of the dead one)", "rank 2 (the live one)",
                                      "rank 3 (remote)"});
        if (::write(ready[1], "r", 1) != 1) ::_exit(3);
        for (;;) ::pause();  // the handler _exits
    }
    ::close(ready[1]);
    ::close(err[1]);
    char c = 0;
    REQUIRE(::read(ready[0], &c, 1) == 1);  // handlers installed
    ::close(ready[0]);
    REQUIRE(::kill(child, sig) == 0);
    ReporterRun r;
    r.err = read_all(err[0]);  // until the child's end closes: it exited
    ::close(err[0]);
    REQUIRE(::waitpid(child, &r.status, 0) == child);
    return r;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("local_process_alive: alive, zombie, reaped, reused pid, no permission, no pid") {
    const int self = int(::getpid());
    const uint64_t self_ticks = process_start_ticks(self);
    REQUIRE(self_ticks > 0);
    CHECK(local_process_alive(self, self_ticks) == 1);
    CHECK(local_process_alive(self, 0) == 1);               // start time unknown: kill(pid, 0) decides
    CHECK(local_process_alive(self, self_ticks + 1) == 0);  // same pid, another start: a reused pid
    CHECK(local_process_alive(1, 0) == 1);                  // init: alive (EPERM counts as alive too)
    CHECK(local_process_alive(0, 0) == -1);
    CHECK(local_process_alive(-7, 0) == -1);

    BlockedChild child;
    const uint64_t ticks = process_start_ticks(child.pid);
    CHECK(ticks >= self_ticks);  // started after this process
    CHECK(local_process_alive(child.pid, ticks) == 1);  // blocked in read: alive, not dead
    child.exited();
    CHECK(local_process_alive(child.pid, ticks) == 0);  // a zombie: dead, though kill(pid, 0) succeeds
    CHECK(local_process_alive(child.pid, 0) == 0);
    const pid_t gone = child.pid;
    child.reap();
    CHECK(local_process_alive(gone, ticks) == 0);
    CHECK(process_start_ticks(gone) != ticks);  // 0 (no /proc entry), or another process's start
}

TEST_CASE("WaitPacer: no false fire before the timeout, gives up after it, never with timeout <= 0") {
    WaitPolicy p;
    p.timeout_s = 0.2;
    {
        WaitPacer pace(p);
        const Clock::time_point t0 = Clock::now();
        int calls = 0;
        while (pace.next()) ++calls;
        const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
        CHECK(waited >= 0.2);  // however fast or slow the machine, not before the deadline
        CHECK(calls > 1);
    }
    {
        // A peer that answers late but within the deadline: every next() before it says keep waiting.
        p.timeout_s = 60.0;
        WaitPacer pace(p);
        const Clock::time_point t0 = Clock::now();
        bool gave_up = false;
        while (!gave_up && Clock::now() - t0 < std::chrono::milliseconds(300)) gave_up = !pace.next();
        CHECK_FALSE(gave_up);
    }
    {
        p.timeout_s = 0.0;  // wait forever
        WaitPacer pace(p);
        const Clock::time_point t0 = Clock::now();
        bool gave_up = false;
        while (!gave_up && Clock::now() - t0 < std::chrono::milliseconds(300)) gave_up = !pace.next();
        CHECK_FALSE(gave_up);
    }
}

TEST_CASE("termination reporter: SIGTERM names the dead local peer, not the live or remote ones") {
    BlockedChild dead;
    const pid_t dead_pid = dead.pid;
    const uint64_t dead_ticks = process_start_ticks(dead_pid);
    REQUIRE(dead_ticks > 0);
    dead.reap();
    const ReporterRun r = run_reporter(SIGTERM, dead_pid, dead_ticks);
    CAPTURE(r.err);
    REQUIRE(WIFEXITED(r.status));
    CHECK(WEXITSTATUS(r.status) == 128 + SIGTERM);
    CHECK(has(r.err, "lattice: rank 0 on node-a: terminated by SIGTERM (the launcher is stopping the job)"));
    CHECK(has(r.err, "peers already gone (the failed one, or stopped first): rank 1 (pid of the dead one)"));
    CHECK_FALSE(has(r.err, "rank 2 (the live one)"));
    CHECK_FALSE(has(r.err, "rank 3 (remote)"));  // dead too, but not on this machine: not checked
    CHECK_FALSE(has(r.err, "rank 0 (self)"));
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);  // one line
}

TEST_CASE("termination reporter: SIGINT with every local peer alive says so") {
    // The "dead" entry is this test process under its own start time: alive.
    const ReporterRun r = run_reporter(SIGINT, ::getpid(), process_start_ticks(::getpid()));
    CAPTURE(r.err);
    REQUIRE(WIFEXITED(r.status));
    CHECK(WEXITSTATUS(r.status) == 128 + SIGINT);
    CHECK(has(r.err, "lattice: rank 0 on node-a: interrupted (SIGINT); no peer on this machine is dead\n"));
}

TEST_CASE("setup_deadline: the longer of the per-call and the set-up deadline; forever stays forever") {
    WaitPolicy p;
    p.timeout_s = 8.0;
    p.setup_timeout_s = 300.0;
    CHECK(setup_deadline(p) == 300.0);
    p.timeout_s = 900.0;
    CHECK(setup_deadline(p) == 900.0);  // a per-call deadline longer than the set-up one is kept
    p.timeout_s = 0.0;
    CHECK(setup_deadline(p) == 0.0);  // wait forever
    p.timeout_s = -1.0;
    CHECK(setup_deadline(p) == -1.0);
}
