#!/usr/bin/env python3
"""Table-driven bad-input suite for the `lattice` executable (hostile files and flags). Each case builds its hostile
input in a fresh temp folder (bad_inputs.py), runs lattice under a memory limit (RLIMIT_AS) and a
time limit, and asserts: the exit code (1: an error in the input or the run; 2: a bad command line;
0 only where the case expects a warning or a result), exactly one "lattice: error:" line on stderr,
last, naming the culprit (preceded only by log lines "[r0/1 ...]" for errors found after the model
was loaded), no "internal error", no crash or sanitizer report, no output file clobbered or left
half-written (FIFOs, devices and symlinks keep their type and content, no temporary file is left).
Peak memory (wait4's ru_maxrss) is checked for the cases that must be cheap, over the peak of
`lattice --version` (a CUDA build's libraries alone touch ~200 MiB).

Sanitizer builds (LATTICE_SANITIZE=1 from CMake): RLIMIT_AS is not set (ASan reserves terabytes of
shadow address space) and cases that depend on an allocation failing are skipped (ASan reports
those as fatal instead of throwing std::bad_alloc); the ru_maxrss bounds still apply.
Usage: test_bad_input.py LATTICE_BINARY SHARED_DIR [-k SUBSTRING]
"""
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bad_input_cases import cases  # noqa: E402  (the table)

LATTICE, SHARED = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
ONLY = sys.argv[sys.argv.index("-k") + 1] if "-k" in sys.argv else None
ASAN = os.environ.get("LATTICE_SANITIZE") == "1"
MEM_LIMIT = 2 << 30
TIME_LIMIT = 300 if ASAN else 90  # per case; generous for a loaded 2-core machine
CRASH_MARKS = ("internal error", "terminate called", "Sanitizer", "runtime error:", "Segmentation", "Aborted",
               "core dumped", "std::bad_alloc", "filesystem error")


class Result:
    def __init__(self, rc, out, err, rss_mb, seconds, killed):
        self.rc, self.out, self.err, self.rss_mb, self.seconds, self.killed = rc, out, err, rss_mb, seconds, killed


def run(args, tmp, stdout="file", limits=True, extra_limits=(), on_start=None, env=None, stderr="file"):
    """Runs lattice ARGS in tmp. stdout: "file" | "full" (/dev/full) | "closed" | "pipe" (on_start(proc)
    reads it). Returns a Result with the exit code (negative: killed by that signal), output, peak RSS."""
    out_path, err_path = os.path.join(tmp, ".stdout"), os.path.join(tmp, ".stderr")
    err_f = open(err_path if stderr == "file" else "/dev/full", "wb")
    out_f = {"file": lambda: open(out_path, "wb"), "full": lambda: open("/dev/full", "wb"),
             "closed": lambda: open(os.devnull, "wb"), "pipe": lambda: None}[stdout]()

    def preexec():
        os.setsid()
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if limits and not ASAN:
            resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))
        for which, value in extra_limits:
            resource.setrlimit(which, (value, value))
        if stdout == "closed":
            os.close(1)
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background ctest may hand SIGINT down ignored

    child_env = dict(os.environ, **(env or {}))
    t0 = time.monotonic()
    p = subprocess.Popen([LATTICE] + args, cwd=tmp, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE if stdout == "pipe" else out_f, stderr=err_f, preexec_fn=preexec,
                         env=child_env)
    killed = []

    def kill():
        killed.append(True)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timer = threading.Timer(TIME_LIMIT, kill)
    timer.start()
    try:
        if on_start:
            on_start(p)
        _, status, usage = os.wait4(p.pid, 0)
    finally:
        timer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.monotonic() - t0
    for f in (err_f, out_f, p.stdout):
        if f:
            f.close()
    out = open(out_path, "rb").read().decode("utf-8", "replace") if stdout == "file" else ""
    err = open(err_path, "rb").read().decode("utf-8", "replace") if stderr == "file" else ""
    return Result(p.returncode, out, err, usage.ru_maxrss / 1024.0, seconds, bool(killed))


def check_stderr(c, r):
    """Problems with stderr for case c (list of strings)."""
    problems = []
    lines = [ln for ln in r.err.splitlines() if ln.strip()]
    for mark in CRASH_MARKS:
        if mark in r.err:
            problems.append(f"stderr contains {mark!r}")
    errors = [ln for ln in lines if ln.startswith("lattice: error:")]
    if not c.error_line:
        if errors:
            problems.append(f"unexpected error line: {errors[0]}")
        if c.needle and not any(c.needle in ln for ln in lines):
            problems.append(f"no stderr line names {c.needle!r}")
        return problems
    if len(errors) != 1:
        return problems + [f"expected exactly one 'lattice: error:' line, got {len(errors)}"]
    if lines[-1] != errors[0]:
        problems.append("the error line is not the last line")
    others = lines[:-1]
    if others and not c.logs_ok:
        problems.append(f"stderr has {len(lines)} lines, expected one (first: {others[0]!r})")
    elif any(not ln.startswith("[r") for ln in others):
        problems.append("stderr has lines besides log lines and the error")
    for needle in ([c.needle] if isinstance(c.needle, str) else c.needle):
        if needle not in errors[0]:
            problems.append(f"error line does not name {needle!r}")
    return problems


def leftovers(tmp):
    """Temporary files an atomic writer left behind."""
    found = []
    for root, _, files in os.walk(tmp):
        found += [os.path.join(root, f) for f in files if ".tmp." in f]
    return found


def main():
    passed, failed, skipped = 0, [], 0
    print(f"lattice: {LATTICE}\nlimits per case: {TIME_LIMIT} s, "
          + ("no RLIMIT_AS (sanitizer build: ASan reserves terabytes of address space; ru_maxrss bounds only)"
             if ASAN else f"RLIMIT_AS {MEM_LIMIT >> 20} MiB"))
    table = cases(SHARED)
    # The peak RSS of a run that does nothing (`lattice --version`): loading the CUDA libraries of a
    # CUDA build alone touches ~200 MiB, so the cheap cases are bounded over this baseline.
    with tempfile.TemporaryDirectory(prefix="lattice-bad-") as tmp:
        base_rss = run(["--version"], tmp).rss_mb
    print(f"baseline peak RSS (lattice --version): {base_rss:.0f} MiB")
    for c in table:
        if ONLY and ONLY not in c.name:
            continue
        if c.skip_reason(ASAN):
            print(f"SKIP  {c.name}: {c.skip_reason(ASAN)}")
            skipped += 1
            continue
        with tempfile.TemporaryDirectory(prefix="lattice-bad-") as tmp:
            problems = []
            try:
                args = c.setup(tmp) if c.setup else []
                args = [a.replace("{tmp}", tmp) for a in (c.args + args)]
                r = run(args, tmp, stdout=c.stdout, stderr=c.stderr, limits=c.limits, extra_limits=c.extra_limits,
                        on_start=(lambda p: c.on_start(p, tmp)) if c.on_start else None)
                if r.killed:
                    problems.append(f"did not finish within {TIME_LIMIT} s")
                if r.rc != c.rc:
                    problems.append(f"exit code {r.rc}, expected {c.rc}")
                if c.stderr == "file":
                    problems += check_stderr(c, r)
                if c.max_rss_mb and r.rss_mb > base_rss + c.max_rss_mb:
                    problems.append(f"peak RSS {r.rss_mb:.0f} MiB exceeds {base_rss:.0f} MiB (lattice --version) + "
                                    f"{c.max_rss_mb} MiB")
                problems += [f"temporary file left: {f}" for f in leftovers(tmp)]
                if c.check:
                    msg = c.check(tmp, r)
                    if msg:
                        problems.append(msg)
            except Exception as e:  # a broken case is a failure, not a crash of the suite
                problems.append(f"case raised {type(e).__name__}: {e}")
                r = None
            detail = f"rc {r.rc}, {r.seconds:.1f} s, {r.rss_mb:.0f} MiB" if r else "not run"
            if problems:
                failed.append(c.name)
                print(f"FAIL  {c.name} ({detail})")
                for p in problems:
                    print(f"        {p}")
                if r:
                    print("        stderr: " + "\n                ".join(r.err.strip().splitlines()[-4:]))
            else:
                passed += 1
                print(f"ok    {c.name} ({detail})")
    print(f"{passed} passed, {len(failed)} failed, {skipped} skipped, {len(table)} cases")
    if failed:
        print("failed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
