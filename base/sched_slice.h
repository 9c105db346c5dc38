// Short scheduler slices for the calling thread (and the threads it starts later, which inherit
// them): Linux's EEVDF scheduler (6.12 and later) takes sched_attr.sched_runtime of a normal task as
// the slice it asks for. lattice's threads mostly hand work to each other (a rank to the next
// stage, a TP group's all-reduce, the thread pool's per-op wake-ups) and wait; with the default
// slice (0.75-3 ms) a woken thread on a core shared with another busy process waits out that
// process's slice at every hand-off. Measured on a 2-core Zen 4 VM, kernel 6.18, beside two `yes`
// loops: 4 ranks of test_layouts took 154 s with the default 1.4 ms slice and 14 s with 100 us.
// On an idle machine nothing changes (nothing else is runnable), and older kernels ignore the field.
//
// Asked by the thread pool's constructor (for the caller and its workers) and MPI start-up. The CLI
// sets the slice from LATTICE_SCHED_SLICE_US (set_sched_slice_ns; default 100 us, the kernel's minimum;
// 0 leaves the kernel's default) before any command runs. The thread's policy and nice value are kept
// (read back first); a thread under a real-time policy is left alone. Best effort: a refusal changes
// nothing and is not an error.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>

namespace lattice {

namespace detail {
struct SchedAttr {  // struct sched_attr (linux/sched/types.h), which glibc 2.36 does not declare
    uint32_t size;
    uint32_t sched_policy;
    uint64_t sched_flags;
    int32_t sched_nice;
    uint32_t sched_priority;
    uint64_t sched_runtime;
    uint64_t sched_deadline;
    uint64_t sched_period;
    uint32_t sched_util_min;
    uint32_t sched_util_max;
};

inline constexpr uint64_t kDefaultSchedSliceNs = 100000;  // 100 us, the kernel's minimum
inline std::atomic<uint64_t> g_sched_slice_ns{kDefaultSchedSliceNs};
}  // namespace detail

// The slice later requests ask for (0: none).
inline void set_sched_slice_ns(uint64_t ns) { detail::g_sched_slice_ns.store(ns); }

// LATTICE_SCHED_SLICE_US's value (nullptr or empty: the default) as ns; false for a malformed value
// (the CLI refuses it, naming the variable).
inline bool parse_sched_slice_us(const char* v, uint64_t& ns) {
    ns = detail::kDefaultSchedSliceNs;
    if (!v || !*v) return true;
    char* end = nullptr;
    const double us = std::strtod(v, &end);
    if (end == v || *end != '\0' || !(us >= 0) || us > 1e6) return false;
    ns = uint64_t(us * 1000.0);
    return true;
}

// Sets the calling thread's slice request to `ns` (0: the kernel's default), its policy and nice value kept;
// false when the kernel refuses, or the thread runs under a real-time policy (left alone).
inline bool set_thread_sched_slice(uint64_t ns) {
#if defined(__linux__) && defined(SYS_sched_setattr) && defined(SYS_sched_getattr)
    detail::SchedAttr a{};
    if (syscall(SYS_sched_getattr, 0, &a, unsigned(sizeof a), 0u) != 0) return false;
    constexpr uint32_t kOther = 0, kBatch = 3, kIdle = 5;  // SCHED_OTHER, SCHED_BATCH, SCHED_IDLE
    if (a.sched_policy != kOther && a.sched_policy != kBatch && a.sched_policy != kIdle) return false;
    a.size = sizeof a;
    a.sched_flags = 0;
    a.sched_runtime = ns;
    return syscall(SYS_sched_setattr, 0, &a, 0u) == 0;
#else
    (void)ns;
    return false;
#endif
}

// Asks for the set slice (set_sched_slice_ns) once per thread; returns whether the kernel accepted it.
inline bool request_short_sched_slice() {
    thread_local int done = -1;
    if (done < 0) {
        const uint64_t slice = detail::g_sched_slice_ns.load();
        done = slice != 0 && set_thread_sched_slice(slice) ? 1 : 0;
    }
    return done == 1;
}

}  // namespace lattice
