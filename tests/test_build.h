// Build options for tests: CPU backend, threads without pinning (tests share the machine), the
// given layout. Tests adjust the rest (quantization, KV blocks, micro-batches) on the result.
#pragma once

#include "runtime/builder/build.h"

namespace lattice::test {

inline BuildOptions cpu_options(int threads = 1, int tp = 1, int pp = 1) {
    BuildOptions opt;
    opt.tp = tp;
    opt.pp = pp;
    opt.mpi = tp * pp > 1;
    opt.comm_timeout = 30.0;
    opt.backend.kind = BackendKind::kCpu;
    opt.backend.threads = threads;
    opt.backend.pin = false;
    return opt;
}

// A 2-layer GQA model small enough to fabricate and run in milliseconds (random weights), for the
// engine tests; `source` names the test in errors.
inline ModelConfig tiny_config(const char* source) {
    ModelConfig c;
    c.source = source;
    c.hidden = 32;
    c.intermediate = 48;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 8;
    c.vocab = 61;
    c.max_position = 64;
    c.eos_ids = {2};
    return c;
}

}  // namespace lattice::test
