// Build options for tests: CPU backend, threads without pinning (tests share the machine), the
// given layout. Tests adjust the rest (quantization, KV blocks, micro-batches) on the result.
#pragma once

#include "runtime/engine/build.h"

namespace lattice::test {

inline BuildOptions cpu_options(int threads = 1, int tp = 1, int pp = 1) {
    BuildOptions o;
    o.tp = tp;
    o.pp = pp;
    o.mpi = tp * pp > 1;
    o.comm_timeout = 30.0;
    o.backend.kind = BackendKind::kCpu;
    o.backend.threads = threads;
    o.backend.pin = false;
    return o;
}

}  // namespace lattice::test
