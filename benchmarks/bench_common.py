"""What the benchmark scripts share: running a command (sh), the machine a figure came from (machine_info), the
mpirun prefix of a multi-rank run. benchmarks/run.py, bench_int4_decode.py, bench_load.py, bench_batch.py,
serve_load.py and validate_plan.py each had their own copy."""
import os
import platform
import re
import subprocess
import sys


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def sh(cmd, timeout=None, **kw):
    """The command's CompletedProcess (text output captured); a command that cannot start or runs past `timeout`
    seconds comes back with returncode 127 and the reason as its stderr."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(cmd, 127, "", str(e))


def first_line(text):
    return next((l.strip() for l in text.splitlines() if l.strip()), "")


def cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def machine_info(repo=None):
    """CPU (model, family/model, ISA flags that matter here), cores, memory, kernel, 1-minute load; with `repo`, also
    its commit and whether the tree has changes (what the figure was measured on)."""
    info = {"cpu": "?", "cores": cores(), "logical_cpus": os.cpu_count(), "kernel": platform.release(),
            "hostname": platform.node()}
    try:
        cpu = open("/proc/cpuinfo").read()
        field = lambda k: next((l.split(":", 1)[1].strip() for l in cpu.splitlines() if l.startswith(k)), None)
        info["cpu"] = field("model name") or "?"
        info["cpu_family_model"] = f"{field('cpu family')}/{field('model')}"
        flags = set((field("flags") or "").split())
        info["isa"] = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if f in flags]
    except OSError:
        pass
    try:
        kb = int(re.search(r"MemTotal:\s+(\d+)", open("/proc/meminfo").read()).group(1))
        info["mem_gib"] = round(kb / 1048576, 1)
    except (OSError, AttributeError):
        pass
    info["load_1min"] = round(os.getloadavg()[0], 2)
    if repo:
        info["commit"] = sh(["git", "-C", repo, "rev-parse", "--short", "HEAD"], timeout=30).stdout.strip()
        info["git_dirty"] = bool(sh(["git", "-C", repo, "status", "--porcelain"], timeout=30).stdout.strip())
    return info


def mpirun_prefix(np_):
    """mpirun -np np_ with oversubscription and no binding (ranks share the cores of a small machine)."""
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_)]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    return cmd
