// Test helpers of the conversion tests under mpirun: a folder every rank sees, its removal once every rank
// is done, and whether a model takes a tp x pp layout.
#pragma once

#include <doctest/doctest.h>
#include <mpi.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include "base/error.h"
#include "parallel/mpi_session.h"
#include "parallel/world_config.h"
#include "runtime/arch/config.h"

namespace lattice::testing {

// A folder every rank sees: rank 0 makes it, everyone gets its name.
inline std::string shared_temp_dir(const std::string& stem) {
    char buf[256] = {};
    if (mpi_session().rank() == 0) {
        std::string t = (std::filesystem::temp_directory_path() / (stem + "_XXXXXX")).string();
        REQUIRE(::mkdtemp(t.data()) != nullptr);
        std::strncpy(buf, t.c_str(), sizeof(buf) - 1);
    }
    MPI_Bcast(buf, sizeof(buf), MPI_CHAR, 0, MPI_COMM_WORLD);
    return buf;
}

inline void remove_shared(const std::string& dir) {
    MPI_Barrier(MPI_COMM_WORLD);
    if (mpi_session().rank() == 0) {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

inline bool layout_fits(const ModelConfig& c, int tp, int pp) {
    try {
        check_model_layout(c.dims(), tp, pp);
        return true;
    } catch (const Error&) {
        return false;
    }
}

}  // namespace lattice::testing
