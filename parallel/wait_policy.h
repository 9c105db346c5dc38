// WaitPolicy: how long and how a rank waits on its peers (the per-call deadline and the polling
// steps of watchdog.h), and Backoff, the pacing of one waiting loop by that policy (MpiComm's
// poll_request and shared-memory wait through watchdog.h's WaitPacer, NcclComm's event polls).
// Without MPI, so that parallel_context.h, the builder and NcclComm compile in builds without MPI
// too (LATTICE_NO_MPI: one rank, nothing to wait for).
#pragma once

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>

namespace lattice {

struct WaitPolicy {
    double timeout_s = 60.0;      // per call; <= 0 means wait forever (not recommended)
    // Communicator creation (the ranks' first meeting) waits max(timeout_s, setup_timeout_s): ranks reach it
    // at different times (another host's ranks start over ssh, a busy machine runs them late), which says
    // nothing about a peer going silent. timeout_s <= 0 waits forever there too.
    double setup_timeout_s = 300.0;
    double spin_us = 50.0;     // busy MPI_Test
    double yield_us = 2000.0;  // then MPI_Test + sched_yield
    // Then MPI_Test + sleeps: growing from 10 us to short_sleep_us while the wait is younger than
    // long_wait_us, then on to max_sleep_us. A pipeline stage waits for its peer's compute (tens of
    // ms per step) and wakes within ~short_sleep_us of the data arriving (with 500 us sleeps the two
    // hand-offs of a pp 2 step cost 1.4 ms, with 50 us 0.5 ms); a rank idle for long (a server
    // without requests) backs off to max_sleep_us wake-ups.
    double short_sleep_us = 50.0;
    double long_wait_us = 200000.0;
    double max_sleep_us = 500.0;
    double grace_s = 1.0;         // after a timeout: how long to wait for peers' reports
    // MpiComm::send: copy the data and complete the transfer in the background, with at most this
    // many sends in flight per communicator (0: send returns only when the receiver has the data).
    int send_buffers = 4;
    // MpiComm broadcast / send / recv: larger messages go in chunks of this many bytes (64 B .. 1 GiB;
    // MPI counts are int). Small values only make sense in tests.
    int64_t max_chunk_bytes = int64_t(1) << 30;
    // MpiComm all_reduce_sum / all_gather between ranks that all run on one machine go through a
    // shared-memory exchange (shm_exchange.h) instead of MPI; false keeps them on MPI.
    bool shared_memory = true;
};

// The deadline of communicator creation under `p` (WaitPolicy::setup_timeout_s): the longer of the two; <= 0
// (forever) when timeout_s is.
inline double setup_deadline(const WaitPolicy& p) {
    return p.timeout_s > 0 ? std::max(p.timeout_s, p.setup_timeout_s) : p.timeout_s;
}

// Spin, then yield, then sleep, by the time since construction: call pause() after each failed
// check of whatever is awaited; elapsed_us() for the caller's deadline.
class Backoff {
public:
    explicit Backoff(const WaitPolicy& policy) : policy_(policy), t0_(std::chrono::steady_clock::now()) {}
    double elapsed_us(std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now()) const {
        return std::chrono::duration<double, std::micro>(now - t0_).count();
    }
    void pause() { pause_at(elapsed_us()); }
    void pause_at(double el_us) {
        if (el_us < policy_.spin_us) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
            return;
        }
        if (el_us < policy_.yield_us) {
            sched_yield();
            return;
        }
        std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(sleep_us_));
        const double cap = el_us < policy_.long_wait_us ? std::min(policy_.short_sleep_us, policy_.max_sleep_us)
                                                        : policy_.max_sleep_us;
        sleep_us_ = std::min(sleep_us_ * 2.0, std::max(10.0, cap));
    }

private:
    WaitPolicy policy_;
    std::chrono::steady_clock::time_point t0_;
    double sleep_us_ = 10.0;
};

}  // namespace lattice
