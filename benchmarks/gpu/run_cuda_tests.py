#!/usr/bin/env python3
"""Runs lattice's CUDA test binaries for benchmarks/gpu/check.sh, so that one bad test costs nothing else
and every failure explains itself within the call that found it.

Three modes, each bounded by --deadline (seconds for the whole call) and each rewriting its JSON after
every finished run (a run cut off by the device tool keeps what it measured):

  tests     Every test of a CTest listing (`ctest --show-only=json-v1`, or the bundle's tests.json) runs
            as its own process under --timeout, --jobs at a time, the longest first (oracles, golden,
            backend). Each run gets LATTICE_TEST_SEED (--seed, else a fresh random per run; the CUDA
            tests print it back and draw every input from it: tests/kernels/cuda/cuda_test_util.h).
            Verdict per test: PASS (exit 0), SKIP (77), TIMEOUT, FAIL; its seed and whether the binary
            echoed it; the failing cases (doctest's "TEST CASE:" lines; for a hang or a crash the last
            "[case]" started); the first CUDA error in its output.
  diagnose  Reads the tests JSON and, for each FAIL / TIMEOUT (FAILs first), within its share of the
            deadline (a FAIL's twice a TIMEOUT's; none below --min-share): (1) reruns that binary alone, restricted to its failing cases, with the SAME
            seed and CUDA_LAUNCH_BLOCKING=1 CUBLASLT_LOG_LEVEL=2 NCCL_DEBUG=WARN (a fault is reported
            at the launch that made it; cuBLASLt says why it refused a shape): "reproduced" or not
            (not reproduced with the same seed points at a race or uninitialized memory); (2) the same
            command under compute-sanitizer memcheck, with what is left of the share: its error
            summary, or INCOMPLETE with the errors it printed before the cut.
  sanitize  compute-sanitizer over the small-shape binary (test_cuda_sanitize): memcheck one case per
            process (a cut-off run keeps the finished cases), then racecheck and synccheck on the
            decode-attention case. A tool run that does not finish is INCOMPLETE (time, not a
            finding); only errors the tool reports (exit 86) FAIL.

--bin-dir DIR runs each test's executable from DIR (by file name) instead of the path CTest recorded:
the binaries carried in gpu-kit/bin. JSON layout: {"mode", "elapsed_s", "deadline_s", "runs": [{"name",
"status", "seconds", "rc", "seed", "seed_echoed", "failed_cases", "first_cuda_error", "cmd", "tail",
"diagnosis": {...}}], "passed", "failed", ...}. Exit: 0 all passed, 77 nothing ran (all SKIP), 1 otherwise.
Standard library only (the GPU machine has Python and nothing of ours).
"""
import argparse
import concurrent.futures as cf
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

SKIP_CODE = 77
SANITIZER_ERROR_CODE = 86
RERUN_ENV = {"CUDA_LAUNCH_BLOCKING": "1", "CUBLASLT_LOG_LEVEL": "2", "NCCL_DEBUG": "WARN"}
# Ordered: the first match in a run's output is its "first CUDA error".
CUDA_ERROR_RE = re.compile(
    r"(cudaError\w+[^\n]*|CUBLAS_STATUS_\w+[^\n]*|ncclError\w*[^\n]*|NCCL WARN[^\n]*|"
    r"an illegal memory access[^\n]*|unspecified launch failure[^\n]*|misaligned address[^\n]*|"
    r"device-side assert[^\n]*|out of memory[^\n]*|Invalid __\w+__ (?:read|write)[^\n]*|"
    r"CUDA driver version is insufficient[^\n]*|no CUDA-capable device[^\n]*)")
HEAVY_FIRST = ("oracle", "golden", "backend", "gemm_shapes", "int4")


class Clock:
    def __init__(self, deadline_s):
        self.t0 = time.monotonic()
        self.deadline_s = deadline_s

    def elapsed(self):
        return time.monotonic() - self.t0

    def left(self):
        return self.deadline_s - self.elapsed()


LIVE = set()  # process groups of the runs in flight: killed when this runner is told to stop
LIVE_LOCK = threading.RLock()


def stop_children(signum, _frame):
    """SIGTERM (check.sh's deadline) or SIGINT: kill every test in flight (each is its own process group,
    so the signal to this runner does not reach them; a hung test must not outlive the step and hold
    the GPU into the next one), then exit with the timeout's status."""
    with LIVE_LOCK:
        for pid in list(LIVE):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
    os._exit(124)


PID_FILE = None  # --pid-file: the live process groups, for check.sh to kill after a run killed from outside


def write_pids_locked():
    if PID_FILE:
        with open(PID_FILE + ".tmp", "w") as f:
            f.write("".join(f"{pid}\n" for pid in sorted(LIVE)))
        os.replace(PID_FILE + ".tmp", PID_FILE)


def run_one(cmd, env, timeout_s):
    """Runs cmd in its own process group; returns (status, rc, seconds, output)."""
    t0 = time.monotonic()
    if timeout_s < 0.5:
        return "NOT RUN", None, 0.0, "out of time before it started\n"
    try:
        with LIVE_LOCK:
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True)
            LIVE.add(p.pid)
            write_pids_locked()
    except OSError as e:
        return "FAIL", None, 0.0, f"could not start {cmd[0]}: {e}\n"
    try:
        out, _ = p.communicate(timeout=timeout_s)
        rc = p.returncode
        status = "PASS" if rc == 0 else "SKIP" if rc == SKIP_CODE else "FAIL"
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        rc, status = None, "TIMEOUT"
    finally:
        with LIVE_LOCK:
            LIVE.discard(p.pid)
            write_pids_locked()
        out += f"\n[run_cuda_tests] killed after {timeout_s:.1f} s\n".encode()
    text = out.decode("utf-8", "replace")
    if rc is not None and rc < 0:
        text += f"\n[run_cuda_tests] died of signal {signal.Signals(-rc).name}\n"
    return status, rc, time.monotonic() - t0, text


def tail(text, lines=12):
    return "\n".join(text.rstrip("\n").split("\n")[-lines:])


def case_filter(name):
    """A --test-case= pattern matching exactly `name`: doctest splits filters at commas and treats * ?
    as wildcards, so each of those characters (and backslash) becomes '?' (any one character)."""
    return re.sub(r"[,*?\\\[\]]", "?", name)


def first_cuda_error(text):
    m = CUDA_ERROR_RE.search(text)
    return m.group(1).strip()[:240] if m else ""


def failed_cases(status, text):
    """The cases a failed run names: doctest's "TEST CASE:" blocks, else (hang, crash) the last started."""
    names = []
    # doctest prints a "TEST CASE:" header before MESSAGEs too: only blocks with an error count.
    for block in re.split(r"^={20,}\s*$", text, flags=re.M):
        m = re.search(r"^TEST CASE:\s+(.+?)\s*$", block, re.M)
        if m and re.search(r"\b(ERROR|FATAL ERROR|CRASHED)\b", block) and m.group(1) not in names:
            names.append(m.group(1))
    if not names and status in ("FAIL", "TIMEOUT"):
        started = re.findall(r"^\[case\] (.+?)\s*$", text, re.M)
        if started:
            names.append(started[-1])
    return names


def echoed_seed(text):
    m = re.search(r"^LATTICE_TEST_SEED=(\d+)", text, re.M)
    return int(m.group(1)) if m else None


class Report:
    """The JSON document and the text log, both rewritten / appended as results arrive."""

    def __init__(self, mode, json_path, log_path, clock, doc=None):
        self.lock = threading.Lock()
        self.json_path, self.log_path, self.clock = json_path, log_path, clock
        self.doc = doc or {"mode": mode, "runs": []}
        self.doc["deadline_s"] = clock.deadline_s

    def log(self, header, text):
        with self.lock, open(self.log_path, "a") as f:
            f.write(f"\n===== {header}\n{text}")
            if not text.endswith("\n"):
                f.write("\n")

    def add(self, run):
        with self.lock:
            self.doc["runs"].append(run)
            self.flush_locked()

    def flush(self):
        with self.lock:
            self.flush_locked()

    def flush_locked(self):
        runs = self.doc["runs"]
        self.doc["elapsed_s"] = round(self.clock.elapsed(), 1)
        for key, status in (("passed", "PASS"), ("skipped", "SKIP"), ("failed", "FAIL"), ("timed_out", "TIMEOUT"),
                            ("not_run", "NOT RUN"), ("incomplete", "INCOMPLETE")):
            self.doc[key] = sum(r["status"] == status for r in runs)
        self.doc["skip_reasons"] = sorted({m for r in runs if r["status"] == "SKIP"
                                           for m in re.findall(r"SKIP: ([^\n]+)", r.get("tail", ""))})
        tmp = self.json_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.doc, f, indent=2)
        os.replace(tmp, self.json_path)


def load_tests(path, bin_dir, label):
    doc = json.load(open(path))
    tests = []
    for t in doc.get("tests", []):
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        if label and label not in props.get("LABELS", []):
            continue
        cmd = list(t.get("command") or [])
        if cmd and bin_dir:
            cmd[0] = os.path.join(bin_dir, os.path.basename(cmd[0]))
        env = dict(e.split("=", 1) for e in props.get("ENVIRONMENT", []) if "=" in e)
        tests.append({"name": t["name"], "cmd": cmd or None, "env": env})
    # The longest first, so that none of them is the step's tail.
    tests.sort(key=lambda t: (not any(h in t["name"] for h in HEAVY_FIRST), t["name"]))
    return tests


def new_seed(args):
    return args.seed if args.seed is not None else random.SystemRandom().getrandbits(63)


def mode_tests(args, report, clock, base_env):
    tests = load_tests(args.tests, args.bin_dir, args.label)
    if args.only:
        tests = [t for t in tests if t["name"] in args.only.split(",")]
    report.doc["tests"] = [t["name"] for t in tests]
    report.flush()

    def work(t):
        seed = new_seed(args)
        if t["cmd"] is None:
            run = {"name": t["name"], "status": "FAIL", "seconds": 0, "rc": None, "seed": seed,
                   "tail": "its executable was not built"}
        else:
            env = dict(base_env, **t["env"], LATTICE_TEST_SEED=str(seed))
            status, rc, secs, out = run_one(t["cmd"], env, min(args.timeout, clock.left()))
            echo = echoed_seed(out)
            run = {"name": t["name"], "status": status, "seconds": round(secs, 1), "rc": rc, "seed": seed,
                   "seed_echoed": echo == seed if echo is not None else None,
                   "failed_cases": failed_cases(status, out), "first_cuda_error": first_cuda_error(out),
                   "cmd": t["cmd"], "env": t["env"], "tail": tail(out)}
            report.log(f"{t['name']}: {status} in {secs:.1f} s (rc {rc}, LATTICE_TEST_SEED={seed}): "
                       f"{' '.join(t['cmd'])}", out)
        report.add(run)
        err = f"  {run.get('first_cuda_error')}" if run.get("first_cuda_error") else ""
        print(f"{t['name']:<28} {run['status']:<8} {run['seconds']:6.1f} s  seed {seed}{err}", flush=True)

    with cf.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(work, tests))


def diagnose_one(run, base_env, report, share, args):
    """Rerun (same seed, launch blocking) and memcheck of one failed test; returns the diagnosis dict."""
    t_end = time.monotonic() + share
    cmd = list(run["cmd"])
    cases = run.get("failed_cases") or []
    if cases:  # only the failing cases; drop the entry's own case filters
        cmd = [cmd[0]] + [a for a in cmd[1:] if not a.startswith(("--test-case", "-tc"))]
        cmd.append("--test-case=" + ",".join(case_filter(c) for c in cases))
    env = dict(base_env, **run.get("env", {}), LATTICE_TEST_SEED=str(run["seed"]), **RERUN_ENV)
    d = {"seed": run["seed"], "cases": cases, "cmd": cmd}
    # A hang costs its whole timeout again: give its rerun less, memcheck keeps the rest.
    frac = 0.35 if run["status"] == "TIMEOUT" else 0.45
    status, rc, secs, out = run_one(cmd, env, min(args.timeout, share * frac))
    report.log(f"diagnose {run['name']}: rerun, LATTICE_TEST_SEED={run['seed']} CUDA_LAUNCH_BLOCKING=1: {status} "
               f"{secs:.1f} s: {' '.join(cmd)}", out)
    d["rerun"] = {"status": status, "rc": rc, "seconds": round(secs, 1), "first_cuda_error": first_cuda_error(out),
                  "failed_cases": failed_cases(status, out), "tail": tail(out, 8)}
    d["reproduced"] = status in ("FAIL", "TIMEOUT") if status != "NOT RUN" else None
    if not args.sanitizer:
        d["memcheck"] = {"status": "SKIP", "summary": "compute-sanitizer is not installed"}
        return d
    scmd = [args.sanitizer, "--tool", "memcheck", "--leak-check", "no", "--error-exitcode",
            str(SANITIZER_ERROR_CODE), "--print-limit", "20"] + cmd
    status, rc, secs, out = run_one(scmd, dict(env, CUDA_LAUNCH_BLOCKING="0"), t_end - time.monotonic())
    errors = re.findall(r"^=========\s+(?!ERROR SUMMARY|COMPUTE-SANITIZER)(\S[^\n]*)", out, re.M)
    summary = re.findall(r"=========\s+ERROR SUMMARY:[^\n]*", out)
    if rc == SANITIZER_ERROR_CODE:
        status = "FAIL"
    elif status == "TIMEOUT":
        status = "INCOMPLETE"
    elif status == "FAIL" and not errors:
        status = "PASS"  # the test's own failure under the tool, and the tool found nothing
    report.log(f"diagnose {run['name']}: compute-sanitizer memcheck: {status} {secs:.1f} s: {' '.join(scmd)}", out)
    d["memcheck"] = {"status": status, "rc": rc, "seconds": round(secs, 1),
                     "summary": summary[-1].strip("= ") if summary else "",
                     "first_error": errors[0][:240] if errors else "", "tail": tail(out, 8)}
    return d


def mode_diagnose(args, report, clock, base_env):
    src = json.load(open(args.from_json))
    bad = [r for r in src.get("runs", []) if r["status"] in ("FAIL", "TIMEOUT") and r.get("cmd")]
    bad.sort(key=lambda r: r["status"] != "FAIL")
    report.doc["failures"] = [r["name"] for r in bad]
    report.flush()
    # A FAIL's share weighs twice a TIMEOUT's: a hang's rerun and memcheck mostly wait for their timeout.
    weights = [2.0 if r["status"] == "FAIL" else 1.0 for r in bad]
    for i, run in enumerate(bad):
        share = clock.left() * weights[i] / sum(weights[i:])
        entry = {"name": run["name"], "status": run["status"], "seed": run["seed"], "seconds": 0}
        if share < args.min_share:
            entry["status"], entry["diagnosis"] = "NOT RUN", {"note": "out of time"}
        else:
            t0 = time.monotonic()
            entry["diagnosis"] = diagnose_one(run, base_env, report, share, args)
            entry["seconds"] = round(time.monotonic() - t0, 1)
        report.add(entry)
        dg = entry["diagnosis"]
        if "rerun" in dg:
            m = dg["memcheck"]
            print(f"  {run['name']}: seed {run['seed']}, rerun {dg['rerun']['status']} "
                  f"({'reproduced' if dg['reproduced'] else 'NOT reproduced'}), memcheck {m['status']}"
                  f"{' ' + m['summary'] if m.get('summary') else ''}", flush=True)
    # Record the diagnosis beside each run of the tests JSON too (one document to read).
    by_name = {r["name"]: r for r in report.doc["runs"]}
    for r in src.get("runs", []):
        if r["name"] in by_name:
            r["diagnosis"] = by_name[r["name"]].get("diagnosis")
    tmp = args.from_json + ".tmp"
    json.dump(src, open(tmp, "w"), indent=2)
    os.replace(tmp, args.from_json)


def list_cases(cmd, env):
    """The names of the test cases cmd would run (doctest --list-test-cases)."""
    _, rc, _, out = run_one(cmd + ["--list-test-cases"], env, 20)
    if rc != 0:
        return None, out
    names, inside = [], False
    for line in out.split("\n"):
        if re.fullmatch(r"=+", line.strip()) and line.strip():
            if inside:
                break
            inside = True
            continue
        if inside and line.strip():
            names.append(line.rstrip())
    return names, out


def mode_sanitize(args, report, clock, base_env):
    exe = os.path.join(args.bin_dir, os.path.basename(args.bin)) if args.bin_dir else args.bin
    env = dict(base_env, LATTICE_TEST_SEED=str(new_seed(args)))
    names, listing = list_cases([exe], env)
    if names is None:
        report.add({"name": "list", "status": "FAIL", "seconds": 0, "tail": tail(listing)})
        return
    common = ["--error-exitcode", str(SANITIZER_ERROR_CODE), "--print-limit", "20"]
    race = [n for n in names if "decode" in n][:1]
    plans = [("memcheck", ["--tool", "memcheck", "--leak-check", "no"], n) for n in names]
    plans += [(tool, ["--tool", tool], n) for tool in ("racecheck", "synccheck") for n in race]
    for i, (tool, opts, case) in enumerate(plans):
        # An equal share of what is left for each run still to come, at most --timeout; when that share is
        # below --min-share, this run gets --min-share (the first cases get a real chance, the last are
        # NOT RUN) rather than every run a share too small to finish.
        left = clock.left()
        budget = min(args.timeout, max(left / (len(plans) - i), min(args.min_share, left)))
        cmd = [args.sanitizer] + opts + common + [exe, f"--test-case={case_filter(case)}"]
        status, rc, secs, out = run_one(cmd, env, budget)
        if rc == SANITIZER_ERROR_CODE:
            status = "FAIL"
        elif status == "TIMEOUT":
            status = "INCOMPLETE"
        found = re.findall(r"=========\s+(?:ERROR SUMMARY|RACECHECK SUMMARY)[^\n]*", out)
        report.log(f"compute-sanitizer {tool} '{case}': {status} in {secs:.1f} s (rc {rc}): {' '.join(cmd)}", out)
        summary = found[-1].strip("= ") if found else ""
        report.add({"name": f"{tool}: {case}", "status": status, "seconds": round(secs, 1), "rc": rc,
                    "seed": int(env["LATTICE_TEST_SEED"]), "summary": summary,
                    "first_cuda_error": first_cuda_error(out), "tail": tail(out)})
        print(f"{tool:<10} {status:<10} {secs:6.1f} s  {case[:60]}  {summary}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("tests", "diagnose", "sanitize"))
    ap.add_argument("--tests", help="ctest --show-only=json-v1 output (tests mode)")
    ap.add_argument("--from-json", help="the tests mode's JSON (diagnose mode)")
    ap.add_argument("--label", default="cuda", help="run only tests with this CTest label ('' for all)")
    ap.add_argument("--only", default="", help="comma-separated test names (default: all)")
    ap.add_argument("--bin-dir", default="", help="run executables from this folder (by file name)")
    ap.add_argument("--bin", help="the test binary to sanitize (sanitize mode)")
    ap.add_argument("--sanitizer", default="", help="compute-sanitizer's path ('' when not installed)")
    ap.add_argument("--seed", type=lambda s: int(s, 0), default=None,
                    help="LATTICE_TEST_SEED for every run (default: a fresh one per run, recorded)")
    ap.add_argument("--json", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--deadline", type=float, required=True, help="seconds for the whole call")
    ap.add_argument("--timeout", type=float, default=60, help="seconds per test binary / rerun / tool run")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--min-share", type=float, default=10, help="diagnose: seconds below which a failure is not diagnosed; sanitize: "
                    "the least a tool run is given while time is left")
    ap.add_argument("--pid-file", default="", help="keep the live process groups' ids here")
    args = ap.parse_args()
    global PID_FILE
    PID_FILE = args.pid_file or None
    signal.signal(signal.SIGTERM, stop_children)
    signal.signal(signal.SIGINT, stop_children)
    clock = Clock(args.deadline)
    report = Report(args.mode, args.json, args.log, clock)
    base_env = dict(os.environ)
    {"tests": mode_tests, "diagnose": mode_diagnose, "sanitize": mode_sanitize}[args.mode](args, report, clock,
                                                                                          base_env)
    report.flush()
    d = report.doc
    print(f"passed {d['passed']}, failed {d['failed']}, timed out {d['timed_out']}, skipped {d['skipped']}, "
          f"not run {d['not_run']}, incomplete {d['incomplete']} in {d['elapsed_s']} s", flush=True)
    if args.mode == "diagnose":
        return 0
    if args.mode == "sanitize":  # INCOMPLETE / NOT RUN are time, not findings
        return 1 if d["failed"] else (0 if d["passed"] else SKIP_CODE)
    return 1 if d["failed"] or d["timed_out"] or d["not_run"] else (SKIP_CODE if d["passed"] == 0 else 0)


if __name__ == "__main__":
    sys.exit(main())
