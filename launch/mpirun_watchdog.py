# The launcher's side of "no hang": lattice-mpirun's watchdog over the mpirun it execs (several hosts).
#
# Why: when a host or the link to it is lost, a rank reports the silent peer after the communicator
# timeout and calls MPI_Abort; mpirun then tries to tell the lost host's daemon to kill its ranks and,
# with the link dead (no reset, data unacknowledged), can wait for it for as long as TCP retransmits
# (~15 min) - holding the allocation. The watchdog ends mpirun when it outlives a rank's fatal error.
#
# How (mpirun keeps the wrapper's pid, so signals sent to the job still reach mpirun itself):
#  - start(grace_s) runs before the exec: it makes a pipe, forks a watchdog process that is NOT
#    mpirun's child (double fork; mpirun never reaps or signals it), and points the wrapper's stderr
#    (fd 2, which mpirun and its ranks' forwarded stderr inherit) at the pipe.
#  - The watchdog relays every byte to the real stderr unchanged. A line starting "lattice: error:"
#    (a rank's one fatal line) starts a clock; when mpirun is still alive grace_s later, it prints one
#    line ("lattice-mpirun: mpirun did not end ... killing it"), sends SIGTERM to mpirun and the
#    process groups of mpirun's children (local ranks, rsh/ssh agents), and SIGKILL 3 s later to what
#    is left. The job's exit status is then mpirun's death by signal (137 or 143 from a shell).
#  - OpenMPI's banners for a lost host get one line of their own, "lattice-mpirun: lost host b (ranks
#    2-3): ..." (the ranks from the wrapper's placement): a lost daemon ("Remote daemon: ... on node b"),
#    a TCP peer hangup ("Peer host: b"), or a daemon failure while the login agent (ssh) of host b,
#    one of mpirun's children whose command line names b and orted, is gone.
#  - It exits at end of file, or once mpirun has ended (gone or a zombie) and the pipe has been quiet
#    for 1 s (a process that inherited the pipe may hold it), or 5 s after mpirun ended.
# Invariants: the relay never drops or reorders bytes; without a fatal line it never signals anything.
import os
import re
import select
import signal
import sys
import time

FATAL = b"lattice: error:"
LOST_DAEMON = re.compile(rb"Remote daemon: .* on node (\S+)|^\s*Peer host:\s+(\S+)")
DAEMON_FAILED = (b"ORTE was unable to reliably start one or more daemons", b"ORTE has lost communication")


def _agent_hosts(target):
    """pid -> host of mpirun's login agents (ssh or plm_rsh_agent: 'AGENT [-opts] HOST ... orted ...')."""
    out = {}
    for c in _children(target):
        try:
            with open(f"/proc/{c}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if not any(b"orted" in a for a in argv):
            continue
        # The first word that is no option, path (the agent script run by its interpreter) or setting.
        host = next((a for a in argv[1:] if a and not a.startswith(b"-") and b"/" not in a and b"=" not in a), None)
        if host:
            out[c] = host.decode(errors="replace")
    return out


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def _children(pid):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if int(fields[1]) == pid:
                out.append(int(d))
        except (OSError, IndexError, ValueError):
            pass
    return out


def _signal_job(pid, sig):
    """sig to mpirun and to each child's process group (OpenMPI gives ranks and agents their own); a
    child still in mpirun's group (the caller's job: a shell, a batch script) gets it alone."""
    try:
        own = os.getpgid(pid)
    except OSError:
        own = None
    for c in _children(pid):
        try:
            g = os.getpgid(c)
            if g != own:
                os.killpg(g, sig)
            else:
                os.kill(c, sig)
        except OSError:
            pass
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _write_all(fd, data):
    while data:
        try:
            n = os.write(fd, data)
        except InterruptedError:
            continue
        except OSError:
            return
        data = data[n:]


def _watch(rfd, target, grace_s, prog, host_ranks):
    fatal_at = lost = None
    fatal_line = b""
    pending = b""
    quiet_since = gone_at = None
    agents, polled = {}, 0.0
    while True:
        ready, _, _ = select.select([rfd], [], [], 0.2)
        if ready:
            data = os.read(rfd, 65536)
            if not data:
                return
            _write_all(2, data)
            pending = (pending + data)[-65536:]
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if fatal_at is None and line.startswith(FATAL):
                    fatal_at, fatal_line = time.monotonic(), line
                m = LOST_DAEMON.search(line)
                gone = [h for c, h in agents.items() if not _alive(c)]
                if not lost and (m or (any(d in line for d in DAEMON_FAILED) and gone)):
                    lost = (m.group(1) or m.group(2)).decode(errors="replace") if m else ",".join(gone)
                    ranks = host_ranks.get(lost, "")
                    _write_all(2, f"{prog}: lost host {lost}{' (' + ranks + ')' if ranks else ''}: OpenMPI lost "
                                  f"its daemon there or could not start it (host down or unreachable); the job ends\n".encode())
            quiet_since = None
            continue
        if time.monotonic() - polled > 0.5:  # the login agents, while they live (hosts they reach)
            polled = time.monotonic()
            agents.update(_agent_hosts(target))
        if not _alive(target):
            gone_at = gone_at or time.monotonic()
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since > 1.0 or time.monotonic() - gone_at > 5.0:
                return
            continue
        if fatal_at is not None and grace_s > 0 and time.monotonic() - fatal_at > grace_s:
            what = fatal_line.decode(errors="replace")[len(FATAL):].strip()[:300]
            _write_all(2, f"{prog}: mpirun did not end {grace_s:g} s after a rank's fatal error ({what}); "
                          f"killing it and its local ranks\n".encode())
            _signal_job(target, signal.SIGTERM)
            deadline = time.monotonic() + 3.0
            while _alive(target) and time.monotonic() < deadline:
                time.sleep(0.05)
            _signal_job(target, signal.SIGKILL)
            fatal_at = float("inf")  # once


def start(grace_s, prog, host_ranks):
    """Before exec'ing mpirun: route fd 2 through a watchdog that ends this process (mpirun after the
    exec) grace_s after a rank's fatal line if it is still running then (never when grace_s is 0).
    host_ranks: host name -> "ranks 2-3" for the line naming a lost host."""
    target = os.getpid()
    rfd, wfd = os.pipe()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        try:
            if os.fork() != 0:
                os._exit(0)
            os.close(wfd)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
            try:
                os.setpgid(0, 0)  # the terminal's Ctrl-C goes to the job, not to the relay of its last words
            except OSError:
                pass
            try:
                _watch(rfd, target, grace_s, prog, host_ranks)
            except Exception:  # never leave mpirun writing into a pipe nobody reads: relay to the end
                while True:
                    data = os.read(rfd, 65536)
                    if not data:
                        break
                    _write_all(2, data)
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    os.close(rfd)
    os.dup2(wfd, 2)
    os.close(wfd)
