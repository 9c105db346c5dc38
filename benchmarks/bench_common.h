// Shared benchmark helpers: the memory-bandwidth ceiling (a streaming read of a buffer much larger
// than the caches by every thread of the pool), timing (wall, thread CPU, best of a budget), the median of samples, and
// the JSON/table output convention.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/cpu/huge_pages.h"
#include "kernels/cpu/thread_pool.h"

namespace lattice::bench {

inline double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// CPU time of the calling thread: on a shared, oversubscribed machine the wall clock includes time
// other processes held our cores; the thread's CPU time does not.
inline double thread_cpu_s() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Best-of timing of `call(rep)` with a time budget (seconds of wall clock; at most 300 calls): the caller
// thread's CPU time (a 1-thread pool) or the wall clock. Call 0 warms up; at least one is timed after it.
template <class F>
double best_time(F&& call, bool cpu_time, double budget) {
    double best = 1e30, spent = 0;
    for (int rep = 0; rep < 300 && (rep < 2 || spent < budget); ++rep) {
        double w0 = now(), c0 = thread_cpu_s();
        call(rep);
        double c = thread_cpu_s() - c0, w = now() - w0;
        if (rep > 0) best = std::min(best, cpu_time ? c : w);
        spent += w;
    }
    return best;
}

// The median of non-empty samples (the upper of the middle two for an even count).
inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Streams [p, p + bytes) (64-byte aligned) with 4 independent 64-byte loads per step and software
// prefetch 2 KiB ahead (reads past the end are harmless prefetches); returns a
// checksum so the loads cannot be dropped. AVX-512 where available, else 8-byte loads.
__attribute__((target("avx512f"))) inline uint64_t stream_read_avx512(const uint8_t* p, size_t bytes) {
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 256 <= bytes; i += 256) {
        // Same software prefetch distance as the decode kernels, so the ceiling is what they can reach.
        _mm_prefetch(reinterpret_cast<const char*>(p + i + 2048), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(p + i + 2048 + 64), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(p + i + 2048 + 128), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(p + i + 2048 + 192), _MM_HINT_T0);
        s0 = _mm512_xor_si512(s0, _mm512_load_si512(p + i));
        s1 = _mm512_xor_si512(s1, _mm512_load_si512(p + i + 64));
        s2 = _mm512_xor_si512(s2, _mm512_load_si512(p + i + 128));
        s3 = _mm512_xor_si512(s3, _mm512_load_si512(p + i + 192));
    }
    s0 = _mm512_xor_si512(_mm512_xor_si512(s0, s1), _mm512_xor_si512(s2, s3));
    alignas(64) uint64_t lanes[8];
    _mm512_store_si512(lanes, s0);
    return lanes[0] ^ lanes[7];
}

inline uint64_t stream_read(const uint8_t* p, size_t bytes) {
    if (__builtin_cpu_supports("avx512f")) return stream_read_avx512(p, bytes);
    uint64_t s[4] = {0, 0, 0, 0};
    for (size_t i = 0; i + 32 <= bytes; i += 32)
        for (int j = 0; j < 4; ++j) {
            uint64_t v;
            std::memcpy(&v, p + i + 8 * size_t(j), 8);
            s[j] ^= v;
        }
    return s[0] ^ s[1] ^ s[2] ^ s[3];
}

// Best-of-`reps` read bandwidth in GB/s (wall clock) over `bytes` (default 1 GiB), each thread of
// the pool streaming its own contiguous slice: the ceiling a weight-streaming decode is held to.
inline double measure_read_bandwidth(ThreadPool& pool, size_t bytes = size_t(1) << 30, int reps = 5) {
    // Huge pages, as the engine's weights (kernels/cpu/huge_pages.h): the ceiling is what lattice can reach.
    uint8_t* buf = static_cast<uint8_t*>(map_huge(bytes));
    if (!buf) throw std::bad_alloc();
    pool.parallel_for(int64_t(bytes), [&](int64_t lo, int64_t hi, int) { std::memset(buf + lo, 1, size_t(hi - lo)); },
                      4096);
    std::vector<uint64_t> sink(static_cast<size_t>(pool.size()));
    double best = 0;
    for (int r = 0; r < reps; ++r) {
        double t0 = now();
        pool.parallel_for(int64_t(bytes), [&](int64_t lo, int64_t hi, int t) {
            sink[size_t(t)] ^= stream_read(buf + lo, size_t(hi - lo));
        }, 4096);
        best = std::max(best, double(bytes) / (now() - t0) * 1e-9);
    }
    volatile uint64_t keep = sink[0];
    (void)keep;
    unmap_huge(buf, bytes);
    return best;
}

inline void write_json(const std::string& path, const nlohmann::json& j) {
    if (path.empty()) return;
    std::ofstream f(path);
    f << j.dump(2) << "\n";
}

}  // namespace lattice::bench
