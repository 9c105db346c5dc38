// Wall time for stats and deadlines: a steady clock and seconds since a point of it.
#pragma once

#include <chrono>

namespace lattice {

using SteadyClock = std::chrono::steady_clock;

inline double seconds_since(SteadyClock::time_point t0) {
    return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

}  // namespace lattice
