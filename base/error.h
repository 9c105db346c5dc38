// lattice::Error and the check macros every layer uses.
// Library code throws Error with a message naming the culprit (file, tensor, rank, request);
// only launch/ catches it, prints one line and exits non-zero. The macros never compile to
// nothing and prefix host, rank and file:line, so a report from rank 5 of 16 on node b07 says so.
// Header-only: kernels/ may include it.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <unistd.h>

namespace lattice {

class Error : public std::runtime_error {
public:
    explicit Error(const std::string& msg) : std::runtime_error(msg), message_(msg) {}
    // `where`: "[host rank file:line] " (see where_prefix); what() is where + message.
    Error(const std::string& where, const std::string& msg) : std::runtime_error(where + msg), message_(msg) {}
    // The message alone, without the location prefix (for users, API error bodies, result files).
    const std::string& message() const { return message_; }

private:
    std::string message_;
};

// Process-wide identity used to label errors and logs; set once by launch/ after MPI init.
struct ProcessIdentity {
    int rank = 0;
    int world = 1;
    int tp_rank = 0;
    int pp_rank = 0;
    int device = -1;  // -1: CPU
};

inline ProcessIdentity& process_identity() {
    static ProcessIdentity id;
    return id;
}

inline std::string host_name() {
    char buf[256] = {0};
    if (gethostname(buf, sizeof(buf) - 1) != 0) return "?";
    return buf;
}

inline std::string where_prefix(const char* file, int line) {
    const ProcessIdentity& id = process_identity();
    const char* base = file;
    for (const char* p = file; *p; ++p)
        if (*p == '/') base = p + 1;
    if (id.device >= 0)
        return fmt::format("[{} r{}/{} dev{} {}:{}] ", host_name(), id.rank, id.world, id.device, base, line);
    return fmt::format("[{} r{}/{} {}:{}] ", host_name(), id.rank, id.world, base, line);
}

[[noreturn]] inline void throw_error(const char* file, int line, const std::string& msg) {
    throw Error(where_prefix(file, line), msg);
}

}  // namespace lattice

// Throws lattice::Error(fmt-formatted message) when cond is false.
#define LATTICE_CHECK(cond, ...)                                                  \
    do {                                                                          \
        if (!(cond)) [[unlikely]]                                                 \
            ::lattice::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
    } while (0)

#define LATTICE_FAIL(...) ::lattice::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__))
