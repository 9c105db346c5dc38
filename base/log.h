// Minimal leveled logging to stderr: "[r3/8 tp1 pp0] message".
// Rank 0 logs INFO by default, other ranks WARN and up (set_log_level overrides).
#pragma once

#include "base/error.h"

#include <fmt/format.h>

#include <cstdio>

namespace lattice {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

inline LogLevel& log_level_ref() {
    static LogLevel level = LogLevel::kInfo;
    return level;
}

inline void set_log_level(LogLevel level) { log_level_ref() = level; }

// Applies the default policy for this rank (INFO on rank 0, WARN elsewhere).
inline void set_default_log_level_for_rank(int rank) {
    log_level_ref() = rank == 0 ? LogLevel::kInfo : LogLevel::kWarn;
}

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
    if (level < log_level_ref()) return;
    const ProcessIdentity& id = process_identity();
    std::string msg = fmt::format(f, std::forward<Args>(args)...);
    std::string line = fmt::format("[r{}/{} tp{} pp{}] {}\n", id.rank, id.world, id.tp_rank, id.pp_rank, msg);
    std::fwrite(line.data(), 1, line.size(), stderr);
}

#define LOG_DEBUG(...) ::lattice::log(::lattice::LogLevel::kDebug, __VA_ARGS__)
#define LOG_INFO(...) ::lattice::log(::lattice::LogLevel::kInfo, __VA_ARGS__)
#define LOG_WARN(...) ::lattice::log(::lattice::LogLevel::kWarn, __VA_ARGS__)
#define LOG_ERROR(...) ::lattice::log(::lattice::LogLevel::kError, __VA_ARGS__)

}  // namespace lattice
