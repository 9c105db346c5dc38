// WaitPolicy: how long and how a rank waits on its peers (the per-call deadline and the polling
// steps of watchdog.h). A plain struct without MPI, so that parallel_context.h and the builder
// compile in builds without MPI too (LATTICE_NO_MPI: one rank, nothing to wait for).
#pragma once

#include <cstdint>

namespace lattice {

struct WaitPolicy {
    double timeout_s = 60.0;      // per call; <= 0 means wait forever (not recommended)
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

}  // namespace lattice
