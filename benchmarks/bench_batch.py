#!/usr/bin/env python3
"""Batch throughput: `lattice batch` against llama.cpp's llama-batched-bench, same model, same run.

Workload: N requests of 128 prompt tokens and 64 new tokens each (ignore_eos), N = 1, 4,
16, 64, on the TinyLlama-1.1B shape with random weights written as a Q8_0 GGUF
(benchmarks/tools/make_random_gguf.py, Llama 2 vocab from ../shared), 2 threads. lattice runs it
W8A8 with the LM head in int8 (--quant auto on a Q8_0 file); llama.cpp runs the same file.
Reported per N: lattice run seconds (first admission to last completion), aggregate tokens/s, mean
time to first token, decode tokens/s once every request is decoding; llama-batched-bench's T and
S_TG for the same (npp 128, ntg 64, npl N); the ratio of their total times. Goals: N = 16 in <= 1/4
of llama.cpp's time; decode at 16 sequences >= 8x lattice's own single-sequence decode.
llama.cpp is not part of lattice: build it from the llama-cpp-python sdist (its vendor/llama.cpp)
and point LLAMA_CPP_BIN at the folder holding llama-batched-bench; without it only lattice runs.
--preset mixtral-tiny-8x1.1b runs the same workload on the Mixtral-style shape of that name (TinyLlama's
attention and layers, 8 experts top 2 of a quarter of its FFN each: 1.9 B parameters, 0.7 B active per
token), written the way current llama.cpp writes Mixtral (merged ffn_*_exps tensors); N = 1 is decode
alone, N = 16 the 16-request batch.
Usage: benchmarks/bench_batch.py [--build build] [--out benchmarks/results/cpu-2core-spr]
                                 [--n 1,4,16,64] [--threads 2] [--model FILE.gguf]
                                 [--preset tinyllama-1.1b | mixtral-tiny-8x1.1b]
Writes batch.json (batch_<preset>.json for another preset; all numbers, machine, commit) and prints a
markdown table."""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

from bench_common import machine_info, sh

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)


def llama_batched(binary, model, n, threads):
    p = sh([binary, "-m", model, "-t", str(threads), "-c", str(max(4096, n * 192 + 256)), "-b", "2048", "-ub", "512",
            "-npp", "128", "-ntg", "64", "-npl", str(n)], timeout=3600)
    for line in p.stdout.splitlines() + p.stderr.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 10 and cells[0] == "128" and cells[2] == str(n):
            return {"T_PP_s": float(cells[4]), "S_PP": float(cells[5]), "T_TG_s": float(cells[6]),
                    "S_TG": float(cells[7]), "T_s": float(cells[8]), "S": float(cells[9])}
    raise RuntimeError(f"llama-batched-bench gave no row for npl {n}: {p.stderr[-400:]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(root, "build"))
    ap.add_argument("--out", default=os.path.join(root, "benchmarks", "results", "cpu-2core-spr"))
    ap.add_argument("--n", default="1,4,16,64")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--preset", default="tinyllama-1.1b", choices=["tinyllama-1.1b", "mixtral-tiny-8x1.1b"],
                    help="shape of the random GGUF written when --model does not exist")
    ap.add_argument("--model", default="")
    ap.add_argument("--dtype", default="", choices=["", "f32", "bf16"],
                    help="lattice's --dtype (a float checkpoint on the CPU: bf16 runs its linears in bf16 pairs)")
    ap.add_argument("--tag", default="", help="suffix of the JSON file's name (batch{tag}.json)")
    a = ap.parse_args()
    if not a.model:
        a.model = os.path.join(os.environ.get("LATTICE_BENCH_CACHE", "/tmp/lattice-bench"), f"{a.preset}.q8_0.gguf")
    lattice = os.path.join(a.build, "launch", "lattice")
    if not os.path.exists(a.model):
        os.makedirs(os.path.dirname(a.model), exist_ok=True)
        vocab = os.path.join(root, "..", "shared", "tokenizers", "ggml-vocab-llama-spm.gguf")
        print(f"writing {a.model} (random {a.preset} weights, q8_0) ...", file=sys.stderr)
        subprocess.run([sys.executable, os.path.join(here, "tools", "make_random_gguf.py"), "--preset",
                        a.preset, "--type", "q8_0", "--seed", "1", "--vocab-from", vocab, "--out", a.model],
                       check=True)
    llama_bin = os.environ.get("LLAMA_CPP_BIN", "")
    batched = os.path.join(llama_bin, "llama-batched-bench") if llama_bin else ""
    rows = []
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as tmp:
        for n in [int(x) for x in a.n.split(",")]:
            inp, out, stats = (os.path.join(tmp, f"{k}{n}.json{'l' if k != 's' else ''}") for k in ("in", "out", "s"))
            with open(inp, "w") as f:
                for i in range(n):
                    ids = [rng.randrange(3, 32000) for _ in range(128)]
                    f.write(json.dumps({"custom_id": i, "body": {"prompt": ids, "max_tokens": 64, "ignore_eos": True,
                                                                 "temperature": 0}}) + "\n")
            load_before = os.getloadavg()  # the machine may be shared: each row says what else ran
            t0 = time.time()
            p = sh([lattice, "batch", "--model", a.model, "--input", inp, "--output", out, "--threads",
                    str(a.threads), "--stats-json", stats, "--progress", "none", "--max-seq", "256"]
                   + (["--dtype", a.dtype] if a.dtype else []), timeout=3600)
            wall = time.time() - t0
            if p.returncode != 0:
                sys.exit(f"lattice batch failed for N={n}: {p.stderr[-500:]}")
            s = json.load(open(stats))
            row = {"n": n, "lattice": {k: s[k] for k in ("run_seconds", "tokens_per_s", "decode_tokens_per_s",
                                                         "ttft_mean_s", "ttft_p50_s", "load_seconds", "generated_tokens",
                                                         "preemptions", "peak_kv_blocks", "quant")},
                   "lattice_wall_s": wall, "load_avg_before": list(load_before)}
            if batched and os.path.exists(batched):
                row["load_avg_before_llama_cpp"] = list(os.getloadavg())
                row["llama_cpp"] = llama_batched(batched, a.model, n, a.threads)
                row["time_ratio_lattice_to_llama"] = s["run_seconds"] / row["llama_cpp"]["T_s"]
            rows.append(row)
            print(f"N={n}: {json.dumps(row)}", file=sys.stderr)
    one = next((r for r in rows if r["n"] == 1), None)
    for r in rows:
        if one and one["lattice"]["decode_tokens_per_s"] > 0:
            r["decode_vs_single"] = r["lattice"]["decode_tokens_per_s"] / one["lattice"]["decode_tokens_per_s"]
    doc = {"benchmark": "batch", "model": os.path.basename(a.model.rstrip("/")), "dtype": a.dtype or "default",
           "threads": a.threads,
           "workload": "N requests x (128 prompt + 64 new tokens)", "machine": machine_info(root), "rows": rows,
           "llama_cpp_bin": llama_bin or None}
    os.makedirs(a.out, exist_ok=True)
    name = ("batch" if a.preset == "tinyllama-1.1b" else f"batch_{a.preset}") + a.tag + ".json"
    with open(os.path.join(a.out, name), "w") as f:
        json.dump(doc, f, indent=2)
    print("| N | lattice s | tok/s | TTFT mean s | decode tok/s | decode / N=1 | llama.cpp s | llama.cpp S_TG | "
          "lattice / llama.cpp time |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        l, c = r["lattice"], r.get("llama_cpp")
        print(f"| {r['n']} | {l['run_seconds']:.2f} | {l['tokens_per_s']:.1f} | {l['ttft_mean_s']:.2f} | "
              f"{l['decode_tokens_per_s']:.1f} | {r.get('decode_vs_single', 0):.2f} | "
              f"{c['T_s'] if c else '-'} | {c['S_TG'] if c else '-'} | "
              f"{r.get('time_ratio_lattice_to_llama', float('nan')):.3f} |")


if __name__ == "__main__":
    main()
