// Launch helpers shared by the memory-bound row and elementwise kernels (elementwise.cu, norm_quant.cu).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cuda/device_common.cuh"

namespace lattice::cuda::rows_launch {

constexpr int kRowThreads = 256;

inline bool aligned_to(const void* p, uintptr_t a) {
    return reinterpret_cast<uintptr_t>(p) % a == 0;
}

inline unsigned grid_for(int64_t n, int threads = 256) {
    const int64_t b = ceil_div(n, threads);
    return unsigned(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}

inline void check_rows(int64_t m, const char* op) {
    KERNEL_CHECK(m >= 0 && m <= 0x7fffffff,
                 std::string("cuda::") + op + ": " + std::to_string(m) + " rows out of range");
}

}  // namespace lattice::cuda::rows_launch
