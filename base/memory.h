// Process memory introspection for stats and tests: resident set size (now and peak) from /proc/self/status;
// the GiB unit that memory is reported in.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace lattice {

inline constexpr int64_t kGiB = int64_t(1) << 30;

inline double to_gib(double bytes) { return bytes / double(kGiB); }

// Current resident set (VmRSS) in bytes; 0 where /proc is unavailable.
inline int64_t resident_bytes() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
    return 0;
}

// Peak resident set (VmHWM) in bytes; 0 where /proc is unavailable.
inline int64_t peak_resident_bytes() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
    return 0;
}

}  // namespace lattice
