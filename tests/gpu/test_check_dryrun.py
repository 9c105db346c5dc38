#!/usr/bin/env python3
"""Dry run of benchmarks/gpu/check.sh's two stages on a machine without a GPU: the harness itself
(deadlines, partial results, reruns with the failed run's seed, the sanitizer's budget, the summary)
against a simulated GPU (tests/gpu/fake_gpu.py as nvidia-smi, compute-sanitizer, the 14 CUDA ctest
entries' binaries, the benchmarks and lattice), carried the real way: a bundle packed by
benchmarks/gpu/bundle.py from a fake build folder and verified against this tree by check.sh.
Deadlines run at CHECK_TIME_SCALE = 0.1 (stage 1's 240 s are 12 s here, stage 2's 300 s are 15 s).

  stage1  stage 1 with an injected failing test (test_cuda_sampling: a CUDA error, 1 memcheck error),
          a hang (test_cuda_ops) and a seed-dependent failure (test_cuda_int4 fails on odd seeds);
  stage2  stage 1 with a stale bundle (a source changed since it was packed): it says which and stops,
          configuring nothing; then stage 2 with a decode benchmark that hangs past its deadline.
          Shows: each stage within its budget, wall clock from its start; every test's
          verdict with its seed, echoed by the binary; each failure rerun alone with THE SAME seed and
          CUDA_LAUNCH_BLOCKING=1 and memchecked, within the stage; the hang named by its case; the
          sanitizer step and nvidia-smi -q after; stage 2 keeping the decode rows written before its
          deadline and still running e2e after it.
  kill    each stage killed (SIGKILL to its whole process group) at a point drawn at random (the seed is
          printed; --seed N repeats a draw): summary.txt and summary.json are whole and name the steps done and the one running.
Usage: test_check_dryrun.py SOURCE_DIR stage1|stage2|kill [--seed N]"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SCALE = 0.1
BUDGET = {1: 240, 2: 300}
STEPS = {1: ["env", "bundle", "tests", "diagnose", "sanitize", "gpu-after"],
         2: ["env", "bundle", "gemm", "attention", "decode", "e2e", "gpu-after"]}
# The 14 CUDA ctest entries (tests/*/cuda/CMakeLists.txt): name -> (executable, args), GPU-seconds per case.
ENTRIES = {
    "test_cuda_ops": ("test_cuda_ops", [], 3), "test_cuda_attention": ("test_cuda_attention", [], 4),
    "test_cuda_gemm": ("test_cuda_gemm", [], 4), "test_cuda_gemm_shapes": ("test_cuda_gemm_shapes", [], 5),
    "test_cuda_int4": ("test_cuda_int4", [], 4), "test_cuda_sampling": ("test_cuda_sampling", [], 2),
    "test_cuda_sanitize": ("test_cuda_sanitize", [], 1), "test_nccl_smoke": ("test_nccl_smoke", [], 3),
    "test_cuda_backend": ("test_cuda_backend", [], 6), "test_cuda_golden": ("test_cuda_golden", [], 6),
    "test_cuda_oracle": ("test_cuda_oracle", ["--test-case=*greedy decode*quant none*"], 10),
    "test_cuda_oracle_w8a8": ("test_cuda_oracle", ["--test-case=*greedy decode*W8A8*"], 10),
    "test_cuda_oracle_w4a16": ("test_cuda_oracle", ["--test-case=*greedy decode*W4A16*"], 10),
    "test_cuda_oracle_bucket32": ("test_cuda_oracle", ["--test-case=*32 sequences*"], 10)}


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def setup(src, tmp):
    """Fake tools on PATH, a fake build folder packed into a bundle for this tree; returns the env."""
    fake = os.path.join(src, "tests/gpu/fake_gpu.py")
    tools, build = os.path.join(tmp, "tools"), os.path.join(tmp, "fake-build")
    os.makedirs(tools)
    os.makedirs(build)
    for n in ("nvidia-smi", "compute-sanitizer"):
        os.symlink(fake, os.path.join(tools, n))
    exes = {e for e, _, _ in ENTRIES.values()} | {"bench_gpu_gemm", "bench_gpu_attention", "bench_gpu_decode",
                                                  "lattice"}
    for e in exes:
        shutil.copy(fake, os.path.join(build, e))
        os.chmod(os.path.join(build, e), 0o755)
    with open(os.path.join(build, "CTestTestfile.cmake"), "w") as f:
        for name, (e, args, _) in ENTRIES.items():
            quoted = " ".join(f'"{a}"' for a in [os.path.join(build, e)] + args)
            f.write(f"add_test([=[{name}]=] {quoted})\n")
            f.write(f'set_tests_properties([=[{name}]=] PROPERTIES  LABELS "cuda" TIMEOUT "300")\n')
    with open(os.path.join(build, "CMakeCache.txt"), "w") as f:
        f.write("CMAKE_CUDA_ARCHITECTURES:STRING=90\nCMAKE_CXX_COMPILER:FILEPATH=/usr/bin/c++\n")
    kit = os.path.join(tmp, "gpu-kit")
    p = subprocess.run([sys.executable, os.path.join(src, "benchmarks/gpu/bundle.py"), "pack", build, kit, src],
                       capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"bundle.py pack: {p.stdout}{p.stderr}")
    return dict(os.environ, PATH=tools + os.pathsep + os.environ["PATH"], LATTICE_KIT=kit,
                BUILD_DIR=os.path.join(tmp, "build-gpu-check"), CHECK_TIME_SCALE=str(SCALE), CHECK_NCCL="off")


def plan(tmp, stage_cases):
    """The simulated GPU's behaviour (fake_gpu.py's plan), written to a file; returns its path."""
    bins = {}
    for name, (e, _, secs) in ENTRIES.items():
        bins.setdefault(e, {"seconds": secs})
    bins["test_cuda_oracle"]["cases"] = ["oracle: greedy decode, quant none", "oracle: greedy decode, W8A8",
                                         "oracle: greedy decode, W4A16", "oracle: 32 sequences"]
    bins["test_cuda_sanitize"]["cases"] = [f"sanitize: family {i}" for i in range(5)] + ["sanitize: decode attention"]
    bins.update(stage_cases)
    doc = {"scale": SCALE, "log": os.path.join(tmp, "invocations.jsonl"), "binaries": bins}
    path = os.path.join(tmp, "plan.json")
    json.dump(doc, open(path, "w"))
    return path


def run_stage(src, stage, env, out, kill_at=None):
    env = dict(env, OUT=out)
    t0 = time.monotonic()
    p = subprocess.Popen(["bash", os.path.join(src, "benchmarks/gpu/check.sh"), str(stage)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    if kill_at is None:
        text = p.communicate(timeout=BUDGET[stage] * SCALE * 3)[0].decode()
        return p.returncode, time.monotonic() - t0, text
    try:
        p.communicate(timeout=kill_at)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
    return p.returncode, time.monotonic() - t0, ""


def read_summary(out, stage):
    txt = open(os.path.join(out, "summary.txt")).read()
    if not txt.startswith(f"lattice GPU check, stage {stage}"):
        fail(f"summary.txt does not open with the stage line:\n{txt}")
    return txt, (json.load(open(os.path.join(out, "summary.json"))) if os.path.exists(
        os.path.join(out, "summary.json")) else None)


def invocations(tmp):
    return [json.loads(line) for line in open(os.path.join(tmp, "invocations.jsonl"))]


def check_stage1(src, tmp, env):
    sampling_fail, ops_hang = "test_cuda_sampling: case two, with a comma", "test_cuda_ops: case one"
    env = dict(env, FAKE_GPU_PLAN=plan(tmp, {
        "test_cuda_sampling": {"seconds": 1, "fail": "always", "fail_case": sampling_fail, "memcheck_errors": 1},
        "test_cuda_ops": {"seconds": 3, "hang_case": ops_hang},
        "test_cuda_int4": {"seconds": 4, "fail": "seed_odd"}}))
    out = os.path.join(tmp, "out1")
    rc, wall, text = run_stage(src, 1, env, out)
    print(text)
    budget = BUDGET[1] * SCALE
    print(f"stage 1: exit {rc}, {wall:.2f} s of its {budget:.1f} s budget (x{SCALE} of 240 s)")
    if wall > budget:
        fail(f"stage 1 took {wall:.2f} s, over its {budget:.1f} s budget")
    if rc != 1:
        fail(f"stage 1 with injected failures exited {rc}, not 1")
    txt, doc = read_summary(out, 1)
    steps = {s["name"]: s for s in doc["steps"]}
    if [s["name"] for s in doc["steps"]] != STEPS[1]:
        fail(f"stage 1 steps {[s['name'] for s in doc['steps']]}, not {STEPS[1]}")
    if steps["bundle"]["status"] != "PASS" or steps["tests"]["status"] != "FAIL" or steps["gpu-after"]["status"] != "PASS":
        fail(f"bundle / tests / gpu-after: {steps['bundle']}, {steps['tests']}, {steps['gpu-after']}")
    runs = {r["name"]: r for r in doc["tests"]["runs"]}
    if set(runs) != set(ENTRIES):
        fail(f"ran {sorted(runs)}, not the 14 entries")
    for name, r in runs.items():
        if r.get("seed_echoed") is not True:
            fail(f"{name}: the binary did not echo its seed {r.get('seed')}")
        if name not in ("test_cuda_sampling", "test_cuda_ops", "test_cuda_int4") and r["status"] != "PASS":
            fail(f"{name} is {r['status']}, not PASS")
    s, o, i4 = runs["test_cuda_sampling"], runs["test_cuda_ops"], runs["test_cuda_int4"]
    if s["status"] != "FAIL" or s["failed_cases"] != [sampling_fail] or "cudaErrorIllegalAddress" not in s["first_cuda_error"]:
        fail(f"test_cuda_sampling's verdict: {s}")
    if o["status"] != "TIMEOUT" or o["failed_cases"] != [ops_hang]:
        fail(f"test_cuda_ops's verdict (the hang named by its case): {o}")
    if i4["status"] != ("FAIL" if i4["seed"] % 2 else "PASS"):
        fail(f"test_cuda_int4 with seed {i4['seed']} is {i4['status']}")
    calls = invocations(tmp)
    for r in [s, o] + ([i4] if i4["seed"] % 2 else []):
        d = r.get("diagnosis") or {}
        if d.get("reproduced") is not True or d["rerun"]["status"] != r["status"]:
            fail(f"{r['name']} was not rerun and reproduced: {d}")
        exe = ENTRIES[r["name"]][0]
        reruns = [c for c in calls if c["name"] == exe and c["seed"] == r["seed"]]
        # The first run, the rerun (launch blocking), memcheck: all with the failed run's seed.
        if len(reruns) < 3 or not any(c["sanitizer"] == "memcheck" for c in reruns):
            fail(f"{r['name']}: runs with seed {r['seed']}: {reruns}")
        if not any(a.startswith("--test-case=") for c in reruns[1:] for a in c["argv"]):
            fail(f"{r['name']}: the rerun was not restricted to the failing case: {reruns}")
    if s["diagnosis"]["memcheck"]["status"] != "FAIL" or "1 error" not in s["diagnosis"]["memcheck"]["summary"]:
        fail(f"test_cuda_sampling's memcheck: {s['diagnosis']['memcheck']}")
    if o["diagnosis"]["memcheck"]["status"] not in ("INCOMPLETE", "PASS"):
        fail(f"test_cuda_ops's memcheck: {o['diagnosis']['memcheck']}")
    # What the failures left of the budget: some memcheck runs done, or all cut (then SKIP, not FAIL).
    san = doc["sanitize"]["runs"] if doc.get("sanitize") else []
    if steps["sanitize"]["status"] not in ("PASS", "SKIP") or any(r["status"] == "FAIL" for r in san):
        fail(f"the sanitize step: {steps['sanitize']}, {san}")
    for needle in (str(s["seed"]), "reproduced", "compute-sanitizer memcheck: FAIL"):
        if needle not in txt:
            fail(f"summary.txt lacks {needle!r}:\n{txt}")
    if "nvidia-smi -q after stage 1" not in open(os.path.join(out, "gpu.txt")).read():
        fail("gpu.txt lacks nvidia-smi -q after the stage")
    return wall


def check_stage2(src, tmp, env):
    env = dict(env, FAKE_GPU_PLAN=plan(tmp, {"bench_gpu_decode": {"seconds": 20, "rows": 3, "hang": True}}))
    out = os.path.join(tmp, "out2")
    rc, wall, text = run_stage(src, 2, env, out)
    print(text)
    budget = BUDGET[2] * SCALE
    print(f"stage 2: exit {rc}, {wall:.2f} s of its {budget:.1f} s budget (x{SCALE} of 300 s)")
    if wall > budget:
        fail(f"stage 2 took {wall:.2f} s, over its {budget:.1f} s budget")
    txt, doc = read_summary(out, 2)
    steps = {s["name"]: s for s in doc["steps"]}
    if [s["name"] for s in doc["steps"]] != STEPS[2]:
        fail(f"stage 2 steps {[s['name'] for s in doc['steps']]}, not {STEPS[2]}")
    want = {"bundle": "PASS", "gemm": "PASS", "attention": "PASS", "decode": "TIMEOUT", "e2e": "PASS"}
    got = {k: steps[k]["status"] for k in want}
    if got != want or rc != 1:
        fail(f"stage 2 statuses {got} (exit {rc}), not {want} (exit 1)")
    if not doc.get("decode") or not doc["decode"].get("sections"):
        fail("the decode rows written before the deadline were not kept")
    if not doc.get("gemm") or not doc["gemm"].get("complete"):
        fail(f"gemm.json: {doc.get('gemm')}")
    return wall


def check_stale(src, tmp, env):
    """A bundle whose sources no longer match the tree: stage 1 says so and stops, building nothing."""
    kit = os.path.join(tmp, "stale-kit")
    shutil.copytree(env["LATTICE_KIT"], kit)
    path = os.path.join(kit, "bin", "sources.json")
    doc = json.load(open(path))
    first = sorted(doc["sources"])[0]
    doc["sources"][first] = "0" * 64
    json.dump(doc, open(path, "w"))
    out = os.path.join(tmp, "out-stale")
    rc, wall, _ = run_stage(src, 1, dict(env, LATTICE_KIT=kit, FAKE_GPU_PLAN=plan(tmp, {})), out)
    _, doc = read_summary(out, 1)
    steps = {s["name"]: s for s in doc["steps"]}
    if rc != 1 or steps["bundle"]["status"] != "SKIP" or f"stale: {first} changed" not in steps["bundle"]["note"] or \
            steps["tests"]["status"] != "FAIL" or "no usable bundle" not in steps["tests"]["note"]:
        fail(f"a stale bundle: exit {rc}, {steps.get('bundle')}, {steps.get('tests')}")
    if os.path.exists(os.path.join(env["BUILD_DIR"], "CMakeCache.txt")):
        fail("stage 1 configured a build")
    print(f"a stale bundle: stage 1 said '{steps['bundle']['note']}' and stopped in {wall:.1f} s")


def check_kills(src, tmp, env, seed):
    rng = random.Random(seed)
    print(f"kill points drawn with --seed {seed}")
    for stage in (1, 2):
        for k in range(1):
            point = rng.uniform(0.3, BUDGET[stage] * SCALE * 0.95)
            out = os.path.join(tmp, f"kill{stage}{k}")
            env_k = dict(env, FAKE_GPU_PLAN=plan(tmp, {"test_cuda_ops": {"seconds": 3, "hang_case": "test_cuda_ops: case one"},
                                                        "bench_gpu_decode": {"seconds": 20, "hang": True}}))
            run_stage(src, stage, env_k, out, kill_at=point)
            txt, doc = read_summary(out, stage)
            if doc is None:
                fail(f"stage {stage} killed at {point:.2f} s: no summary.json")
            names = [s["name"] for s in doc["steps"]]
            if names != STEPS[stage][:len(names)]:
                fail(f"stage {stage} killed at {point:.2f} s: steps {names}")
            for s in doc["steps"]:
                if s["name"] not in txt:
                    fail(f"stage {stage} killed at {point:.2f} s: summary.txt lacks step {s['name']}:\n{txt}")
            # What the killed run left running (tests run in sessions of their own) is killed by the
            # next start of check.sh (here its reap mode), so it cannot hold the GPU into the next call.
            subprocess.run(["bash", os.path.join(src, "benchmarks/gpu/check.sh"), "reap"], env=env_k, check=True)
            left = subprocess.run(["pgrep", "-f", os.path.join(tmp, "build-gpu-check")], capture_output=True, text=True)
            if left.stdout.strip():
                fail(f"stage {stage} killed at {point:.2f} s: still running after reap: {left.stdout.split()}")
            last = doc["steps"][-1]["status"] if doc["steps"] else "none yet"
            print(f"stage {stage} killed at {point:.2f} s: summary readable, steps {names} (last: {last})")


def main():
    src, what = os.path.abspath(sys.argv[1]), sys.argv[2]
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else random.randrange(1 << 30)
    for tool in ("bash", "timeout", "awk", "xz"):
        if not shutil.which(tool):
            print(f"SKIP: {tool} is not installed")
            return 77
    with tempfile.TemporaryDirectory() as tmp:
        env = setup(src, tmp)
        if what == "stage1":
            w = check_stage1(src, tmp, env)
            print(f"PASS: stage 1 in {w:.2f} s <= {BUDGET[1] * SCALE:.1f} s (x{SCALE}); each failure rerun with its "
                  "seed and memchecked within it")
        elif what == "stage2":
            check_stale(src, tmp, env)
            w = check_stage2(src, tmp, env)
            print(f"PASS: stage 2 in {w:.2f} s <= {BUDGET[2] * SCALE:.1f} s (x{SCALE}); the cut-off benchmark's rows kept")
        elif what == "kill":
            check_kills(src, tmp, env, seed)
            print("PASS: the summary is readable after each stage is killed at an arbitrary point")
        else:
            fail(f"unknown mode {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
