// Dead and silent peers, end to end: runs mpirun -np 3 on mpi_failure_worker and checks exit code,
// elapsed time after the failure, and that the output names rank 1.
//  - ok: the control run exits 0 (so the failures below come from the failure).
//  - kill (OpenMPI default): rank 1 SIGKILLs itself; the launcher tears the job down; the survivors'
//    termination reporter names the dead rank; everything ends within timeout + 5 s.
//  - kill with --enable-recovery: the launcher keeps the survivors running, so they must find out
//    themselves: the all-reduce times out and they report rank 1's process as dead.
//  - hang: rank 1 sleeps; the others time out, name it as alive but silent, and abort the job.
// Every mpirun runs under coreutils `timeout 60` so a regression fails instead of hanging CTest.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace {

constexpr double kTimeout = 3.0;

struct RunResult {
    int exit_code = -1;
    std::string output;
    double end_unix = 0;
};

double unix_now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

RunResult run_job(const std::string& mode, const std::string& extra) {
    std::string cmd = std::string("timeout 60 ") + LATTICE_MPIEXEC + " --oversubscribe --allow-run-as-root -np 3 " +
                      extra + " " + LATTICE_FAILURE_WORKER + " " + mode + " " + std::to_string(kTimeout) + " 2>&1";
    RunResult r;
    FILE* f = popen(cmd.c_str(), "r");
    REQUIRE(f != nullptr);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) r.output.append(buf, n);
    int st = pclose(f);
    r.end_unix = unix_now();
    r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return r;
}

// Unix time printed by rank 1 as "<tag> <time>".
double event_time(const RunResult& r, const std::string& tag) {
    size_t p = r.output.find(tag + " ");
    if (p == std::string::npos) return 0;
    return std::atof(r.output.c_str() + p + tag.size() + 1);
}

bool has(const RunResult& r, const std::string& s) {
    return r.output.find(s) != std::string::npos;
}

}  // namespace

TEST_CASE("control: the worker succeeds when nobody fails") {
    RunResult r = run_job("ok", "");
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(has(r, "rank 0 done"));
    CHECK(has(r, "rank 2 done"));
}

TEST_CASE("SIGKILL on rank 1 (default launcher policy): the job ends fast and rank 1 is named") {
    RunResult r = run_job("kill", "");
    INFO(r.output);
    CHECK(r.exit_code != 0);
    const double t_kill = event_time(r, "KILL");
    REQUIRE(t_kill > 0);
    CHECK(r.end_unix - t_kill < kTimeout + 5.0);
    CHECK(has(r, "rank 1"));
    // Survivors' own line (termination reporter), not only mpirun's.
    bool named = false;
    size_t b = 0;
    for (size_t e; (e = r.output.find('\n', b)) != std::string::npos; b = e + 1) {
        std::string line = r.output.substr(b, e - b);
        named |= line.find("terminated by SIGTERM") != std::string::npos &&
                 line.find("already gone") != std::string::npos && line.find("world rank 1 (pid") != std::string::npos;
    }
    CHECK(named);
}

TEST_CASE("SIGKILL on rank 1 with --enable-recovery: survivors time out and report the dead rank") {
    RunResult r = run_job("kill", "--enable-recovery");
    INFO(r.output);
    const double t_kill = event_time(r, "KILL");
    REQUIRE(t_kill > 0);
    CHECK(r.end_unix - t_kill < kTimeout + 5.0);
    CHECK(has(r, "all_reduce_sum on communicator 'world'"));
    CHECK(has(r, "no answer from rank 1"));
    CHECK(has(r, "the process is dead"));
}

TEST_CASE("rank 1 stops answering: the others name it within the timeout and the job exits non-zero") {
    RunResult r = run_job("hang", "");
    INFO(r.output);
    CHECK(r.exit_code != 0);
    const double t_hang = event_time(r, "HANG");
    REQUIRE(t_hang > 0);
    CHECK(r.end_unix - t_hang >= kTimeout);
    CHECK(r.end_unix - t_hang < kTimeout + 5.0);
    CHECK(has(r, "no answer from rank 1"));
    CHECK(has(r, "the process is alive"));
}
