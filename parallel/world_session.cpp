// The world with MPI hidden (see world_session.h). Without MPI every function serves one rank.
#include "parallel/world_session.h"

#if !defined(LATTICE_NO_MPI)
#include "parallel/mpi_session.h"
#endif

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <numeric>
#include <thread>

namespace lattice {

#if defined(LATTICE_NO_MPI)

WorldPlace join_world() { return {}; }
void finalize_world() {}
void abort_world(int) {}
void report_dead_peers_on_termination() {}
std::string mpi_library_name() { return "not built (single rank only)"; }
std::vector<std::string> gather_strings_to_root(const std::string& mine) { return {mine}; }
int broadcast_int_from_root(int value) { return value; }

#else

WorldPlace join_world() {
    const MpiSession& s = mpi_session();
    return {s.rank(), s.size(), s.local_rank(), s.local_size()};
}

void finalize_world() {
    if (mpi_active()) MPI_Finalize();
}

// MPI_Abort hands the job's end to the launcher (mpirun, its daemons). When the launcher cannot be
// reached (this host cut off, its daemon hung) that may never end this process, so a detached thread
// ends it kAbortSelfExitAfterS later with kAbortSelfExitCode and one line naming it. The line is built
// before the thread starts: the thread only sleeps, write()s and _exit()s.
void abort_world(int code) {
    if (!mpi_active()) return;
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size <= 1) return;
    const MpiSession& s = mpi_session();
    auto line = std::make_shared<std::string>(fmt::format(
        "lattice: rank {} on {}: MPI_Abort did not end this rank within {:g} s (launcher unreachable?); it exits "
        "by itself with code {}\n",
        s.rank(), s.host(), kAbortSelfExitAfterS, kAbortSelfExitCode));
    std::fflush(stdout);
    std::thread([line] {
        std::this_thread::sleep_for(std::chrono::duration<double>(kAbortSelfExitAfterS));
        ssize_t ignored = write(2, line->data(), line->size());
        (void)ignored;
        _exit(kAbortSelfExitCode);
    }).detach();
    MPI_Abort(MPI_COMM_WORLD, code);
}

void report_dead_peers_on_termination() {
    if (mpi_active() && mpi_session().size() > 1) mpi_session().install_termination_reporter();
}

std::string mpi_library_name() {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
    int len = 0;
    MPI_Get_library_version(lib, &len);
    const std::string text(lib, size_t(std::max(0, len)));
    return text.substr(0, text.find_first_of("\n,"));  // the first clause: name and version
}

// Variable lengths: the sizes first, then one Gatherv of the bytes.
std::vector<std::string> gather_strings_to_root(const std::string& mine) {
    const MpiSession& s = mpi_session();
    const size_t world = size_t(s.size());
    int len = int(mine.size());
    std::vector<int> lens(world), displs(world);
    MPI_CHECK(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, s.world()));
    std::string all;
    if (s.rank() == 0) {
        std::exclusive_scan(lens.begin(), lens.end(), displs.begin(), 0);
        all.resize(size_t(displs.back() + lens.back()));
    }
    MPI_CHECK(MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0,
                          s.world()));
    std::vector<std::string> out;
    if (s.rank() == 0)
        for (size_t r = 0; r < world; ++r) out.push_back(all.substr(size_t(displs[r]), size_t(lens[r])));
    return out;
}

int broadcast_int_from_root(int value) {
    MPI_CHECK(MPI_Bcast(&value, 1, MPI_INT, 0, mpi_session().world()));
    return value;
}

#endif

}  // namespace lattice
