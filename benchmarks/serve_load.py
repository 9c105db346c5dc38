#!/usr/bin/env python3
"""Serving load: `lattice serve` (and, beside it in the same run, llama.cpp's llama-server) under C
concurrent streaming clients.

Workload: C = 1, 4, 16, 64 clients, each sending R requests one after the other (default 2) of
128 random prompt token ids and 64 new tokens (ignore_eos, greedy) to POST /v1/completions with
"stream": true; the model is the TinyLlama-1.1B shape with random weights as a Q8_0 GGUF (made by
benchmarks/tools/make_random_gguf.py as in bench_batch.py), 2 threads. lattice runs it W8A8 (--quant auto
on a Q8_0 file); llama-server runs the same file with C parallel slots.
Reported per C: aggregate generated tokens/s (all tokens / wall time of the level), p50 and p99 time to
first token (request sent -> first chunk with a token), p50 and p99 inter-token latency (the gap before
each token; tokens arriving in one chunk after the first have 0), failed requests. Goal: at C = 16 lattice's aggregate
tokens/s >= 2x llama-server's, and its p99 inter-token latency no worse.
llama.cpp is not part of lattice: build it from the llama-cpp-python sdist (vendor/llama.cpp) and point
LLAMA_CPP_BIN at the folder holding llama-server; without it only lattice runs.
Every server binds 127.0.0.1 on a free port and is killed (process group) however the script ends.
Usage: benchmarks/serve_load.py [--build build] [--out benchmarks/results/cpu-2core-spr]
                                [--clients 1,4,16,64] [--requests 2] [--prompt-tokens 128]
                                [--max-tokens 64] [--threads 2] [--model FILE.gguf]
                                [--lattice-args '--max-batch-tokens 32'] [--llama-args '--poll 0']
                                [--no-lattice] [--name serve]
Writes NAME.json (default serve.json: all numbers, machine, commit) and prints a markdown table."""
import argparse
import atexit
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
sys.path.insert(0, here)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from bench_common import machine_info  # noqa: E402  (one home for the machine description)

procs = []


@atexit.register
def cleanup():
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.wait(timeout=30)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd, port, ready_path, limit=600):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    procs.append(p)
    err = []
    threading.Thread(target=lambda: err.extend(p.stderr), daemon=True).start()
    deadline = time.time() + limit
    while time.time() < deadline and p.poll() is None:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("GET", ready_path)
            if c.getresponse().status == 200:
                return p
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{cmd[0]} did not become ready: {''.join(err[-20:])}")


def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)


def one_request(port, body):
    """(ttft_s, [inter-token gaps], tokens) of one streamed completion; raises on failure."""
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:200]}")
    ttft, gaps, tokens, last = None, [], 0, None
    for line in r:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        ch = json.loads(line[6:])
        if not ch.get("choices"):
            continue
        choice = ch["choices"][0]
        n = len(choice.get("token_ids") or []) or (1 if choice.get("text") else 0)
        if n == 0:
            continue
        now = time.perf_counter()
        if ttft is None:
            ttft = now - t0
            gaps += [0.0] * (n - 1)  # several tokens in one chunk came together
        else:
            gaps += [now - last] + [0.0] * (n - 1)
        tokens += n
        last = now
    c.close()
    if ttft is None:
        raise RuntimeError("no token came")
    return ttft, gaps, tokens


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def level(port, clients, requests, prompts, max_tokens, extra):
    ttfts, gaps, tokens, failed = [], [], [0], [0]
    lock = threading.Lock()

    def client(i):
        for k in range(requests):
            body = dict({"prompt": prompts[(i * requests + k) % len(prompts)], "max_tokens": max_tokens,
                         "temperature": 0, "ignore_eos": True, "stream": True}, **extra)
            try:
                t, g, n = one_request(port, body)
                with lock:
                    ttfts.append(t)
                    gaps.extend(g)
                    tokens[0] += n
            except (OSError, RuntimeError, ValueError) as e:
                with lock:
                    failed[0] += 1
                print(f"  request failed: {e}", file=sys.stderr)

    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"clients": clients, "requests": clients * requests, "failed": failed[0], "tokens": tokens[0],
            "wall_s": wall, "tokens_per_s": tokens[0] / wall, "ttft_p50_s": pct(ttfts, 0.5),
            "ttft_p99_s": pct(ttfts, 0.99), "itl_p50_s": pct(gaps, 0.5), "itl_p99_s": pct(gaps, 0.99),
            "load_1min_before": load0, "load_1min_after": os.getloadavg()[0]}  # the machine is shared


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(root, "build"))
    ap.add_argument("--out", default=os.path.join(root, "benchmarks", "results", "cpu-2core-spr"))
    ap.add_argument("--clients", default="1,4,16,64")
    ap.add_argument("--requests", type=int, default=2, help="requests per client, one after the other")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=32000, help="prompt ids are drawn from [3, vocab)")
    ap.add_argument("--lattice-args", default="", help="extra `lattice serve` flags, e.g. '--max-batch-tokens 32'")
    ap.add_argument("--llama-args", default="", help="extra llama-server flags, e.g. '--poll 0'")
    ap.add_argument("--no-lattice", action="store_true", help="run llama-server only")
    ap.add_argument("--name", default="serve", help="result file NAME.json (a variant keeps the main run's file)")
    ap.add_argument("--model", default=os.path.join(os.environ.get("LATTICE_BENCH_CACHE", "/tmp/lattice-bench"),
                                                    "tinyllama-1.1b.q8_0.gguf"))
    a = ap.parse_args()
    if not os.path.exists(a.model):
        os.makedirs(os.path.dirname(a.model), exist_ok=True)
        vocab = os.path.join(root, "..", "shared", "tokenizers", "ggml-vocab-llama-spm.gguf")
        print(f"writing {a.model} (random TinyLlama-1.1B weights, q8_0) ...", file=sys.stderr)
        subprocess.run([sys.executable, os.path.join(here, "tools", "make_random_gguf.py"), "--preset",
                        "tinyllama-1.1b", "--type", "q8_0", "--seed", "1", "--vocab-from", vocab, "--out", a.model],
                       check=True)
    levels = [int(x) for x in a.clients.split(",")]
    rng = random.Random(7)
    prompts = [[rng.randrange(3, a.vocab) for _ in range(a.prompt_tokens)] for _ in range(256)]
    ctx = a.prompt_tokens + a.max_tokens + 16
    rows = {}

    port = free_port()
    lattice = [os.path.join(a.build, "launch", "lattice"), "serve", "--model", a.model, "--threads", str(a.threads),
               "--port", str(port), "--max-seq", str(ctx), "--max-seqs", str(max(levels)),
               "--max-queue", str(max(levels) * 2)] + a.lattice_args.split()
    if not a.no_lattice:
        p = start(lattice, port, "/health")
        rows["lattice"] = []
        for c in levels:
            r = level(port, c, a.requests, prompts, a.max_tokens, {"return_token_ids": True})
            rows["lattice"].append(r)
            print(f"lattice C={c}: {json.dumps(r)}", file=sys.stderr)
        stop(p)

    llama_bin = os.environ.get("LLAMA_CPP_BIN", "")
    server = os.path.join(llama_bin, "llama-server") if llama_bin else ""
    if server and os.path.exists(server):
        rows["llama_server"] = []
        for c in levels:  # slots are fixed at start: one server per level
            port = free_port()
            p = start([server, "-m", a.model, "-t", str(a.threads), "--host", "127.0.0.1", "--port", str(port),
                       "-np", str(c), "-c", str(ctx * c), "--no-webui"] + a.llama_args.split(), port, "/health")
            r = level(port, c, a.requests, prompts, a.max_tokens, {})
            rows["llama_server"].append(r)
            print(f"llama-server C={c}: {json.dumps(r)}", file=sys.stderr)
            stop(p)

    doc = {"benchmark": "serve", "model": os.path.basename(a.model), "threads": a.threads,
           "workload": f"C clients x {a.requests} streamed requests of {a.prompt_tokens} prompt + {a.max_tokens} "
                       "new tokens", "lattice_args": a.lattice_args, "llama_args": a.llama_args, "machine": machine_info(root), "rows": rows, "llama_cpp_bin": llama_bin or None}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, a.name + ".json"), "w") as f:
        json.dump(doc, f, indent=2)
    print("| server | C | tok/s | TTFT p50 s | TTFT p99 s | ITL p50 ms | ITL p99 ms | failed | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, rs in rows.items():
        for r in rs:
            print(f"| {name} | {r['clients']} | {r['tokens_per_s']:.1f} | {r['ttft_p50_s']:.2f} | {r['ttft_p99_s']:.2f} "
                  f"| {r['itl_p50_s'] * 1e3:.1f} | {r['itl_p99_s'] * 1e3:.1f} | {r['failed']} "
                  f"| {r['load_1min_before']:.1f}-{r['load_1min_after']:.1f} |")
    if "llama_server" in rows and "lattice" in rows:
        for l, s in zip(rows["lattice"], rows["llama_server"]):
            print(f"C={l['clients']}: lattice / llama-server tok/s {l['tokens_per_s'] / s['tokens_per_s']:.2f}, "
                  f"ITL p99 {l['itl_p99_s'] / s['itl_p99_s']:.2f}")


if __name__ == "__main__":
    main()
