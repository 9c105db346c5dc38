// Helpers of MpiComm shared by its translation units (mpi_comm.cpp: calls and diagnosis; mpi_comm_shm.cpp:
// the shared-memory exchange inside a host). Not part of the communicator's interface.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "parallel/wait_policy.h"

namespace lattice::mpi_detail {

// "1,3,4"
std::string join_ints(const std::vector<int>& v);

// Completes a request of communicator setup under the policy's deadline; `step` ("" or ": what")
// names the part of the setup in the error.
void wait_setup(MPI_Request* req, const WaitPolicy& policy, const std::string& what, const std::string& step);

}  // namespace lattice::mpi_detail
