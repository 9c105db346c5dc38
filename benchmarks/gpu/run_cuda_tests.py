#!/usr/bin/env python3
"""Runs lattice's CUDA test binaries for benchmarks/gpu/check.sh, so that one bad test costs nothing else.

Two modes, both bounded by --deadline (seconds for the whole call) and both writing their JSON after
every finished run (a run cut off by the device tool keeps what it measured):

  tests     Every test of a CTest listing (`ctest -N -L cuda --show-only=json-v1`) runs as its own
            process under --timeout seconds (30-40: a hung kernel costs that, not the step), --jobs at
            a time. Exit 0 PASS, 77 SKIP, timeout TIMEOUT, anything else FAIL. Then every FAIL or
            TIMEOUT binary is rerun case by case (`--list-test-cases`, then `--test-case=<name>` one at
            a time, --case-timeout each) with CUDA_LAUNCH_BLOCKING=1 CUBLASLT_LOG_LEVEL=2 NCCL_DEBUG=WARN:
            a fault is reported at the launch that made it, an illegal address in one case no longer
            poisons the cases after it, and cuBLASLt says why it refused a shape. A binary whose cases
            hang twice is not rerun further (each hang costs a whole case timeout).
  sanitize  compute-sanitizer (--sanitizer) over the small-shape kernel test binary: memcheck on every
            case, racecheck and synccheck on the decode-attention cases (--race-filter); each run
            under --timeout. Exit 86 (--error-exitcode) means the tool found errors.

--bin-dir DIR runs each test's executable from DIR (by file name) instead of the path CTest recorded:
the binaries carried to the GPU machine in gpu-kit/bin (benchmarks/gpu/simulate.sh --bundle).
Layout of the JSON: {"mode", "elapsed_s", "deadline_s", "runs": [{"name", "status", "seconds", "rc",
"tail", "cases": [{"name", "status", "seconds", "tail"}]}], "passed", "failed", "skipped", ...}.
Standard library only (the GPU machine has Python and nothing of ours).
"""
import argparse
import concurrent.futures as cf
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

SKIP_CODE = 77
SANITIZER_ERROR_CODE = 86
RERUN_ENV = {"CUDA_LAUNCH_BLOCKING": "1", "CUBLASLT_LOG_LEVEL": "2", "NCCL_DEBUG": "WARN"}


class Clock:
    def __init__(self, deadline_s):
        self.t0 = time.monotonic()
        self.deadline_s = deadline_s

    def elapsed(self):
        return time.monotonic() - self.t0

    def left(self):
        return self.deadline_s - self.elapsed()


def run_one(cmd, env, timeout_s):
    """Runs cmd in its own process group; returns (status, rc, seconds, output)."""
    t0 = time.monotonic()
    if timeout_s < 1:
        return "NOT RUN", None, 0.0, "out of time before it started\n"
    try:
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    except OSError as e:
        return "FAIL", None, 0.0, f"could not start {cmd[0]}: {e}\n"
    try:
        out, _ = p.communicate(timeout=timeout_s)
        rc = p.returncode
        status = "PASS" if rc == 0 else "SKIP" if rc == SKIP_CODE else "FAIL"
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        rc = None
        status = "TIMEOUT"
        out += f"\n[run_cuda_tests] killed after {timeout_s:.0f} s\n".encode()
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


def list_cases(cmd, env):
    """The names of the test cases cmd would run (doctest --list-test-cases)."""
    status, rc, _, out = run_one(cmd + ["--list-test-cases"], env, 20)
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


class Report:
    """The JSON document and the text log, both rewritten / appended as results arrive."""

    def __init__(self, mode, json_path, log_path, clock):
        self.lock = threading.Lock()
        self.json_path, self.log_path, self.clock = json_path, log_path, clock
        self.doc = {"mode": mode, "deadline_s": clock.deadline_s, "runs": []}

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
        for key, statuses in (("passed", ("PASS",)), ("skipped", ("SKIP",)), ("failed", ("FAIL",)),
                              ("timed_out", ("TIMEOUT",)), ("not_run", ("NOT RUN",))):
            self.doc[key] = sum(r["status"] in statuses for r in runs)
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
        labels = props.get("LABELS", [])
        if label and label not in labels:
            continue
        cmd = list(t.get("command") or [])
        if not cmd:  # ctest names no command for a test whose executable was not built
            tests.append({"name": t["name"], "cmd": None, "env": {}})
            continue
        if bin_dir:
            cmd[0] = os.path.join(bin_dir, os.path.basename(cmd[0]))
        env = dict(e.split("=", 1) for e in props.get("ENVIRONMENT", []) if "=" in e)
        tests.append({"name": t["name"], "cmd": cmd, "env": env})
    return tests


def rerun_cases(test, base_env, report, clock, case_timeout):
    """Reruns a failed test binary one case at a time with launch blocking and cuBLASLt logging."""
    env = dict(base_env, **test["env"], **RERUN_ENV)
    if os.path.basename(test["cmd"][0]) in ("mpiexec", "mpirun", "srun"):
        return [{"name": "(all)", "status": "NOT RUN", "seconds": 0, "tail": "a multi-rank test: not rerun by case"}]
    # Keep the ctest entry's own case filters (a lattice_test_run entry runs some cases only).
    keep = [a for a in test["cmd"][1:] if a.startswith(("--test-case", "-tc", "--test-suite", "-ts"))]
    names, listing = list_cases([test["cmd"][0]] + keep, env)
    cases = []
    if names is None:
        report.log(f"{test['name']}: could not list its cases", listing)
        return [{"name": "(listing)", "status": "FAIL", "seconds": 0, "tail": tail(listing)}]
    hangs = 0
    for name in names:
        if hangs >= 2:
            cases.append({"name": name, "status": "NOT RUN", "seconds": 0, "tail": "two cases hung before it"})
            continue
        cmd = [test["cmd"][0], f"--test-case={case_filter(name)}"]
        status, rc, secs, out = run_one(cmd, env, min(case_timeout, clock.left()))
        hangs += status == "TIMEOUT"
        report.log(f"{test['name']} case '{name}' (CUDA_LAUNCH_BLOCKING=1 CUBLASLT_LOG_LEVEL=2): {status} "
                   f"{secs:.1f} s", out)
        cases.append({"name": name, "status": status, "seconds": round(secs, 1), "rc": rc, "tail": tail(out, 8)})
        print(f"  rerun {test['name']} / {name}: {status} ({secs:.1f} s)", flush=True)
    return cases


def mode_tests(args, report, clock, base_env):
    tests = load_tests(args.tests, args.bin_dir, args.label)
    if args.only:
        tests = [t for t in tests if t["name"] in args.only.split(",")]
    report.doc["tests"] = [t["name"] for t in tests]
    report.flush()
    results = {}

    def work(t):
        if t["cmd"] is None:
            run = {"name": t["name"], "status": "FAIL", "seconds": 0, "rc": None, "tail": "its executable was not built"}
            report.add(run)
            results[t["name"]] = run
            print(f"{t['name']:<28} FAIL     not built", flush=True)
            return
        status, rc, secs, out = run_one(t["cmd"], dict(base_env, **t["env"]), min(args.timeout, clock.left()))
        run = {"name": t["name"], "status": status, "seconds": round(secs, 1), "rc": rc, "tail": tail(out)}
        report.log(f"{t['name']}: {status} in {secs:.1f} s (rc {rc}): {' '.join(t['cmd'])}", out)
        report.add(run)
        print(f"{t['name']:<28} {status:<8} {secs:6.1f} s", flush=True)
        results[t["name"]] = run

    with cf.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(work, tests))
    for t in tests:
        run = results[t["name"]]
        if run["status"] in ("FAIL", "TIMEOUT") and t["cmd"] is not None:
            if clock.left() < 5:
                run["cases"] = [{"name": "(all)", "status": "NOT RUN", "seconds": 0, "tail": "out of time"}]
            else:
                run["cases"] = rerun_cases(t, base_env, report, clock, args.case_timeout)
            report.flush()


def mode_sanitize(args, report, clock, base_env):
    exe = os.path.join(args.bin_dir, os.path.basename(args.bin)) if args.bin_dir else args.bin
    common = ["--error-exitcode", str(SANITIZER_ERROR_CODE), "--print-limit", "20"]
    plans = [("memcheck", ["--tool", "memcheck", "--leak-check", "no"], []),
             ("racecheck", ["--tool", "racecheck"], [f"--test-case={args.race_filter}"]),
             ("synccheck", ["--tool", "synccheck"], [f"--test-case={args.race_filter}"])]
    for name, tool, filt in plans:
        cmd = [args.sanitizer] + tool + common + [exe] + filt
        status, rc, secs, out = run_one(cmd, base_env, min(args.timeout, clock.left()))
        if rc == SANITIZER_ERROR_CODE:
            status = "FAIL"
        found = re.findall(r"=========\s+(?:ERROR SUMMARY|RACECHECK SUMMARY)[^\n]*", out)
        report.log(f"compute-sanitizer {name}: {status} in {secs:.1f} s (rc {rc}): {' '.join(cmd)}", out)
        report.add({"name": name, "status": status, "seconds": round(secs, 1), "rc": rc,
                    "summary": found[-1].strip("= ") if found else "", "tail": tail(out)})
        print(f"{name:<10} {status:<8} {secs:6.1f} s  {found[-1].strip('= ') if found else ''}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("tests", "sanitize"))
    ap.add_argument("--tests", help="ctest --show-only=json-v1 output (tests mode)")
    ap.add_argument("--label", default="cuda", help="run only tests with this CTest label ('' for all)")
    ap.add_argument("--only", default="", help="comma-separated test names (default: all)")
    ap.add_argument("--bin-dir", default="", help="run executables from this folder (by file name)")
    ap.add_argument("--bin", help="the test binary to sanitize (sanitize mode)")
    ap.add_argument("--sanitizer", default="compute-sanitizer")
    ap.add_argument("--race-filter", default="*decode*", help="doctest --test-case filter for racecheck/synccheck")
    ap.add_argument("--json", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--deadline", type=float, required=True, help="seconds for the whole call")
    ap.add_argument("--timeout", type=float, default=35, help="seconds per test binary (per tool run)")
    ap.add_argument("--case-timeout", type=float, default=30, help="seconds per case when rerunning")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for every run")
    args = ap.parse_args()
    clock = Clock(args.deadline)
    report = Report(args.mode, args.json, args.log, clock)
    base_env = dict(os.environ, **dict(e.split("=", 1) for e in args.env))
    if args.mode == "tests":
        mode_tests(args, report, clock, base_env)
    else:
        mode_sanitize(args, report, clock, base_env)
    report.flush()
    d = report.doc
    print(f"passed {d['passed']}, failed {d['failed']}, timed out {d['timed_out']}, skipped {d['skipped']}, "
          f"not run {d['not_run']} in {d['elapsed_s']} s", flush=True)
    return 1 if d["failed"] or d["timed_out"] or d["not_run"] else (SKIP_CODE if d["passed"] == 0 else 0)


if __name__ == "__main__":
    sys.exit(main())
