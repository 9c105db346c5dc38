// Shared benchmark helpers: the memory-bandwidth ceiling (a streaming read of a buffer much larger
// than the caches by every thread of the pool), timing, and the JSON/table output convention.
#pragma once

#include "kernels/cpu/thread_pool.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <immintrin.h>
#include <string>
#include <vector>

namespace lattice::bench {

inline double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Best-of-`reps` read bandwidth in GB/s over `bytes` (default 1 GiB), split across the pool's threads.
inline double measure_read_bandwidth(ThreadPool& pool, size_t bytes = size_t(1) << 30, int reps = 5) {
    const size_t n = bytes / sizeof(float);
    float* buf = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
    pool.parallel_for(int64_t(n), [&](int64_t lo, int64_t hi, int) {
        for (int64_t i = lo; i < hi; ++i) buf[i] = float(i & 1023);
    }, 4096);
    std::vector<float> sink(size_t(pool.size()) * 16);
    double best = 0;
    for (int r = 0; r < reps; ++r) {
        double t0 = now();
        pool.parallel_for(int64_t(n), [&](int64_t lo, int64_t hi, int t) {
            float acc[16] = {0};
            for (int64_t i = lo; i + 16 <= hi; i += 16)
                for (int j = 0; j < 16; ++j) acc[j] += buf[i + j];
            for (int j = 0; j < 16; ++j) sink[size_t(t) * 16 + size_t(j)] += acc[j];
        }, 4096);
        double dt = now() - t0;
        best = std::max(best, double(bytes) / dt * 1e-9);
    }
    std::free(buf);
    return best;
}

inline void write_json(const std::string& path, const nlohmann::json& j) {
    if (path.empty()) return;
    std::ofstream f(path);
    f << j.dump(2) << "\n";
}

}  // namespace lattice::bench
