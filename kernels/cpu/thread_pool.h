// ThreadPool: one persistent set of worker threads (optionally pinned to cores), for every CPU kernel.
// parallel_for(n, fn) splits [0, n) into one contiguous range per thread (the caller is thread 0)
// so each thread streams its own slice of weights; no thread is created per op.
// Workers spin briefly on a generation counter, then block in std::atomic::wait, which keeps
// per-op dispatch around a microsecond during decode without burning idle cores forever; a thread whose
// core another process contends spins ~25 us instead (spin_policy.h).
// Hand-off: parallel_for's ranges and parallel_chunks' chunks are claimed from a shared counter, the caller
// among them; once none is left the caller closes the op and waits only for the workers that entered it (are
// running a claimed piece), never for one that has not woken yet: a worker that wakes after the close leaves
// without touching the op. So a descheduled worker (a busy machine's vCPU, a parked thread whose wake-up waits
// for a time slice) costs the op at most its own piece, not a scheduler round trip per op (~150 ops a token for
// a 30-layer model): with 2 threads on a 2-vCPU host at load ~10 the built-in model's decode went from 1.1 to
// 72.8 tok/s (bench_decode, median of 3 interleaved rounds; docs/benchmark-results.md). Which thread runs which
// piece does not change any result (each output is written by one call, as before).
// Invariant of the op state (active_): bit kClosed set by the caller when it is done with the op, the low bits
// count workers inside it; the op's fields are written only while it is closed with no worker inside.
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
    // n_threads <= 0: one per available core. pin: bind worker i (1..n-1) to the i-th allowed CPU. The caller's
    // affinity is left as it is: a pinned caller passed its one CPU to every thread it started later (a second
    // pool -- the draft model's, a benchmark's -- read it as its whole machine and ran both its threads on one
    // core: bench_decode's 2 threads ran at 0.6x of one). Nothing pins unless asked, like the engine
    // (BackendOptions::pin): a caller that wakes on a pinned worker's core holds it until the scheduler moves the
    // caller, and tests running side by side would stack their pinned workers on the same cores.
    // Throws Error (having joined the threads it started) when the system refuses a thread.
    explicit ThreadPool(int n_threads = 0, bool pin = false);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return n_threads_; }

    // Calls fn(begin, end, thread_index) over a partition of [0, n) in chunks aligned to `grain` (one range per
    // thread, split_range's; a range may run on any thread, each on one).
    void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t grain = 1);

    // Calls fn(begin, end, thread_index) over [0, n) in chunks of `chunk` items (the last one shorter) that the
    // threads claim in order from a shared counter: a thread that wakes late or runs slow (a shared machine's
    // descheduled vCPU) takes fewer chunks instead of holding the others at the join. For loops whose items
    // are independent (each output written by one call, so the split does not change any result); a thread
    // may get several calls, in increasing order of begin. One call over [0, n) on the caller when the pool
    // has one thread or n <= chunk.
    void parallel_chunks(int64_t n, int64_t chunk, const std::function<void(int64_t, int64_t, int)>& fn);

    // Runs fn(thread_index) once on every thread (waits for every worker to wake).
    void run_on_all(const std::function<void(int)>& fn);

    // Number of CPUs this process may run on (sched_getaffinity), at least 1.
    static int available_cpus();

private:
    static constexpr uint32_t kClosed = 1u << 31;
    void worker(int index);
    void stop_workers();
    // Opens an op running body(thread) on the caller and on every worker that enters it before it closes;
    // `all` (run_on_all): every worker runs it exactly once and the caller waits for all of them.
    void run_op(const std::function<void(int)>& body, bool all);
    void leave_op();

    int n_threads_ = 1;
    std::vector<std::thread> threads_;
    const std::function<void(int)>* task_ = nullptr;
    bool task_all_ = false;
    uint64_t op_ = 0;                       // sequence number of the op (run_on_all runs each once a thread)
    std::atomic<uint64_t> generation_{0};   // bumped to wake the workers for a new op
    std::atomic<uint32_t> active_{kClosed}; // see the header comment
    std::atomic<int> pending_{0};           // run_on_all: workers yet to run it
    std::atomic<bool> stop_{false};
};

// The chunk for parallel_chunks: about `per_thread` chunks per thread (enough for a late thread to lose
// little, few enough that each stays a long stream of weights), at least `min_chunk` items. Two: the
// built-in model's decode GEMVs are 0.2-1 MB, and each chunk restarts the hardware prefetchers' ramp
// (Zen 4, bench_decode SmolLM2 Q4_1, 2 threads, idle: 2 against 4 chunks per thread 296 vs 273 tok/s, medians
// of 5 interleaved rounds; 8 and 16 were slower still, 1 and 3 like 2; beside one busy process 2 and 4 within
// the noise, 143-165 and 159-162 tok/s).
inline int64_t chunk_for(int64_t n, int threads, int64_t per_thread = 2, int64_t min_chunk = 1) {
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
