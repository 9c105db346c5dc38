// lattice_doctor_driver: runs `doctor` through the same registration (add_doctor_command) and the
// same MPI finalization as the `lattice` executable, without linking the engine, so the launch
// tests can run the preflight under mpirun/Slurm even while the engine is being built. It takes
// the same argv as `lattice` (`lattice_doctor_driver doctor --tp 2`).
#include "launch/cli.h"
#include "runtime/base/error.h"

#include <mpi.h>

#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
    CLI::App app{"lattice (doctor only; test driver)"};
    app.require_subcommand(1);
    lattice::CommandRun run;
    lattice::add_doctor_command(app, run);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    int rc = 1;
    try {
        rc = run ? run() : 1;
    } catch (const lattice::Error& e) {
        std::fprintf(stderr, "lattice: error: %s\n", e.what());
        rc = 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "lattice: internal error: %s\n", e.what());
        rc = 2;
    }
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Finalize();
    return rc;
}
