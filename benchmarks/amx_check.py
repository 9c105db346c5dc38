#!/usr/bin/env python3
"""The AMX check, one command for a session on a Xeon with AMX (issue 53's measurements), on a built tree:
  1. the tile tests on the instructions: test_kernels_cpu_amx (lattice's AMX-INT8 kernels, W8A8 and W4A8, bit-equal
     to the VNNI kernels, the amx level running them from m = 16) and test_kernels_cpu_onednn; a skip stops the
     check (the reason printed: the CPU, the OS's tile state or the kernel's permission);
  2. bench_gemm_int8 --modes w8a8,w4a8 at the amx level (rows "amx": lattice's tiles; rows "onednn": oneDNN's
     matmul, which picks brg:avx512_core_amx_int8 here) and at avx512 (the VNNI kernels), 4096 x 4096 and
     11008 x 4096; bench_gemm_int4 (W4A8 on the group form, Q4_K and Q6_K layouts, one thread) at both levels;
  3. prefill of 512 tokens on the TinyLlama-1.1B shape (random weights; bench_decode), rounds interleaved: W8A8
     under oneDNN (--int8-gemm onednn), lattice's tiles (--int8-gemm own) and the VNNI kernel (--isa avx512); W4A8
     (the built-in model's scheme) under lattice's tiles and the VNNI kernel;
  4. with --batch: 16 requests x (128 in, 64 out) (bench_batch.py --n 16) under the same three settings.
Writes amx_check.json (and each bench's own JSON) under --out and prints a markdown summary. Nothing here asserts
speed; exit 77 where AMX cannot run, 1 when a step fails.
Usage: benchmarks/amx_check.py [--build build] [--out benchmarks/results/<machine>] [--threads 2] [--rounds 3]
                               [--batch]"""
import argparse
import json
import os
import statistics
import sys

from bench_common import log, machine_info, sh

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SETTINGS = [("onednn", ["--int8-gemm", "onednn"], {"LATTICE_INT8_GEMM": "onednn"}),
            ("amx tiles (own)", ["--int8-gemm", "own"], {"LATTICE_INT8_GEMM": "own"}),
            ("avx512 VNNI", ["--int8-gemm", "own", "--isa", "avx512"], {"LATTICE_INT8_GEMM": "own", "LATTICE_ISA": "avx512"})]
# W4A8 has no oneDNN form (a scale per group of 32): lattice's tiles against its VNNI kernel.
PREFILL = [("w8a8", name, args) for name, args, _ in SETTINGS] + \
    [("w4a8", "amx tiles", []), ("w4a8", "avx512 VNNI", ["--isa", "avx512"])]


def run(cmd, what, env=None, timeout=3600):
    log(f"amx_check: {what}: {' '.join(cmd)}")
    p = sh(cmd, timeout=timeout, env=dict(os.environ, **(env or {})))
    if p.returncode != 0:
        sys.exit(f"amx_check: {what} failed (rc {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p


def tests(build):
    p = sh(["ctest", "--test-dir", build, "-R", "^test_kernels_cpu_(amx|onednn)$", "--output-on-failure", "-V"],
           timeout=1800)
    out = p.stdout + p.stderr
    if p.returncode != 0:
        sys.exit(f"amx_check: the tile tests failed:\n{out[-4000:]}")
    skips = [l for l in out.splitlines() if "SKIP:" in l]
    print("\n".join(skips))
    if any("AMX tiles" in l for l in skips):  # AMX cannot run here (the oneDNN cases may skip on their own)
        sys.exit(77)
    return out.count("Passed")


def gemm(build, out, threads):
    rows = {}
    for isa in ("amx", "avx512"):
        path = os.path.join(out, f"amx_gemm_int8_{isa}.json")
        p = run([os.path.join(build, "benchmarks", "bench_gemm_int8"), "--modes", "w8a8,w4a8", "--isa", isa, "--threads",
                 str(threads), "--shapes", "4096x4096,11008x4096", "--json", path], f"bench_gemm_int8 --isa {isa}")
        print(p.stdout)
        rows[isa] = json.load(open(path))
        path4 = os.path.join(out, f"amx_gemm_int4_{isa}.json")
        p = run([os.path.join(build, "benchmarks", "bench_gemm_int4"), "--isa", isa, "--m", "16,128,512", "--rounds",
                 "3", "--json", path4], f"bench_gemm_int4 --isa {isa}")
        print(p.stdout)
        rows[f"{isa} int4"] = json.load(open(path4))
    return rows


def prefill(build, out, threads, rounds):
    got = {f"{quant}, {name}": [] for quant, name, _ in PREFILL}
    path = os.path.join(out, "amx_prefill_tmp.json")
    for r in range(rounds):
        for quant, name, args in PREFILL:
            run([os.path.join(build, "benchmarks", "bench_decode"), "--config", "tinyllama-1.1b", "--quant", quant,
                 "--prompt", "512", "--decode", "4", "--threads", str(threads), "--json", path] + args,
                f"prefill 512, {quant}, {name}, round {r + 1}")
            got[f"{quant}, {name}"].append(json.load(open(path))["prefill_tokens_per_s"])
    os.remove(path)
    return got


def batch(build, out, threads):
    got = {}
    for name, _, env in SETTINGS:
        tag = "_amx_" + name.split()[0]
        run([sys.executable, os.path.join(HERE, "bench_batch.py"), "--build", build, "--out", out, "--n", "16",
             "--threads", str(threads), "--tag", tag], f"16 requests, {name}", env=env)
        doc = json.load(open(os.path.join(out, f"batch{tag}.json")))
        got[name] = doc["rows"][0]["lattice"]
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "amx-check"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", action="store_true", help="also the 16-request batch under each setting")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    doc = {"benchmark": "amx_check", "machine": machine_info(ROOT), "threads": a.threads,
           "tests_passed": tests(a.build)}
    doc["gemm"] = gemm(a.build, a.out, a.threads)
    doc["prefill_512_tok_s"] = prefill(a.build, a.out, a.threads, a.rounds)
    if a.batch:
        doc["batch16"] = batch(a.build, a.out, a.threads)
    with open(os.path.join(a.out, "amx_check.json"), "w") as f:
        json.dump(doc, f, indent=2)
    print("| prefill 512 (TinyLlama-1.1B shape) | tok/s, median | rounds |\n|---|---|---|")
    for name, v in doc["prefill_512_tok_s"].items():
        print(f"| {name} | {statistics.median(v):.1f} | {', '.join(f'{x:.1f}' for x in v)} |")
    for name, l in doc.get("batch16", {}).items():
        print(f"16 requests, {name}: {l['run_seconds']:.2f} s, {l['tokens_per_s']:.1f} tok/s, "
              f"decode {l['decode_tokens_per_s']:.1f} tok/s")


if __name__ == "__main__":
    main()
