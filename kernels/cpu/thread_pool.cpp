// ThreadPool implementation: a generation counter wakes the workers, the op state (active_) admits them to
// an op and tells the caller when the last has left; see thread_pool.h.
#include "kernels/cpu/thread_pool.h"

#include "base/error.h"
#include "base/sched_slice.h"
#include "kernels/cpu/spin_policy.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <system_error>
#include <vector>

namespace lattice {

namespace {
// Pause steps (~25 ns each on Zen 4) before blocking, on an uncontended / contended core (spin_policy.h).
constexpr int kWorkerSpin = 20000, kCallerSpin = 100000, kContendedSpin = 1000;

std::vector<int> allowed_cpus() {
    std::vector<int> cpus;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        for (int c = 0; c < CPU_SETSIZE; ++c)
            if (CPU_ISSET(c, &set)) cpus.push_back(c);
    return cpus;
}

void pin_to(std::thread::native_handle_type h, int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(h, sizeof(set), &set);  // best effort: a refusal only costs locality
}
}  // namespace

int ThreadPool::available_cpus() {
    int n = int(allowed_cpus().size());
    return n > 0 ? n : 1;
}

ThreadPool::ThreadPool(int n_threads, bool pin) {
    // Short scheduler slices for the caller and (inherited) the workers: a hand-off to a thread whose core
    // another process keeps busy waits ~0.1 ms instead of that process's slice (base/sched_slice.h).
    request_short_sched_slice();
    std::vector<int> cpus = allowed_cpus();
    n_threads_ = n_threads > 0 ? n_threads : (cpus.empty() ? 1 : int(cpus.size()));
    // Pin only when every thread gets a core of its own: with more threads than cores (e.g.
    // several MPI ranks oversubscribing a small machine) pinning would stack threads. The caller stays as it
    // is (see the header); cpus[0] is the core left for it.
    bool do_pin = pin && !cpus.empty() && n_threads_ <= int(cpus.size()) && n_threads_ > 1;
    for (int i = 1; i < n_threads_; ++i) {
        try {
            threads_.emplace_back([this, i] { worker(i); });
        } catch (const std::system_error& e) {
            // The destructor does not run for a constructor that throws: stop and join the threads
            // already started, or their std::thread destructors would call std::terminate.
            stop_workers();
            LATTICE_FAIL("cannot start {} CPU threads: thread {} failed ({}); use fewer (--threads)", n_threads_, i,
                         e.what());
        }
        if (do_pin) pin_to(threads_.back().native_handle(), cpus[size_t(i) % cpus.size()]);
    }
}

void ThreadPool::stop_workers() {
    stop_.store(true);
    generation_.fetch_add(1);
    generation_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
}

ThreadPool::~ThreadPool() {
    stop_workers();
}

void ThreadPool::worker(int index) {
    uint64_t seen = 0, ran = 0;  // the generation last woken for; the run_on_all op last run
    SpinPolicy spins(kWorkerSpin, kContendedSpin);
    for (;;) {
        uint64_t g = generation_.load(std::memory_order_acquire);
        const int limit = spins.limit();
        for (int spin = 0; g == seen && spin < limit; ++spin) {
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
            g = generation_.load(std::memory_order_acquire);
        }
        if (g == seen) {
            generation_.wait(seen, std::memory_order_acquire);
            continue;
        }
        seen = g;
        if (stop_.load()) return;
        // Enter the op now open, whichever it is (a later one than woke us is fine: its fields were written
        // before it opened); a closed one is left untouched.
        if (active_.fetch_add(1, std::memory_order_acq_rel) & kClosed) {
            leave_op();
            continue;
        }
        if (!task_all_) {
            (*task_)(index);
        } else if (op_ != ran) {
            ran = op_;
            (*task_)(index);
            if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
        }
        leave_op();
    }
}

void ThreadPool::leave_op() {
    if (active_.fetch_sub(1, std::memory_order_acq_rel) == (kClosed | 1)) active_.notify_one();
}

namespace {
// Spins on the calling thread's budget, then blocks on `a` (whose changes decide `done()`), until `done()`.
template <class A, class Done>
void spin_then_wait(A& a, Done done) {
    thread_local SpinPolicy spins(kCallerSpin, kContendedSpin);
    const int limit = spins.limit();
    for (int spin = 0; !done(); ++spin) {
        if (spin < limit) {
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
        } else {
            const auto v = a.load(std::memory_order_acquire);
            if (!done()) a.wait(v, std::memory_order_acquire);
        }
    }
}
}  // namespace

void ThreadPool::run_op(const std::function<void(int)>& body, bool all) {
    task_ = &body;
    task_all_ = all;
    ++op_;
    if (all) pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    // Open (the fields above visible to whoever enters). An RMW, not a store: a worker that found the last op
    // closed may still be on its way out, its count in the low bits.
    active_.fetch_and(~kClosed, std::memory_order_acq_rel);
    generation_.fetch_add(1, std::memory_order_acq_rel);
    generation_.notify_all();
    // Close, then wait for the workers inside (running a piece they claimed) to leave; also when the caller's
    // part throws, so that no worker is left reading the caller's frame.
    auto finish = [&] {
        if (all) spin_then_wait(pending_, [&] { return pending_.load(std::memory_order_acquire) == 0; });
        active_.fetch_or(kClosed, std::memory_order_acq_rel);
        spin_then_wait(active_, [&] { return active_.load(std::memory_order_acquire) == kClosed; });
        task_ = nullptr;
    };
    try {
        body(0);
    } catch (...) {
        finish();
        throw;
    }
    finish();
}

void ThreadPool::run_on_all(const std::function<void(int)>& fn) {
    if (n_threads_ == 1) {
        fn(0);
        return;
    }
    run_op(fn, true);
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t grain) {
    if (n <= 0) return;
    int nt = n_threads_;
    if (nt == 1 || n <= grain) {
        fn(0, n, 0);
        return;
    }
    std::atomic<int> next{0};
    run_op(
        [&](int t) {
            for (int i = next.fetch_add(1, std::memory_order_relaxed); i < nt;
                 i = next.fetch_add(1, std::memory_order_relaxed)) {
                auto [lo, hi] = split_range(n, i, nt, grain);
                if (lo < hi) fn(lo, hi, t);
            }
        },
        false);
}

void ThreadPool::parallel_chunks(int64_t n, int64_t chunk, const std::function<void(int64_t, int64_t, int)>& fn) {
    if (n <= 0) return;
    if (chunk < 1) chunk = 1;
    if (n_threads_ == 1 || n <= chunk) {
        fn(0, n, 0);
        return;
    }
    std::atomic<int64_t> next{0};
    run_op(
        [&](int t) {
            for (int64_t lo = next.fetch_add(chunk, std::memory_order_relaxed); lo < n;
                 lo = next.fetch_add(chunk, std::memory_order_relaxed))
                fn(lo, std::min(n, lo + chunk), t);
        },
        false);
}

}  // namespace lattice
