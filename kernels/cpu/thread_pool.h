// ThreadPool: one persistent set of worker threads, pinned to cores, for every CPU kernel.
// parallel_for(n, fn) splits [0, n) into one contiguous range per thread (the caller is thread 0)
// so each thread streams its own slice of weights; no thread is created per op.
// Workers spin briefly on a generation counter, then block in std::atomic::wait, which keeps
// per-op dispatch around a microsecond during decode without burning idle cores forever.
// Not re-entrant: a task must not call parallel_for on the same pool.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace lattice {

class ThreadPool {
public:
    // n_threads <= 0: one per available core. pin: bind thread i to the i-th allowed CPU.
    // Throws Error (having joined the threads it started) when the system refuses a thread.
    explicit ThreadPool(int n_threads = 0, bool pin = true);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return n_threads_; }

    // Calls fn(begin, end, thread_index) over a partition of [0, n) in chunks aligned to `grain`.
    void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t grain = 1);

    // Calls fn(begin, end, thread_index) over [0, n) in chunks of `chunk` items (the last one shorter) that the
    // threads claim in order from a shared counter: a thread that wakes late or runs slow (a shared machine's
    // descheduled vCPU) takes fewer chunks instead of holding the others at the join. For loops whose items
    // are independent (each output written by one call, so the split does not change any result); a thread
    // may get several calls, in increasing order of begin. One call over [0, n) on the caller when the pool
    // has one thread or n <= chunk.
    void parallel_chunks(int64_t n, int64_t chunk, const std::function<void(int64_t, int64_t, int)>& fn);

    // Runs fn(thread_index) once on every thread.
    void run_on_all(const std::function<void(int)>& fn);

    // Number of CPUs this process may run on (sched_getaffinity), at least 1.
    static int available_cpus();

private:
    void worker(int index);
    void stop_workers();

    int n_threads_ = 1;
    std::vector<std::thread> threads_;
    const std::function<void(int)>* task_ = nullptr;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> pending_{0};
    std::atomic<bool> stop_{false};
};

// The chunk for parallel_chunks: about `per_thread` chunks per thread (enough for a late thread to lose
// little, few enough that each stays a long stream of weights), at least `min_chunk` items.
inline int64_t chunk_for(int64_t n, int threads, int64_t per_thread = 4, int64_t min_chunk = 1) {
    const int64_t parts = int64_t(threads) * per_thread;
    const int64_t c = (n + parts - 1) / parts;
    return c > min_chunk ? c : min_chunk;
}

// Contiguous range of thread `t` of `nt` over [0, n), aligned to `grain`.
inline std::pair<int64_t, int64_t> split_range(int64_t n, int t, int nt, int64_t grain = 1) {
    int64_t blocks = (n + grain - 1) / grain;
    int64_t b0 = blocks * t / nt, b1 = blocks * (t + 1) / nt;
    int64_t lo = b0 * grain, hi = b1 * grain;
    return {lo < n ? lo : n, hi < n ? hi : n};
}

}  // namespace lattice
