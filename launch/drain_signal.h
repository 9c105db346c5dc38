// SIGTERM / SIGINT / SIGUSR1 as a request to drain (`lattice batch`, `lattice serve`): the handler
// only sets a flag; the command's loop stops admitting, finishes what is in flight and exits 0.
// Installed on every rank: followers keep following until the leader's shutdown (a dead peer is
// still found by the communicators' deadlines). A second signal while draining exits at once
// (128 + signal). Under mpirun send SIGUSR1 to mpirun: it forwards SIGUSR1 to every rank, while a
// SIGTERM to mpirun tears the whole job down after a short grace. srun delivers SIGTERM to every
// rank itself.
#pragma once

#include <csignal>

namespace lattice {

// Installs the handlers (replacing the launch termination reporter's for these two signals).
void install_drain_handlers();
// The signal that asked for a drain (0: none yet).
int drain_requested();

}  // namespace lattice
