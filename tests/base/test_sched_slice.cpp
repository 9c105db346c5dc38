// base/sched_slice.h: LATTICE_SCHED_SLICE_US parsing; the thread pool's constructor gives its caller and
// its workers the short slice (read back from /proc/thread-self/sched), keeping the nice value; 0 leaves
// the kernel's default. The kernel cases ([sched]) SKIP where the kernel has no custom slices (before
// Linux 6.12: no se.slice line, or a request that does not change it).
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>

#include "base/sched_slice.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/test_skip.h"

using namespace lattice;

namespace {

// The calling thread's slice in ns (-1 where /proc shows none).
long long thread_slice_ns() {
    std::ifstream f("/proc/thread-self/sched");
    for (std::string line; std::getline(f, line);)
        if (line.rfind("se.slice", 0) == 0) return std::stoll(line.substr(line.find(':') + 1));
    return -1;
}

// Whether this kernel honours a normal thread's slice request (asked in a thread of its own).
bool kernel_has_custom_slices() {
    bool yes = false;
    std::thread t([&] { yes = set_thread_sched_slice(200000) && thread_slice_ns() == 200000; });
    t.join();
    return yes;
}

struct Seen {
    long long caller = -1, worker = -1, default_slice = -1;
    int nice_before = 0, nice_after = 0;
};

// In a fresh thread (requests are once per thread): its slice before, then after building a pool of 2, and a
// worker's. The thread's nice value is raised to 3 first, to see that the request keeps it.
Seen run_in_fresh_thread() {
    Seen s;
    std::thread t([&] {
        const pid_t tid = pid_t(syscall(SYS_gettid));
        REQUIRE(set_thread_sched_slice(0));
        setpriority(PRIO_PROCESS, id_t(tid), 3);
        s.nice_before = getpriority(PRIO_PROCESS, id_t(tid));
        s.default_slice = thread_slice_ns();
        ThreadPool pool(2, false);
        s.caller = thread_slice_ns();
        pool.run_on_all([&](int i) {
            if (i == 1) s.worker = thread_slice_ns();
        });
        s.nice_after = getpriority(PRIO_PROCESS, id_t(tid));
    });
    t.join();
    return s;
}

}  // namespace

TEST_CASE("LATTICE_SCHED_SLICE_US: microseconds from 0 to 1e6, unset means 100 us, anything else refused") {
    uint64_t ns = 1;
    CHECK(parse_sched_slice_us(nullptr, ns));
    CHECK(ns == 100000);
    CHECK(parse_sched_slice_us("", ns));
    CHECK(ns == 100000);
    CHECK(parse_sched_slice_us("250", ns));
    CHECK(ns == 250000);
    CHECK(parse_sched_slice_us("0", ns));
    CHECK(ns == 0);
    for (const char* bad : {"abc", "-1", "1e9", "100us", "nan", " "}) {
        CAPTURE(bad);
        CHECK_FALSE(parse_sched_slice_us(bad, ns));
    }
}

TEST_CASE("[sched] a thread pool's caller and workers get the short slice, their nice value kept; 0 leaves them") {
    if (thread_slice_ns() < 0) LATTICE_SKIP("this kernel shows no se.slice in /proc/thread-self/sched");
    if (!kernel_has_custom_slices())
        LATTICE_SKIP("this kernel ignores sched_attr.sched_runtime for normal threads (custom slices came in Linux 6.12)");
    set_sched_slice_ns(100000);
    const Seen s = run_in_fresh_thread();
    CHECK(s.caller == 100000);
    CHECK(s.worker == 100000);  // inherited from the caller
    CHECK(s.nice_before == 3);
    CHECK(s.nice_after == 3);

    set_sched_slice_ns(0);
    const Seen off = run_in_fresh_thread();
    CHECK(off.caller == off.default_slice);
    CHECK(off.worker == off.default_slice);
    CHECK(off.default_slice != 100000);
    set_sched_slice_ns(100000);
}
