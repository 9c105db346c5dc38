#!/usr/bin/env python3
"""Single-sequence decode of 4-bit GGUF files: lattice with default flags (`lattice generate`, so --quant auto:
W4A8 from the Q4 blocks, the LM head int8 unless the file holds it in 4 bits) against llama.cpp's llama-bench
on the same file, in the same run, rounds interleaved (lattice, llama.cpp, lattice, ...) so a busy spell of a
shared VM hits both alike.

Models (default): the built-in SmolLM2-135M-Instruct Q4_1 GGUF (models/; its token embedding / tied head is
Q8_0) and the TinyLlama-1.1B shape with random weights in Q4_0 and in Q4_1 (every matrix, head included;
benchmarks/tools/make_random_gguf.py, Llama 2 vocab from ../shared), made on first use in --cache;
tinyllama-1.1b-q4_k_m (not default): llama-quantize's Q4_K_M mix of the Q8_0 one (Q4_K, Q6_K for attn_v /
ffn_down of some layers and the head).
Per model and round: decode tok/s of both; lattice's streamed weight bytes per token (--stats-json
streamed_weight_bytes_per_rank) and the KV bytes the last step read (f32 K and V of every position); the read
bandwidth of the same thread count (bench_decode's 1 GiB stream read, measured in the same round); the floor
time per token = bytes / bandwidth and the share of it lattice reaches; the 1-minute load average before
each run (the machine is shared: the table says how busy it was). Beside the wall-clock rates, the CPU time
per decoded token of each (getrusage of the child, user + system, a short run of --short-tokens subtracted from
the full one so that loading and prefill cancel): on a shared VM wall clock measures the neighbours as much as
the engines, and a spin-waiting thread pool (llama.cpp's) loses more of it than lattice's; CPU time per token
is the work each engine does for a token (spinning included), much less sensitive to the load.
llama.cpp is not part of lattice: build llama-bench from the llama-cpp-python sdist
(`pip download --no-binary :all: llama-cpp-python`, its vendor/llama.cpp, cmake -DGGML_NATIVE=ON) and pass
--llama-bench (or LLAMA_CPP_BIN=folder); without it only lattice runs.
Usage: benchmarks/bench_int4_decode.py [--build build] [--llama-bench PATH] [--models builtin,tinyllama-q4_0,...]
                                       [--rounds 3] [--tokens 128] [--short-tokens 16] [--threads 2] [--out DIR]
                                       [--cache DIR] [--busy N]
--busy N keeps N CPU-bound processes running beside both engines (a shared machine's neighbours).
The file's bytes per token (every tensor but the token embedding, read from the GGUF header) stand beside
lattice's streamed bytes.
Writes int4_decode.json (or --name .json: every run, the medians, machine, commit) into --out and prints a
markdown table."""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from bench_common import machine_info, sh

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)


def model_files(names, cache, quantize):
    """name -> GGUF path; synthetic files are written on first use. A K-quant mix (tinyllama-1.1b-q4_k_m) is
    llama.cpp's llama-quantize of the synthetic Q8_0 file (the --llama-bench folder's llama-quantize)."""
    out = {}
    for name in names:
        if name == "builtin":
            out[name] = os.path.join(root, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
            continue
        preset, qtype = name.rsplit("-", 1)
        path = os.path.join(cache, f"{preset}.{qtype}.gguf")
        if not os.path.exists(path) and qtype.startswith("q") and "_k" in qtype:
            src = model_files([f"{preset}-q8_0"], cache, quantize)[f"{preset}-q8_0"]
            if not quantize:
                sys.exit(f"{name}: made by llama.cpp's llama-quantize, which was not found beside --llama-bench")
            p = sh([quantize, "--allow-requantize", src, path, qtype.upper()])
            if p.returncode != 0:
                sys.exit(f"llama-quantize failed for {name}: {p.stderr[-500:]}")
        if not os.path.exists(path):
            os.makedirs(cache, exist_ok=True)
            vocab = os.path.join(os.path.dirname(root), "shared", "tokenizers", "ggml-vocab-llama-spm.gguf")
            p = sh([sys.executable, os.path.join(here, "tools", "make_random_gguf.py"), "--preset", preset, "--type",
                    qtype, "--seed", "1", "--vocab-from", vocab, "--out", path])
            if p.returncode != 0:
                sys.exit(f"make_random_gguf.py failed for {name}: {p.stderr[-500:]}")
        out[name] = path
    return out


# ggml type -> (block bytes, block elements) of the types these files hold.
GGML_BLOCKS = {0: (4, 1), 1: (2, 1), 2: (18, 32), 3: (20, 32), 6: (22, 32), 7: (24, 32), 8: (34, 32), 12: (144, 256),
               13: (176, 256), 14: (210, 256), 30: (2, 1)}


def gguf_token_bytes(path):
    """Bytes of the file's tensors a decode step reads: all but the token embedding, which one row of is read
    (unless the file has no output.weight: then the embedding is the LM head and read whole)."""
    import struct
    with open(path, "rb") as f:
        rd = lambda fmt: struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]
        rstr = lambda: f.read(rd("Q")).decode()
        scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

        def skip(t):
            if t == 8:
                rstr()
            elif t == 9:
                et, n = rd("I"), rd("Q")
                for _ in range(n):
                    skip(et)
            else:
                rd(scalar[t])
        assert f.read(4) == b"GGUF"
        rd("I")
        n_tensors, n_kv = rd("Q"), rd("Q")
        for _ in range(n_kv):
            rstr()
            skip(rd("I"))
        sizes = {}
        for _ in range(n_tensors):
            name = rstr()
            dims = [rd("Q") for _ in range(rd("I"))]
            t = rd("I")
            rd("Q")
            n = 1
            for d in dims:
                n *= d
            bb, be = GGML_BLOCKS[t]
            sizes[name] = n // be * bb
    total = sum(sizes.values())
    return total if "output.weight" not in sizes else total - sizes.get("token_embd.weight", 0)


def cpu_seconds(fn):
    """fn()'s result and the CPU seconds (user + system) its child processes used."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = fn()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return out, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def run_lattice(build, path, tokens, threads):
    with tempfile.TemporaryDirectory() as tmp:
        stats = os.path.join(tmp, "stats.json")
        p = sh([os.path.join(build, "launch", "lattice"), "generate", "--model", path, "--prompt-ids", "1,450,4955",
                "--max-new-tokens", str(tokens), "--ignore-eos", "--threads", str(threads), "--stats-json", stats],
               timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"lattice generate failed: {p.stderr[-500:]}")
        s = json.load(open(stats))
    return {"decode_tokens_per_s": s["decode_tokens_per_s"], "quant": s["quant"], "quant_head": s["quant_head"],
            "streamed_weight_bytes": s["streamed_weight_bytes_per_rank"], "backend": s["backend"],
            "generated_tokens": s["generated_tokens"]}


def run_bench_decode(build, path, tokens, threads):
    """bench_decode on the same file: the read bandwidth of `threads` threads and the KV bytes of the last step."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "d.json")
        p = sh([os.path.join(build, "benchmarks", "bench_decode"), "--model", path, "--quant", "auto", "--prompt", "3",
                "--decode", str(tokens), "--threads", str(threads), "--json", out], timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"bench_decode failed: {p.stderr[-500:]}")
        return json.load(open(out))


def run_llama(binary, path, tokens, threads):
    p = sh([binary, "-m", path, "-p", "0", "-n", str(tokens), "-t", str(threads), "-r", "1", "-o", "json"],
           timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"llama-bench failed: {p.stderr[-500:]}")
    rows = json.loads(p.stdout)
    row = next(r for r in rows if r.get("n_gen") == tokens)
    return {"decode_tokens_per_s": row["avg_ts"], "model_type": row.get("model_type"),
            "model_size": row.get("model_size"), "build_commit": row.get("build_commit")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(root, "build"))
    ap.add_argument("--llama-bench", default=os.path.join(os.environ.get("LLAMA_CPP_BIN", ""), "llama-bench"))
    ap.add_argument("--models", default="builtin,tinyllama-1.1b-q4_0,tinyllama-1.1b-q4_1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--short-tokens", type=int, default=16, help="the short run whose CPU time is subtracted")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(root, "benchmarks", "results", "cpu-2core-epyc-zen4"))
    ap.add_argument("--cache", default=os.environ.get("LATTICE_BENCH_CACHE", "/tmp/lattice-bench"))
    ap.add_argument("--name", default="int4_decode", help="the JSON file's name in --out (without .json)")
    ap.add_argument("--busy", type=int, default=0,
                    help="CPU-bound processes (`yes > /dev/null`) kept running beside both engines for the whole run")
    a = ap.parse_args()
    busy = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(a.busy)]
    try:
        run_all(a)
    finally:
        for b in busy:
            b.kill()
            b.wait()


def run_all(a):
    llama = a.llama_bench if os.path.isfile(a.llama_bench) else None
    if not llama:
        print(f"llama-bench not found ({a.llama_bench}): lattice only", file=sys.stderr)
    quantize = os.path.join(os.path.dirname(a.llama_bench), "llama-quantize")
    files = model_files(a.models.split(","), a.cache, quantize if os.path.isfile(quantize) else None)
    runs = []
    for rnd in range(a.rounds):
        for name, path in files.items():
            load = os.getloadavg()[0]
            d = run_bench_decode(a.build, path, a.tokens, a.threads)
            lat, cpu = cpu_seconds(lambda: run_lattice(a.build, path, a.tokens, a.threads))
            _, cpu_short = cpu_seconds(lambda: run_lattice(a.build, path, a.short_tokens, a.threads))
            lat["load_1min"] = load
            lat["cpu_ms_per_token"] = 1e3 * (cpu - cpu_short) / (a.tokens - a.short_tokens)
            ref = None
            if llama:
                load_ref = os.getloadavg()[0]
                ref, cpu = cpu_seconds(lambda: run_llama(llama, path, a.tokens, a.threads))
                _, cpu_short = cpu_seconds(lambda: run_llama(llama, path, a.short_tokens, a.threads))
                ref["load_1min"] = load_ref
                ref["cpu_ms_per_token"] = 1e3 * (cpu - cpu_short) / (a.tokens - a.short_tokens)
            runs.append({"round": rnd, "model": name, "file": path, "lattice": lat, "llama_cpp": ref,
                         "read_bw_gb_per_s": d["memory_bandwidth_gb_per_s"], "kv_bytes_last_step": d["kv_bytes_last_step"],
                         "bench_decode_tokens_per_s": d["decode_tokens_per_s"], "time": time.time()})
            print(f"round {rnd} {name}: lattice {lat['decode_tokens_per_s']:.1f} tok/s, {lat['cpu_ms_per_token']:.2f} "
                  "CPU ms/token"
                  + (f", llama.cpp {ref['decode_tokens_per_s']:.1f} tok/s, {ref['cpu_ms_per_token']:.2f} CPU ms/token"
                     if ref else "")
                  + f" (load {load:.1f})", file=sys.stderr, flush=True)
    summary = []
    print("| model | lattice quant | streamed MiB/token (weights + KV at the end) | file's MiB/token (lattice / file) "
          "| read GB/s | lattice tok/s | llama.cpp tok/s | lattice / llama.cpp | share of the floor | "
          "CPU ms/token lattice / llama.cpp (ratio) | load (1 min) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in files:
        rs = [r for r in runs if r["model"] == name]
        lt = [r["lattice"]["decode_tokens_per_s"] for r in rs]
        lc = [r["llama_cpp"]["decode_tokens_per_s"] for r in rs if r["llama_cpp"]]
        ratio = [r["lattice"]["decode_tokens_per_s"] / r["llama_cpp"]["decode_tokens_per_s"] for r in rs
                 if r["llama_cpp"]]
        wb = rs[0]["lattice"]["streamed_weight_bytes"]
        # Share of the floor: a token needs (weights + the average KV read) / bandwidth at best.
        share = [r["lattice"]["decode_tokens_per_s"] * (wb + r["kv_bytes_last_step"] / 2) / (r["read_bw_gb_per_s"] * 1e9)
                 for r in rs]
        loads = [r["lattice"]["load_1min"] for r in rs] + [r["llama_cpp"]["load_1min"] for r in rs if r["llama_cpp"]]
        cl = statistics.median(r["lattice"]["cpu_ms_per_token"] for r in rs)
        cc = statistics.median(r["llama_cpp"]["cpu_ms_per_token"] for r in rs) if lc else None
        fb = gguf_token_bytes(files[name])
        s = {"model": name, "quant": rs[0]["lattice"]["quant"] + ("+head" if rs[0]["lattice"]["quant_head"] else ""),
             "streamed_weight_bytes": wb, "file_token_bytes": fb, "kv_bytes_last_step": rs[0]["kv_bytes_last_step"],
             "read_bw_gb_per_s_median": statistics.median(r["read_bw_gb_per_s"] for r in rs),
             "lattice_tokens_per_s_median": statistics.median(lt),
             "llama_cpp_tokens_per_s_median": statistics.median(lc) if lc else None,
             "ratio_median": statistics.median(ratio) if ratio else None, "ratio_per_round": ratio,
             "share_of_floor_median": statistics.median(share), "load_1min": [min(loads), max(loads)],
             "lattice_cpu_ms_per_token_median": cl, "llama_cpp_cpu_ms_per_token_median": cc,
             "cpu_time_ratio_median": cc / cl if cc else None}
        summary.append(s)
        fmt = lambda v, f: "-" if v is None else format(v, f)
        print(f"| {name} | {s['quant']} | {wb / 2**20:.1f} + {s['kv_bytes_last_step'] / 2**20:.1f} | "
              f"{fb / 2**20:.1f} ({wb / fb:.3f}) | {s['read_bw_gb_per_s_median']:.1f} | {s['lattice_tokens_per_s_median']:.1f} | "
              f"{fmt(s['llama_cpp_tokens_per_s_median'], '.1f')} | {fmt(s['ratio_median'], '.2f')} "
              f"({', '.join(format(x, '.2f') for x in ratio)}) | {s['share_of_floor_median']:.2f} | "
              f"{cl:.2f} / {fmt(cc, '.2f')} ({fmt(s['cpu_time_ratio_median'], '.2f')}) | "
              f"{min(loads):.1f}-{max(loads):.1f} |")
    os.makedirs(a.out, exist_ok=True)
    out = os.path.join(a.out, a.name + ".json")
    json.dump({"bench": "int4_decode", "machine": machine_info(root), "tokens": a.tokens, "short_tokens": a.short_tokens,
               "threads": a.threads, "busy_processes": a.busy, "date": time.strftime("%Y-%m-%d %H:%M %Z"),
               "rounds": a.rounds, "llama_bench": llama, "summary": summary, "runs": runs}, open(out, "w"), indent=2)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
