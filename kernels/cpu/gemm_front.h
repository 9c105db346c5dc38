// Helpers shared by the GEMM front ends (int8_gemm.cpp, int4_gemm.cpp): the calling thread's activation
// scratch and the per-row preparation loop. Internal to kernels/cpu.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/int8_gemm.h"
#include "kernels/cpu/thread_pool.h"

namespace lattice::gemm_front {

// A thread_local buffer of the calling thread, grown on demand (no per-call allocation once warm); pool
// workers only read it while the caller waits in parallel_for.
using ScratchVec = std::vector<uint8_t, AlignedAllocator64<uint8_t>>;

inline uint8_t* scratch(ScratchVec& v, size_t bytes) {
    if (v.size() < bytes) v.resize(bytes);
    return v.data();
}

// Runs fn(row) for rows [0, m): on the caller alone for small m (decode), else across the pool.
template <class Fn>
void for_rows(int64_t m, ThreadPool& pool, Fn&& fn) {
    if (m < 8 || pool.size() == 1) {
        for (int64_t r = 0; r < m; ++r) fn(r);
        return;
    }
    pool.parallel_for(m, [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r) fn(r);
    });
}

}  // namespace lattice::gemm_front
