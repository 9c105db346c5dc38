// lattice executable entry: parse the command line, run the chosen command, turn every
// lattice::Error into one line on stderr and a non-zero exit. When other MPI ranks exist, an error
// on one rank aborts the job (MPI_Abort) so nobody waits forever on a dead peer.
// Exit codes: 0 success; 1 an error in the input, the files or the run (lattice::Error, one line
// "lattice: error: ..."); 2 a bad command line (one line naming the flag); 3 an internal error (a
// bug: every input is meant to give 1 or 2). A command whose stdout cannot be written (full disk,
// closed descriptor) exits 1 naming stdout.
#include "kernels/cpu/int8_gemm.h"
#include "launch/cli.h"
#include "launch/cli_common.h"
#include "base/error.h"

#include <fcntl.h>
#include <unistd.h>
#if !defined(LATTICE_NO_MPI)
#include <mpi.h>
#endif

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <new>

namespace {

void abort_other_ranks([[maybe_unused]] int code) {
#if !defined(LATTICE_NO_MPI)
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) {
        int size = 1;
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        if (size > 1) MPI_Abort(MPI_COMM_WORLD, code);
    }
#endif
}

void finalize_mpi() {
#if !defined(LATTICE_NO_MPI)
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Finalize();
#endif
}

// A closed stdin/stdout/stderr would let the next open() take its number, and the output meant for
// the terminal would go into a model file or an output file. Each closed one gets /dev/null opened
// read-only: writes to it fail (EBADF) as they would on the closed descriptor, and are reported.
void occupy_closed_std_fds() {
    for (int fd = 0; fd <= 2; ++fd) {
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
        const int n = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (n >= 0 && n != fd) {
            dup2(n, fd);
            close(n);
        }
    }
}

int fail(const char* kind, const char* what, int code) {
    std::fprintf(stderr, "lattice: %s: %s\n", kind, what);
    std::fflush(stderr);
    abort_other_ranks(code);
    finalize_mpi();
    return code;
}

}  // namespace

int main(int argc, char** argv) {
    occupy_closed_std_fds();
    CLI::App app{"lattice: Llama-family inference across tensor- and pipeline-parallel ranks"};
    app.require_subcommand(1);
    app.set_version_flag("--version", "lattice 0.1.0");
    // One line per command-line error, naming the flag (CLI11's default adds a second line).
    app.failure_message([](const CLI::App*, const CLI::Error& e) {
        return fmt::format("lattice: error: {} (see --help)\n", e.what());
    });
    lattice::CommandRun run;
    lattice::add_generate_command(app, run);
    lattice::add_chat_command(app, run);
    lattice::add_score_command(app, run);
    lattice::add_info_command(app, run);
    lattice::add_tokenize_command(app, run);
    lattice::add_doctor_command(app, run);
    lattice::add_calibrate_command(app, run);
    lattice::add_layout_command(app, run);
    lattice::add_batch_command(app, run);
    lattice::add_serve_command(app, run);
    lattice::add_convert_command(app, run);
    lattice::add_verify_command(app, run);
    int rc = 1;
    try {
        try {
            app.parse(argc, argv);
        } catch (const CLI::ParseError& e) {
            rc = app.exit(e);  // prints help / version (rc 0) or the one-line error
            if (rc != 0) return 2;
            lattice::flush_stdout();
            return 0;
        }
        // LATTICE_ISA=scalar|avx2|avxvnni|avx512 picks the int8 CPU kernels (kernels/ never reads the env).
        if (const char* isa = std::getenv("LATTICE_ISA"); isa && *isa)
            lattice::set_isa_override(lattice::parse_isa(isa));
        rc = run ? run() : 1;
        lattice::flush_stdout();  // what a command printed must have reached its file
    } catch (const lattice::Error& e) {
        return fail("error", e.what(), 1);
    } catch (const std::bad_alloc&) {
        return fail("error", "out of memory", 1);
    } catch (const std::filesystem::filesystem_error& e) {  // a backstop: its message names the path
        return fail("error", e.what(), 1);
    } catch (const std::exception& e) {
        return fail("internal error", e.what(), 3);
    }
    finalize_mpi();
    return rc;
}
