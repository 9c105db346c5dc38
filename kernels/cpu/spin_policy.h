// SpinPolicy: how many pause steps a thread pool thread spins before it blocks (a worker waiting for the next
// op, the caller waiting for the workers inside one), adapted to whether its core is contended.
// Spinning keeps the per-op hand-off around a microsecond on cores of our own (decode runs ~150 ops a token,
// microseconds apart), but with another busy process on the machine a spinning thread stays runnable between
// ops: three runnable threads on two cores, and the scheduler preempts ours for the other process's whole
// slice. Measured on a 2-core Zen 4 VM beside one busy compiler process, TinyLlama-1.1B Q4_K_M, 2 threads:
// 16 tok/s with 0.5 ms / 2.5 ms spins against 36-40 with 25 us ones (and 36 with one thread).
// The signal is the thread's own involuntary context switches (getrusage RUSAGE_THREAD): every kWindow waits
// it reads them; any since the last read mean another runnable thread wanted its core, and the next window
// spins `contended` steps; a window without any spins `uncontended` steps again. An idle machine keeps the
// long spins (its rare kernel-thread preemptions flip one window at most).
#pragma once

#include <sys/resource.h>

#include <cstdint>

namespace lattice {

class SpinPolicy {
public:
    static constexpr int kWindow = 64;

    SpinPolicy(int uncontended, int contended) : uncontended_(uncontended), contended_(contended) {}

    // The pause steps for this wait (reads the thread's counter once per kWindow calls).
    int limit() {
        if (++calls_ >= kWindow) {
            calls_ = 0;
            observe(involuntary_switches());
        }
        return current();
    }

    // A reading of the thread's involuntary context switches (what limit() does every kWindow calls).
    void observe(int64_t switches) {
        if (last_ >= 0) contended_now_ = switches > last_;
        last_ = switches;
    }
    int current() const { return contended_now_ ? contended_ : uncontended_; }
    bool contended() const { return contended_now_; }

    static int64_t involuntary_switches() {
        rusage ru{};
        return getrusage(RUSAGE_THREAD, &ru) == 0 ? int64_t(ru.ru_nivcsw) : 0;
    }

private:
    int uncontended_, contended_;
    int calls_ = 0;
    int64_t last_ = -1;
    bool contended_now_ = false;
};

}  // namespace lattice
