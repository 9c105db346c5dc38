#!/usr/bin/env python3
"""A simulated GPU for the dry run of benchmarks/gpu/check.sh (tests/gpu/test_check_dryrun.py): one script
that acts as whatever it is named (links / copies of it):

  nvidia-smi            --query-gpu=... --format=csv,noheader: one H200 line with as many fields as asked;
                        -q: a few lines of the real report's shape
  compute-sanitizer     options, then the executable and its arguments: runs it with FAKE_SANITIZER=<tool>
                        (the fake test then takes 5x as long, as memcheck does), prints the tool's banner
                        and "ERROR SUMMARY: N errors" (N from the plan), exits --error-exitcode when N > 0
  test_cuda_* / test_nccl_*  a doctest binary: --list-test-cases; --test-case= / --test-case-exclude=
                        filters (comma lists, * and ? wildcards); prints LATTICE_TEST_SEED (obeys it) and
                        "[case] name" per case as the CUDA tests do, doctest's failure blocks, a CUDA error
  bench_gpu_*           writes its JSON after every row (gemm.json / attention.json / decode.json) and
                        stops at --deadline, unless the plan says it hangs
  lattice               `generate ... --stats-json P` writes P
Behaviour comes from the JSON plan in FAKE_GPU_PLAN: {"scale": s, "log": path, "binaries": {name: {"cases":
[...], "seconds": GPU-seconds per case, "fail": "always" | "seed_odd", "fail_case": name, "hang_case": name,
"memcheck_errors": n, "hang": true}}}. Seconds are the H200 timetable's, multiplied by "scale" (the run's
CHECK_TIME_SCALE). Every invocation appends {name, argv, seed, sanitizer} to "log", so the test can see
which seed each run got. Standard library only.
"""
import fnmatch
import json
import os
import sys
import time

NAME = os.path.basename(sys.argv[0])
PLAN = json.load(open(os.environ["FAKE_GPU_PLAN"])) if os.environ.get("FAKE_GPU_PLAN") else {"scale": 0.05}
SCALE = float(PLAN.get("scale", 0.05))


def log(**kw):
    if PLAN.get("log"):
        with open(PLAN["log"], "a") as f:
            f.write(json.dumps(dict(name=NAME, argv=sys.argv[1:], **kw)) + "\n")


def gpu_sleep(seconds):
    time.sleep(seconds * SCALE * (5 if os.environ.get("FAKE_SANITIZER") else 1))


def nvidia_smi(args):
    if any(a.startswith("--query-gpu=") for a in args):
        fields = [a for a in args if a.startswith("--query-gpu=")][0].split("=", 1)[1].split(",")
        values = {"name": "NVIDIA H200", "compute_cap": "9.0", "driver_version": "570.86.15", "clocks.sm": "1980 MHz",
                  "clocks.max.sm": "1980 MHz", "power.limit": "700.00 W", "mig.mode.current": "Disabled",
                  "ecc.mode.current": "Enabled", "memory.total": "143771 MiB", "pstate": "P0"}
        print(", ".join(values.get(f, "1") for f in fields))
    elif "-q" in args:
        print("==============NVSMI LOG==============\nAttached GPUs : 1\nGPU 00000000:00:05.0\n"
              "    Product Name : NVIDIA H200\n    Clocks Event Reasons\n        Idle : Active\n"
              "        SW Power Cap : Not Active\n    ECC Errors\n        Volatile\n            DRAM Uncorrectable : 0")
    return 0


def compute_sanitizer(args):
    tool, code, i = "memcheck", 0, 0
    while i < len(args) and not os.path.isfile(args[i]):
        if args[i] == "--tool":
            tool = args[i + 1]
        if args[i] == "--error-exitcode":
            code = int(args[i + 1])
        i += 2 if args[i] in ("--tool", "--error-exitcode", "--print-limit", "--leak-check") else 1
    exe = args[i]
    print("========= COMPUTE-SANITIZER", flush=True)
    import subprocess
    rc = subprocess.run([exe] + args[i + 1:], env=dict(os.environ, FAKE_SANITIZER=tool)).returncode
    n = PLAN.get("binaries", {}).get(os.path.basename(exe), {}).get("memcheck_errors", 0) if tool == "memcheck" else 0
    for _ in range(n):
        print("========= Invalid __global__ read of size 4 bytes\n=========     at fake_kernel+0x40", flush=True)
    print(f"========= ERROR SUMMARY: {n} error{'s' if n != 1 else ''}", flush=True)
    return code if n and code else rc


def matches(name, patterns):
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def doctest_binary(args):
    spec = PLAN.get("binaries", {}).get(NAME, {})
    cases = spec.get("cases", [f"{NAME}: case one", f"{NAME}: case two, with a comma"])
    if "--list-test-cases" in args:
        print("[doctest] listing all test case names\n" + "=" * 79)
        print("\n".join(cases) + "\n" + "=" * 79)
        return 0
    inject = os.environ.get("LATTICE_TEST_INJECT", "")
    if f"fail:{NAME}" in inject.split(","):
        print(f"LATTICE_TEST_INJECT: injected fail in {NAME}")
        return 1
    seed = int(os.environ.get("LATTICE_TEST_SEED", "0"), 0) if os.environ.get("LATTICE_TEST_SEED") else 12345
    log(seed=seed, sanitizer=os.environ.get("FAKE_SANITIZER"))
    inc = [p for a in args if a.startswith("--test-case=") for p in a.split("=", 1)[1].split(",")]
    exc = [p for a in args if a.startswith("--test-case-exclude=") for p in a.split("=", 1)[1].split(",")]
    print(f"LATTICE_TEST_SEED={seed}", flush=True)
    failed = 0
    for c in cases:
        if (inc and not matches(c, inc)) or matches(c, exc):
            continue
        print(f"[case] {c}", flush=True)
        if c == spec.get("hang_case") or f"hang:{NAME}" in inject.split(","):
            while True:
                time.sleep(1)
        gpu_sleep(spec.get("seconds", 2))
        bad = spec.get("fail") == "always" or (spec.get("fail") == "seed_odd" and seed % 2 == 1)
        if bad and c == spec.get("fail_case", cases[0]):
            failed += 1
            print("=" * 79 + f"\nfake.cpp:10:\nTEST CASE:  {c}\n\nfake.cpp:12: ERROR: CHECK( got == ref ) is NOT "
                  "correct!\n  values: CHECK( cudaErrorIllegalAddress: an illegal memory access was encountered )\n"
                  + "=" * 79, flush=True)
    print(f"[doctest] test cases: {len(cases)} | {len(cases) - failed} passed | {failed} failed")
    return 1 if failed else 0


def bench(args):
    spec = PLAN.get("binaries", {}).get(NAME, {})
    out = args[args.index("--out") + 1]
    deadline = float(args[args.index("--deadline") + 1]) if "--deadline" in args else 1e9
    t0 = time.monotonic()
    kind = NAME[len("bench_gpu_"):]
    rows, sections = [], []
    os.makedirs(out, exist_ok=True)
    for i in range(spec.get("rows", 6)):
        if time.monotonic() - t0 > deadline and not spec.get("hang"):
            break
        gpu_sleep(spec.get("seconds", 3))
        if kind == "gemm":
            rows.append({"kernel": "int8 cublasLt IMMA", "m": 4096, "n": 4096, "k": 4096, "tops": 1500.0 - i,
                         "pct_peak": 76.0, "path": "lt#0/8"})
            doc = {"benchmark": "gpu_gemm", "peaks": {"int8_tops": 1979}, "complete": False, "rows": rows}
        elif kind == "attention":
            rows.append({"ctx": 4096, "batch": 1 + i, "pct_copy": 80.0})
            doc = {"benchmark": "gpu_attention_decode", "rows": rows}
        else:
            sections.append({"shape": f"fake-{i}", "slope": [{"batch": 1, "pct_of_floor": 88.0}],
                             "graph": [{"batch": 1, "pct_of_floor": 85.0}],
                             "engine": [{"batch": 1, "pct_of_floor": 80.0, "tokens_per_s": 900.0}]})
            doc = {"benchmark": "gpu_decode", "complete": False, "sections": sections}
        path = os.path.join(out, f"{kind}.json")
        json.dump(doc, open(path + ".tmp", "w"))
        os.replace(path + ".tmp", path)
        print(f"row {i}", flush=True)
    while spec.get("hang"):
        time.sleep(1)
    doc["complete"] = True
    json.dump(doc, open(os.path.join(out, f"{kind}.json"), "w"))
    return 0


def lattice(args):
    gpu_sleep(PLAN.get("binaries", {}).get("lattice", {}).get("seconds", 4))
    path = args[args.index("--stats-json") + 1]
    json.dump({"decode_tokens_per_s": 850.0, "load_seconds": 1.0}, open(path, "w"))
    return 0


def main():
    args = sys.argv[1:]
    if NAME == "nvidia-smi":
        return nvidia_smi(args)
    if NAME == "compute-sanitizer":
        return compute_sanitizer(args)
    if NAME.startswith("bench_gpu_"):
        return bench(args)
    if NAME == "lattice":
        return lattice(args)
    return doctest_binary(args)


if __name__ == "__main__":
    sys.exit(main())
