// Wall time for stats and deadlines: a steady clock and seconds since a point of it; and the calling
// thread's CPU time (the part of a wall-time span this thread actually ran).
#pragma once

#include <time.h>

#include <chrono>

namespace lattice {

using SteadyClock = std::chrono::steady_clock;

inline double seconds_since(SteadyClock::time_point t0) {
    return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

inline double thread_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

}  // namespace lattice
