// Worker for test_mpi_failure (run under mpirun by the test, not by CTest directly).
// usage: mpi_failure_worker MODE TIMEOUT_S
//   ok    : 60 all-reduces, then a clean exit (the control case)
//   kill  : rank 1 prints "KILL <unix time>" and raise(SIGKILL)s itself at iteration 20
//   hang  : rank 1 prints "HANG <unix time>" and sleeps for an hour at iteration 20
// Like launch/main.cpp, a rank that catches lattice::Error prints one line, lets its peers print
// theirs for a moment, then MPI_Aborts. The termination reporter is installed, as launch/ does.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include "parallel/mpi_comm.h"

using namespace lattice;

namespace {

double unix_now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s ok|kill|hang TIMEOUT_S\n", argv[0]);
        return 2;
    }
    const std::string mode = argv[1];
    const double timeout = std::atof(argv[2]);
    try {
        MpiSession& s = mpi_session();
        s.install_termination_reporter();
        WaitPolicy p;
        p.timeout_s = timeout;
        p.grace_s = 1.0;
        auto w = MpiComm::world(p, "world");
        std::vector<float> x(1000);
        for (int it = 0; it < 60; ++it) {
            if (it == 20 && w->rank() == 1 && mode != "ok") {
                std::fprintf(stderr, "%s %.3f\n", mode == "kill" ? "KILL" : "HANG", unix_now());
                std::fflush(stderr);
                if (mode == "kill") raise(SIGKILL);
                std::this_thread::sleep_for(std::chrono::hours(1));
            }
            for (size_t i = 0; i < x.size(); ++i) x[i] = float(w->rank() + 1);
            w->all_reduce_sum(View::contiguous(x.data(), DType::kF32, {int64_t(x.size())}));
            const float e = float(w->size() * (w->size() + 1) / 2);
            LATTICE_CHECK(x[0] == e && x[999] == e, "iteration {}: sum {} != {}", it, x[0], e);
        }
        w->barrier();
        std::fprintf(stderr, "rank %d done\n", w->rank());
    } catch (const Error& e) {
        std::fprintf(stderr, "lattice: error: %s\n", e.what());
        std::fflush(stderr);
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        MPI_Abort(MPI_COMM_WORLD, 1);
        return 1;
    }
    return 0;  // the session finalizes MPI at exit
}
