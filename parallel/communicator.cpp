// LocalComm: the 1-rank communicator (collectives are copies or no-ops).
#include "parallel/communicator.h"

#include <cstring>

namespace lattice {

void LocalComm::all_gather(const View& out, const View& in) {
    LATTICE_CHECK(out.bytes() == in.bytes() && in.device == Device::kCpu, "LocalComm::all_gather: size mismatch");
    if (out.data != in.data) std::memcpy(out.data, in.data, size_t(in.bytes()));
}

void LocalComm::reduce_scatter_sum(const View& out, const View& in) {
    LATTICE_CHECK(out.bytes() == in.bytes() && in.device == Device::kCpu,
                  "LocalComm::reduce_scatter_sum: size mismatch");
    if (out.data != in.data) std::memcpy(out.data, in.data, size_t(in.bytes()));
}

}  // namespace lattice
