#!/usr/bin/env python3
"""Start-up: time from launch to first token, original bf16 checkpoint vs its `lattice convert` form.

Workload: the TinyLlama-1.1B shape written as a bf16 Hugging Face checkpoint of random
weights (benchmarks/tools/make_random_hf.py), run W8A8; the same model converted with
`lattice convert --quant w8a8` for tp 1 and tp 2. For each tp and form, `lattice generate
--prompt-ids 1,2,3,4 --max-new-tokens 1` (under mpirun -np 2 for tp 2) is timed from launch to exit:
the one token it generates is the first token, so that wall time is launch-to-first-token,
process start, MPI start-up, weight loading, prefill and exit included. Also reported per run, from
--stats-json: the builder's load seconds (parallel context to ready engine), the prefill seconds and
the checkpoint bytes each rank read; and per conversion: its wall time and peak resident memory.
Runs are warm-cache by default (every configuration runs once untimed first); --cold drops the page
cache before each timed run (root only: `sync; echo 3 > /proc/sys/vm/drop_caches`), which is what a
first start after copying a checkpoint sees. Take numbers on a quiet machine (load printed).
Usage: benchmarks/bench_load.py [--build build] [--work /tmp/lattice-bench-load] [--tp 1,2] [--runs 3]
                                [--threads 2] [--cold] [--smoke] [--json FILE]
--smoke uses a small shape (a few MB) and one run: checks the script, not the machine.
Prints a markdown table and writes JSON (default benchmarks/results/load.json)."""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

from bench_common import machine_info, mpirun_prefix, sh

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def dir_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def first_token(lattice, model, tp, threads, stats, cold):
    if cold:
        drop_caches()
    cmd = (mpirun_prefix(tp) if tp > 1 else []) + [lattice, "generate", "--model", model, "--quant", "w8a8", "--tp", str(tp), "--threads",
                        str(threads), "--prompt-ids", "1,2,3,4", "--max-new-tokens", "1", "--ignore-eos",
                        "--print-ids", "--stats-json", stats]
    t0 = time.perf_counter()
    p = sh(cmd)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr[-600:]}")
    s = json.load(open(stats))
    return {"wall_s": wall, "load_s": s["load_seconds"], "prefill_s": s["prefill_seconds"],
            "bytes_read_per_rank": s.get("checkpoint_bytes_read_per_rank", [])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(root, "build"))
    ap.add_argument("--work", default="/tmp/lattice-bench-load")
    ap.add_argument("--tp", default="1,2")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="CPU threads per rank (tp 2: this many per rank)")
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json", default=os.path.join(root, "benchmarks", "results", "load.json"))
    a = ap.parse_args()
    lattice = os.path.join(a.build, "launch", "lattice")
    if not os.path.exists(lattice):
        sys.exit(f"{lattice} missing: build the lattice target")
    if a.cold and os.geteuid() != 0:
        sys.exit("--cold drops the page cache: run as root")
    shape = "small" if a.smoke else "tinyllama-1.1b"
    runs = 1 if a.smoke else a.runs
    tps = [int(x) for x in a.tp.split(",")]
    work = os.path.join(a.work, shape)
    hf = os.path.join(work, "hf-bf16")
    os.makedirs(work, exist_ok=True)
    if not os.path.exists(os.path.join(hf, "model.safetensors")):
        subprocess.run([sys.executable, os.path.join(here, "tools", "make_random_hf.py"), "--out", hf, "--shape",
                        shape, "--dtype", "bf16"], check=True)
    result = {"benchmark": "load", "shape": shape, "machine": machine_info(root), "threads_per_rank": a.threads,
              "cache": "cold" if a.cold else "warm", "runs": runs, "checkpoint_bytes": dir_bytes(hf),
              "conversions": {}, "rows": []}
    for tp in tps:
        conv = os.path.join(work, f"w8a8-tp{tp}")
        if os.path.exists(conv):
            shutil.rmtree(conv)
        cmd = (mpirun_prefix(tp) if tp > 1 else []) + [lattice, "convert", "--model", hf, "--out", conv, "--tp", str(tp), "--quant", "w8a8",
                            "--progress", "none"]
        t0 = time.perf_counter()
        p = sh(cmd)
        if p.returncode != 0:
            raise RuntimeError(f"convert failed: {p.stderr[-600:]}")
        peak = re.search(r"peak resident memory (\d+) MiB", p.stdout)
        result["conversions"][f"tp{tp}"] = {"seconds": time.perf_counter() - t0, "bytes": dir_bytes(conv),
                                            "peak_rss_mib_rank0": int(peak.group(1)) if peak else None}
        for form, model in (("bf16 HF (quantized at load)", hf), ("converted w8a8", conv)):
            stats = os.path.join(work, "stats.json")
            first_token(lattice, model, tp, a.threads, stats, False)  # warm-up (and a check it runs)
            rs = [first_token(lattice, model, tp, a.threads, stats, a.cold) for _ in range(runs)]
            row = {"tp": tp, "form": form, "model": model,
                   "first_token_s": statistics.median(r["wall_s"] for r in rs),
                   "first_token_s_all": [r["wall_s"] for r in rs],
                   "load_s": statistics.median(r["load_s"] for r in rs),
                   "prefill_s": statistics.median(r["prefill_s"] for r in rs),
                   "bytes_read_per_rank": rs[-1]["bytes_read_per_rank"]}
            result["rows"].append(row)
    base = {r["tp"]: r["first_token_s"] for r in result["rows"] if r["form"].startswith("bf16")}
    print(f"\n{shape}, {result['cache']} cache, {a.threads} threads per rank, median of {runs}; "
          f"load {result['machine']['load_1min']:.1f} on {result['machine']['cores']} cores\n")
    print("| tp | checkpoint | launch to first token (s) | load (s) | prefill (s) | GiB read per rank | speed-up |")
    print("|---|---|---|---|---|---|---|")
    for r in result["rows"]:
        per = ", ".join(f"{b / 2**30:.3f}" for b in r["bytes_read_per_rank"])
        print(f"| {r['tp']} | {r['form']} | {r['first_token_s']:.2f} | {r['load_s']:.2f} | {r['prefill_s']:.3f} | "
              f"{per} | {base[r['tp']] / r['first_token_s']:.2f}x |")
    for k, c in result["conversions"].items():
        print(f"conversion {k}: {c['seconds']:.1f} s, {c['bytes'] / 2**30:.2f} GiB written, "
              f"peak RSS {c['peak_rss_mib_rank0']} MiB (rank 0)")
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
