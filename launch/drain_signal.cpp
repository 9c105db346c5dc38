// Drain signal handlers (see drain_signal.h). Async-signal-safe: one atomic flag, _exit.
#include "launch/drain_signal.h"

#include <unistd.h>

namespace lattice {

namespace {

volatile std::sig_atomic_t g_signal = 0;

extern "C" void on_drain_signal(int sig) {
    if (g_signal != 0) _exit(128 + sig);  // second signal: stop now
    g_signal = sig;
}

}  // namespace

void install_drain_handlers() {
    struct sigaction sa {};
    sa.sa_handler = on_drain_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGUSR1, &sa, nullptr);
}

int drain_requested() {
    return int(g_signal);
}

}  // namespace lattice
