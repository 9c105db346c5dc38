// lattice executable entry: parse the command line, run the chosen command, turn every
// lattice::Error into one line on stderr and a non-zero exit. When other MPI ranks exist, an error
// on one rank aborts the job (MPI_Abort) so nobody waits forever on a dead peer.
#include "kernels/cpu/int8_gemm.h"
#include "launch/cli.h"
#include "base/error.h"

#if !defined(LATTICE_NO_MPI)
#include <mpi.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <exception>

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

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"lattice: Llama-family inference across tensor- and pipeline-parallel ranks"};
    app.require_subcommand(1);
    app.set_version_flag("--version", "lattice 0.1.0");
    lattice::CommandRun run;
    lattice::add_generate_command(app, run);
    lattice::add_score_command(app, run);
    lattice::add_info_command(app, run);
    lattice::add_tokenize_command(app, run);
    lattice::add_doctor_command(app, run);
    lattice::add_calibrate_command(app, run);
    lattice::add_layout_command(app, run);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    int rc = 1;
    try {
        // LATTICE_ISA=scalar|avx2|avxvnni|avx512 picks the int8 CPU kernels (kernels/ never reads the env).
        if (const char* isa = std::getenv("LATTICE_ISA"); isa && *isa)
            lattice::set_isa_override(lattice::parse_isa(isa));
        rc = run ? run() : 1;
    } catch (const lattice::Error& e) {
        std::fprintf(stderr, "lattice: error: %s\n", e.what());
        std::fflush(stderr);
        abort_other_ranks(1);
        finalize_mpi();
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "lattice: internal error: %s\n", e.what());
        std::fflush(stderr);
        abort_other_ranks(2);
        finalize_mpi();
        return 2;
    }
    finalize_mpi();
    return rc;
}
