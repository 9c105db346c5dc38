#!/usr/bin/env python3
"""lattice benchmarks: one entry point, one output schema, plots (docs/benchmarks.md).

  benchmarks/run.py gemm       [--full] [--threads N] [--shapes NxK,...]      CPU int8 GEMM (+ GPU if any)
  benchmarks/run.py allreduce  [--np 2,4] [--min-bytes 4] [--max-bytes 256M]  MpiComm all-reduce sweep
  benchmarks/run.py attention  [--contexts ..] [--batches ..]                 CPU paged decode attention
  benchmarks/run.py tplinear   [--np 1,2] [--config tinyllama-1.1b] [--tokens 30]  TP linears' ceiling
  benchmarks/run.py e2e        [--layouts 1x1,2x1,1x2] [--batch 1,4,16] [--prompts 64,256]
                               [--model PATH | --preset tinyllama-1.1b] [--quant w8a8] [--max-new-tokens 16]
  benchmarks/run.py sim        [--layouts 8x1,4x2,2x4,1x8] [--requests 64] [--prompt 512] [--max-new-tokens 128]
                               [--preset llama-2-70b] [--sim-gpu a100-pcie-40gb] [--sim-link pcie4]
                               `lattice batch --device sim` per layout beside `lattice plan`'s prediction
  benchmarks/run.py all        gemm, allreduce, attention and e2e with their defaults
  benchmarks/run.py plot DIR   PNGs from DIR/results.jsonl into DIR/plots/
Common options (after the sub-benchmark): --build DIR (default build), --out DIR (default
bench-results), --plot (render the plots after the run), --label TEXT (stored with every point).

Every measured point is appended as one JSON line to OUT/results.jsonl, one schema for all:
  {"schema": "lattice-bench/1", "bench", "run_id", "label", "params", "results", "ceilings",
   "machine", "versions", "git_commit", "time"}
(see docs/benchmarks.md for each bench's params/results). The C++ benches' own JSON (and e2e's raw
--stats-json) is kept under OUT/raw/. Tables are printed as markdown. Nothing here asserts speed;
a failed run is reported and makes the exit status non-zero, the other points still run.
matplotlib is only needed by `plot` (scripts/setup.sh --bench installs it into .venv/)."""
import argparse
import datetime
import json
import os
import platform
import re
import shlex
import statistics
import shutil
import subprocess
import sys
import time
import uuid

from bench_common import cores, first_line, log, machine_info, mpirun_prefix, sh

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCHEMA = "lattice-bench/1"
DEFAULT_PRESET = "tinyllama-1.1b"
PRESET_VOCAB = {"tinyllama-1.1b": 32000, "llama-2-7b": 32000, "llama-2-13b": 32000, "llama-2-70b": 32000,
                "llama-3-8b": 128256, "llama-3-70b": 128256, "mixtral-8x7b": 32000, "mixtral-tiny-8x1.1b": 32000}


def compiler_version(build):
    try:
        cache = open(os.path.join(build, "CMakeCache.txt")).read()
        cxx = re.search(r"^CMAKE_CXX_COMPILER:\w+=(.*)$", cache, re.M).group(1).strip()
        return first_line(sh([cxx, "--version"], timeout=30).stdout)
    except (OSError, AttributeError):
        return None


def version_info(args):
    lattice = lattice_bin(args)
    v = {"lattice": first_line(sh([lattice, "--version"], timeout=30).stdout) or None,
         "compiler": compiler_version(args.build),
         "mpirun": first_line(sh(["mpirun", "--version"], timeout=30).stdout) or None,
         "python": platform.python_version()}
    v["git_dirty"] = bool(sh(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"], timeout=30).stdout.strip())
    return v


class Recorder:
    """Appends schema lines to OUT/results.jsonl (one write per line: concurrent Slurm array tasks
    append to the same file safely) and remembers what it wrote for the tables."""

    def __init__(self, args):
        self.args = args
        self.out = args.out
        os.makedirs(os.path.join(self.out, "raw"), exist_ok=True)
        self.path = os.path.join(self.out, "results.jsonl")
        self.run_id = uuid.uuid4().hex[:12]
        self.machine = machine_info()
        self.versions = version_info(args)
        self.commit = sh(["git", "-C", ROOT, "rev-parse", "HEAD"], timeout=30).stdout.strip() or None
        self.failures = 0
        self.count = 0

    def raw(self, name):
        return os.path.join(self.out, "raw", f"{name}-{self.run_id}.json")

    def emit(self, bench, params, results, ceilings):
        rec = {"schema": SCHEMA, "bench": bench, "run_id": self.run_id, "label": self.args.label,
               "params": params, "results": results, "ceilings": ceilings, "machine": self.machine,
               "versions": self.versions, "git_commit": self.commit,
               "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        line = (json.dumps(rec, sort_keys=False) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        self.count += 1
        return rec

    def fail(self, what, proc=None):
        self.failures += 1
        log(f"run.py: FAILED: {what}")
        if proc is not None:
            tail = (proc.stderr or "")[-2000:] or (proc.stdout or "")[-2000:]
            log("  | " + tail.rstrip().replace("\n", "\n  | "))


def table(title, headers, rows):
    print(f"\n### {title}\n")
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
    sys.stdout.flush()


def f(x, nd=2):
    return "-" if x is None else f"{x:.{nd}f}"


def binary(args, rel):
    return os.path.join(args.build, rel)


def lattice_bin(args):
    return args.lattice or binary(args, "launch/lattice")


def run_logged(cmd, timeout, env=None):
    log("run.py: $ " + " ".join(shlex.quote(c) for c in cmd))
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(cmd, 124, e.stdout or "", f"timed out after {timeout} s")
    except OSError as e:
        return subprocess.CompletedProcess(cmd, 127, "", str(e))


def mpi_env():
    env = dict(os.environ)
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    return env


def launcher_prefix(spec, np_, tp, pp):
    """mpirun (default), srun, or a template with {np} {tp} {pp}, e.g. 'lattice-mpirun --tp {tp} --pp {pp} --'."""
    if spec in (None, "", "mpirun"):
        return mpirun_prefix(np_)
    if spec == "srun":
        return ["srun", "--mpi=pmix", f"--ntasks={np_}", "--kill-on-bad-exit=1"]
    return shlex.split(spec.format(np=np_, tp=tp, pp=pp))


def need(path, what):
    if not os.path.exists(path):
        raise SystemExit(f"run.py: {what} not found at {path} (build it: cmake --build {os.path.dirname(path)} "
                         f"--target {os.path.basename(path)}, or pass --build DIR)")


def parse_size(s):
    m = re.fullmatch(r"(\d+)\s*([KMG]?)B?", s.strip(), re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"{s}: not a size (e.g. 4, 64K, 256M)")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def int_list(s, least=1):
    try:
        v = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s}: not a comma-separated list of integers")
    if not v or min(v) < least:
        raise argparse.ArgumentTypeError(f"{s}: integers >= {least} expected")
    return v


def layout_list(s):
    out = []
    for x in s.replace(" ", ",").split(","):
        if not x:
            continue
        m = re.fullmatch(r"(\d+)x(\d+)", x)
        if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
            raise argparse.ArgumentTypeError(f"layout {x!r} is not TPxPP (e.g. 2x1)")
        out.append((int(m.group(1)), int(m.group(2))))
    if not out:
        raise argparse.ArgumentTypeError("no layouts")
    return out


# ---- gemm -------------------------------------------------------------------------------------

def bench_gemm(args, rec):
    exe = binary(args, "benchmarks/bench_gemm_int8")
    need(exe, "bench_gemm_int8")
    raw = rec.raw("gemm_int8")
    cmd = [exe, "--json", raw] + (["--full"] if args.full else []) + (["--threads", str(args.threads)] if args.threads else [])
    cmd += ["--shapes", args.shapes] if args.shapes else []
    p = run_logged(cmd, args.timeout)
    if p.returncode != 0:
        rec.fail("bench_gemm_int8", p)
    else:
        j = json.load(open(raw))
        ceil = {"int8_peak_gops_core": j.get("int8_peak_gops_core"), "int8_peak_gops_all": j.get("int8_peak_gops_all"),
                "int8_peak_kind": j.get("int8_peak_kind"), "read_bw_gbs_core": j.get("mem_bw_gbs_core"),
                "read_bw_gbs_all": j.get("mem_bw_gbs_all_wall")}
        rows = []
        for r in j["results"]:
            params = {k: r[k] for k in ("isa", "mode", "kind", "m", "n", "k")}
            params.update(threads=j["threads"], best_isa=j["best_isa"], device="cpu")
            res = {k: r[k] for k in r if k not in params}
            rec.emit("gemm", params, res, ceil)
            rows.append([r["isa"], r["mode"], r["kind"], r["m"], f"{r['n']}x{r['k']}", f(r["gops_core"], 1),
                         f(r["pct_peak_core"], 1), f(r["weight_gbs_core"]), f(r["pct_mem_bw_core"], 1),
                         f(r["gops_wall"], 1)])
        table(f"INT8 GEMM (CPU, {j['threads']} threads; peak {f(ceil['int8_peak_gops_core'], 1)} GOP/s per core "
              f"({ceil['int8_peak_kind']}), read {f(ceil['read_bw_gbs_core'])} GB/s per core)",
              ["isa", "mode", "kind", "m", "n x k", "GOP/s core", "% peak", "weight GB/s core", "% read bw",
               "GOP/s wall (all threads)"], rows)
    bench_gpu_gemm(args, rec)


def gpu_present():
    if shutil.which("nvidia-smi"):
        return sh(["nvidia-smi", "-L"], timeout=30).returncode == 0
    return os.path.exists("/dev/nvidia0")


def bench_gpu_gemm(args, rec):
    exe = binary(args, "benchmarks/gpu/bench_gpu_gemm")
    if not os.path.exists(exe):
        print(f"\ngpu gemm: skipped: {exe} is not built (a CUDA build, -DLATTICE_CUDA=ON, builds it)")
        return
    if not gpu_present():
        print("\ngpu gemm: skipped: no CUDA device here (nvidia-smi -L finds none)")
        return
    out = os.path.join(rec.out, "raw", f"gpu-{rec.run_id}")
    p = run_logged([exe, "--out", out] + ([] if args.full else ["--quick"]), args.timeout)
    if p.returncode != 0:
        rec.fail("bench_gpu_gemm", p)
        return
    j = json.load(open(os.path.join(out, "gemm.json")))
    peaks = j.get("peaks", {})
    ceil = {"int8_peak_tops": peaks.get("int8_tops"), "fp16_peak_tflops": peaks.get("fp16_tflops"),
            "hbm_gbs": peaks.get("hbm_gbs"), "peaks_source": peaks.get("model")}
    rows = []
    for r in j["rows"]:
        params = {"kernel": r["kernel"], "m": r["m"], "n": r["n"], "k": r["k"], "device": j.get("gpu"), "sm": j.get("sm")}
        rec.emit("gemm", params, {k: r[k] for k in ("time_us", "tops", "pct_peak", "gbs", "pct_hbm")}, ceil)
        rows.append([r["kernel"], r["m"], f"{r['n']}x{r['k']}", f(r["time_us"], 1), f(r["tops"], 1),
                     f(r["pct_peak"], 1), f(r["gbs"], 0), f(r["pct_hbm"], 1)])
    table(f"GEMM on {j.get('gpu')}", ["kernel", "m", "n x k", "us", "TOPS", "% peak", "GB/s", "% HBM"], rows)


# ---- allreduce --------------------------------------------------------------------------------

def bench_allreduce(args, rec):
    exe = binary(args, "benchmarks/bench_allreduce")
    need(exe, "bench_allreduce")
    for np_ in args.np:
        raw = rec.raw(f"allreduce_np{np_}")
        cmd = mpirun_prefix(np_) + [exe, "--min-bytes", str(args.min_bytes), "--max-bytes", str(args.max_bytes),
                                    "--dtype", args.dtype, "--comm", args.comm, "--json", raw]
        cmd += (["--iters", str(args.iters)] if args.iters else []) + (["--warmup", str(args.warmup)] if args.warmup else [])
        p = run_logged(cmd, args.timeout, env=mpi_env())
        if p.returncode != 0 or not os.path.exists(raw):
            rec.fail(f"bench_allreduce on {np_} ranks", p)
            continue
        j = json.load(open(raw))
        ceil = {"memcpy_gbps": j.get("memcpy_gbps")}
        rows = []
        for r in j["rows"]:
            params = {"ranks": j["ranks"], "bytes": r["bytes"], "count": r["count"], "dtype": j["dtype"],
                      "comm": j["comm"], "iters": r["iters"], "warmup": r.get("warmup")}
            res = {k: r.get(k) for k in ("time_us", "p50_us", "p99_us", "algbw_gbps", "busbw_gbps", "errors")}
            rec.emit("allreduce", params, res, ceil)
            rows.append([r["bytes"], r["iters"], f(r["time_us"], 1), f(r.get("p50_us"), 1), f(r.get("p99_us"), 1),
                         f(r["algbw_gbps"], 3), f(r["busbw_gbps"], 3),
                         f(r["busbw_gbps"] / ceil["memcpy_gbps"], 3) if ceil["memcpy_gbps"] else "-", r["errors"]])
            if r["errors"]:
                rec.fail(f"all-reduce of {r['bytes']} B on {np_} ranks: {r['errors']} wrong elements")
        table(f"all-reduce sum ({j['comm']}, {j['dtype']}, {j['ranks']} ranks; time = max over ranks; "
              f"ceiling memcpy {f(ceil['memcpy_gbps'])} GB/s)",
              ["bytes", "iters", "mean us", "p50 us", "p99 us", "algBw GB/s", "busBw GB/s", "busBw / memcpy",
               "errors"], rows)


# ---- tplinear ---------------------------------------------------------------------------------

def bench_tplinear(args, rec):
    """The tensor-parallel ceiling of decode's linear layers: bench_tp_linear on each rank count, with
    the model's all-reduces and without; speedups are against the 1-rank run of this sweep."""
    exe = binary(args, "benchmarks/bench_tp_linear")
    need(exe, "bench_tp_linear")
    base, rows, cache = {}, [], {}
    for np_ in sorted(set([1] + args.np)):
        ceil = read_ceiling(args, rec, np_, cache)
        for sync in (True, False):
            if np_ == 1 and not sync:
                continue  # one rank has nothing to reduce: the synced run is the baseline of both
            raw = rec.raw(f"tplinear_np{np_}_{'sync' if sync else 'nosync'}")
            cmd = mpirun_prefix(np_) + [exe, "--config", args.config, "--tokens", str(args.tokens), "--json", raw]
            cmd += [] if sync else ["--no-sync"]
            p = run_logged(cmd, args.timeout, env=mpi_env())
            if p.returncode != 0 or not os.path.exists(raw):
                rec.fail(f"bench_tp_linear on {np_} ranks{'' if sync else ' --no-sync'}", p)
                continue
            j = json.load(open(raw))
            if np_ == 1:
                base = j
            speedup = (base["ms_per_token_median"] / j["ms_per_token_median"]) if base else None
            gbs_all = j["gbs_per_rank_median"] * np_
            bw = ceil.get("read_bw_gbs_all_ranks")
            res = {"ms_per_token_median": j["ms_per_token_median"], "ms_per_token_best": j["ms_per_token_best"],
                   "gbs_all_ranks": gbs_all, "speedup_vs_1_rank": speedup,
                   "allreduce_wait_ms_per_rank": j["allreduce_wait_ms_median_per_rank"],
                   "read_bw_ratio": gbs_all / bw if bw else None}
            params = {"config": j["config"], "ranks": np_, "sync": j["sync"], "tokens": j["tokens"],
                      "allreduces_per_token": j["allreduces_per_token"],
                      "weight_bytes_per_rank": j["weight_bytes_per_rank"]}
            rec.emit("tplinear", params, res, ceil)
            rows.append([np_, "yes" if sync else "no", f(j["ms_per_token_median"]), f(j["ms_per_token_best"]),
                         f(speedup), f(gbs_all), f(bw), f(res["read_bw_ratio"]),
                         " ".join(f(w) for w in j["allreduce_wait_ms_median_per_rank"])])
    table(f"{args.config} linears as m = 1 W8A8 GEMVs, 1 thread per rank (median over {args.tokens} tokens; "
          "speedup vs 1 rank; ceiling: bench_stream_mpi on the same rank count)",
          ["ranks", "all-reduces", "ms/token", "best ms", "speedup", "GB/s all", "read ceiling GB/s",
           "of ceiling", "wait ms/token per rank"], rows)


# ---- attention --------------------------------------------------------------------------------

def bench_attention(args, rec):
    exe = binary(args, "benchmarks/bench_attention")
    need(exe, "bench_attention")
    raw = rec.raw("attention")
    cmd = [exe, "--json", raw, "--contexts", ",".join(map(str, args.contexts)),
           "--batches", ",".join(map(str, args.batches)), "--config", args.config, "--min-time", str(args.min_time)]
    cmd += (["--threads", str(args.threads)] if args.threads else []) + (["--hot"] if args.hot else [])
    p = run_logged(cmd, args.timeout)
    if p.returncode != 0:
        rec.fail("bench_attention", p)
        return
    j = json.load(open(raw))
    ceil = {"read_bw_gbs": j["read_bw_gbs"]}
    rows = []
    for r in j["results"]:
        params = {"ctx": r["ctx"], "batch": r["batch"], "n_heads": j["n_heads"], "n_kv_heads": j["n_kv_heads"],
                  "head_dim": j["head_dim"], "block_size": j["block_size"], "mode": j["mode"], "threads": j["threads"],
                  "config": args.config}
        res = {k: r[k] for k in ("seconds", "median_seconds", "kv_bytes", "footprint_bytes", "copies", "kv_gbs",
                                 "gflops", "frac_read_bw")}
        rec.emit("attention", params, res, ceil)
        rows.append([r["ctx"], r["batch"], f(r["kv_bytes"] / 2**20), f(r["seconds"] * 1e6, 1),
                     f(r["kv_gbs"]), f(r["gflops"], 1), f(100 * r["frac_read_bw"], 1)])
    table(f"paged decode attention ({j['backend']}, heads {j['n_heads']}/{j['n_kv_heads']} x {j['head_dim']}, "
          f"{j['mode']}; ceiling stream read {f(ceil['read_bw_gbs'])} GB/s)",
          ["ctx", "batch", "KV MiB / call", "us / call", "KV GB/s", "GFLOP/s", "% of read ceiling"], rows)


# ---- e2e --------------------------------------------------------------------------------------

def model_vocab(args):
    if not args.model:
        return PRESET_VOCAB.get(args.preset, 32000)
    cfg = os.path.join(args.model, "config.json") if os.path.isdir(args.model) else None
    try:
        return int(json.load(open(cfg))["vocab_size"])
    except (TypeError, OSError, ValueError, KeyError):
        return None  # GGUF or converted: ids below 1000 exist in any real vocabulary


def prompt_ids(n, vocab):
    if vocab is None:
        return [100 + (i * 7919 + 13) % 900 for i in range(n)]
    return [3 + (i * 7919 + 13) % (vocab - 3) for i in range(n)]


def default_layouts():
    n, out = cores(), []
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8):
            if tp * pp <= n and (tp == 1 or pp == 1):
                out.append((tp, pp))
    return sorted(out, key=lambda l: (l[0] * l[1], l[1]))


def e2e_results(stats, max_new):
    seqs = max(1, int(stats.get("sequences", 1)))
    gen = int(stats.get("generated_tokens", 0))
    decode_tokens = max(0, gen - seqs)  # the first token of each sequence comes from its prefill
    steps = decode_tokens / seqs
    res = {"prefill_tokens_per_s": stats.get("prefill_tokens_per_s"),
           "decode_tokens_per_s": stats.get("decode_tokens_per_s"),
           "decode_tokens_per_s_per_seq": (stats.get("decode_tokens_per_s") or 0) / seqs,
           "ttft_s": stats.get("prefill_seconds"),
           "per_token_latency_ms": 1e3 * stats["decode_seconds"] / steps if steps > 0 else None,
           "prefill_seconds": stats.get("prefill_seconds"), "decode_seconds": stats.get("decode_seconds"),
           "prompt_tokens": stats.get("prompt_tokens"), "generated_tokens": gen, "sequences": seqs,
           "load_seconds": stats.get("load_seconds"), "idle_seconds_rank0": stats.get("idle_seconds_rank0"),
           "preemptions": stats.get("preemptions"), "rss_bytes_rank0": stats.get("rss_bytes_rank0"),
           "weight_bytes_per_rank": stats.get("weight_bytes_per_rank"), "backend": stats.get("backend")}
    bd = stats.get("breakdown")
    if isinstance(bd, dict) and bd.get("rank0") and bd.get("steps"):
        res["breakdown"] = bd
    return res


def read_ceiling(args, rec, np_, cache):
    """Read bandwidth of np_ single-thread ranks streaming at once (bench_stream_mpi), once per rank count."""
    exe = binary(args, "benchmarks/bench_stream_mpi")
    if args.no_ceiling or not os.path.exists(exe) or getattr(args, "launcher", None) not in (None, "", "mpirun"):
        return {}
    if np_ not in cache:
        best = 0.0
        for i in range(3):  # best of 3: on a shared machine one run can meet a neighbour's burst
            raw = rec.raw(f"stream_np{np_}_{i}")
            p = run_logged(mpirun_prefix(np_) + [exe, "--json", raw], 600, env=mpi_env())
            if p.returncode == 0:
                best = max(best, json.load(open(raw))["read_bw_gbs_all"])
        cache[np_] = ({"read_bw_gbs_all_ranks": best, "read_bw_source": f"bench_stream_mpi on {np_} ranks, best of 3"}
                      if best > 0 else {})
    return cache[np_]


def bench_e2e(args, rec):
    lattice = lattice_bin(args)
    need(lattice, "lattice")
    ceilings = {}
    layouts = args.layouts or default_layouts()
    over = [l for l in layouts if l[0] * l[1] > cores()]
    if over:
        log(f"run.py: note: layouts {['%dx%d' % l for l in over]} use more ranks than the {cores()} cores here "
            "(oversubscribed: slow, measured anyway)")
    vocab = model_vocab(args)
    if args.prompt_ids:
        prompts = [[int(x) for x in args.prompt_ids.split(",")]]
    else:
        prompts = [prompt_ids(n, vocab) for n in args.prompts]
    source = ["--model", args.model] if args.model else ["--random-weights", "--config", args.preset]
    model_name = os.path.basename(os.path.normpath(args.model)) if args.model else args.preset
    rows, base = [], {}
    rounds = max(1, args.rounds)
    per_round = {}  # (tp, pp, batch, prompt) -> [(round, decode tok/s, speedup over that round's 1x1)]
    for rnd, ids, batch, (tp, pp) in ((r, i, b, l) for r in range(rounds) for i in prompts for b in args.batch
                                      for l in layouts):
        np_ = tp * pp
        tag = f"tp{tp}-pp{pp}-b{batch}-p{len(ids)}" + (f"-r{rnd}" if rounds > 1 else "")
        raw = (args.stats_path.format(tp=tp, pp=pp, batch=batch, prompt=len(ids)) if args.stats_path
               else rec.raw(f"e2e-{tag}"))
        cmd = launcher_prefix(args.launcher, np_, tp, pp) + [lattice, "generate"] + source + [
            "--quant", args.quant, "--tp", str(tp), "--pp", str(pp), "--batch", str(batch),
            "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens", str(args.max_new_tokens),
            "--ignore-eos", "--max-seq", str(len(ids) + args.max_new_tokens + 8), "--stats-json", raw]
        cmd += ["--threads", str(args.threads)] if args.threads else []
        cmd += shlex.split(args.extra) if args.extra else []
        if os.path.exists(raw):
            os.remove(raw)
        p = run_logged(cmd, args.timeout, env=mpi_env())
        if p.returncode != 0 or not os.path.exists(raw):
            rec.fail(f"e2e {tag}", p)
            continue
        stats = json.load(open(raw))
        params = {"model": model_name, "random_weights": not args.model, "quant": args.quant, "tp": tp,
                  "pp": pp, "ranks": np_, "batch": batch, "prompt": len(ids),
                  "max_new_tokens": args.max_new_tokens, "threads": stats.get("threads"),
                  "launcher": args.launcher or "mpirun"}
        if args.extra:
            params["extra"] = args.extra  # another configuration: never mixed with the default's points
        res = e2e_results(stats, args.max_new_tokens)
        if rounds > 1:
            res["round"], res["rounds"] = rnd, rounds
        ceil = read_ceiling(args, rec, np_, ceilings)
        if batch == 1 and ceil and res["decode_tokens_per_s"] and res.get("weight_bytes_per_rank"):
            # One decode step of one sequence streams every rank's weights once.
            res["weight_read_gbs"] = res["decode_tokens_per_s"] * res["weight_bytes_per_rank"] * np_ * 1e-9
            res["frac_read_bw"] = res["weight_read_gbs"] / ceil["read_bw_gbs_all_ranks"]
        rec.emit("e2e", params, res, ceil)
        key = (rnd, batch, len(ids))
        if (tp, pp) == (1, 1):
            base[key] = res["decode_tokens_per_s"]
        sp = res["decode_tokens_per_s"] / base[key] if base.get(key) else None
        per_round.setdefault((tp, pp, batch, len(ids)), []).append((rnd, res["decode_tokens_per_s"], sp))
        bd = res.get("breakdown")
        share = (lambda k: f(100 * bd["rank0"][k] / bd["wall_seconds"], 0) if bd and bd["wall_seconds"] else "-")
        rows.append([f"{tp}x{pp}" + (f" r{rnd}" if rounds > 1 else ""), np_, batch, len(ids), f(res["prefill_tokens_per_s"], 1),
                     f(res["decode_tokens_per_s"]), f(res["ttft_s"], 3), f(res["per_token_latency_ms"], 1),
                     f(sp), f(sp / np_ if sp else None), f(res.get("weight_read_gbs")),
                     f(100 * res["frac_read_bw"], 0) if "frac_read_bw" in res else "-",
                     share("communication"), share("pipeline_bubble")])
    if rows:
        table(f"end to end: lattice generate, {model_name}, {args.quant}, {args.max_new_tokens} new tokens "
              f"(speedup: decode tok/s over 1x1 at the same batch and prompt)",
              ["tp x pp", "ranks", "batch", "prompt", "prefill tok/s", "decode tok/s", "TTFT s", "ms / token",
               "speedup", "efficiency", "weight GB/s (b1)", "% read ceiling", "comm % rank0", "bubble % rank0"],
              rows)
        if not any(r[-1] != "-" for r in rows):
            print("\n(no per-step breakdown in these --stats-json files: this lattice predates it)")
    if rounds > 1 and per_round:
        e2e_rounds_summary(args, rec, model_name, per_round, rounds)


def e2e_rounds_summary(args, rec, model_name, per_round, rounds):
    """--rounds N: the layouts ran interleaved N times (1x1, 2x1, 1x2, 1x1, ...), so a slow spell of a
    shared machine hits every layout alike; the speedup of round i divides by round i's own 1x1.
    One e2e_rounds point per layout, batch and prompt: medians and ranges over the rounds."""
    rows = []
    for (tp, pp, batch, prompt), runs in sorted(per_round.items(), key=lambda kv: (kv[0][2], kv[0][3], kv[0][0] *
                                                                                     kv[0][1], kv[0][1])):
        tok = [t for _, t, _ in runs if t]
        sps = [s for _, _, s in runs if s]
        res = {"rounds": rounds, "runs": len(runs),
               "decode_tokens_per_s_median": statistics.median(tok) if tok else None,
               "decode_tokens_per_s_min": min(tok) if tok else None,
               "decode_tokens_per_s_max": max(tok) if tok else None,
               "speedup_median": statistics.median(sps) if sps else None,
               "speedup_min": min(sps) if sps else None, "speedup_max": max(sps) if sps else None,
               "per_round": [{"round": r, "decode_tokens_per_s": t, "speedup": s} for r, t, s in runs]}
        params = {"model": model_name, "random_weights": not args.model, "quant": args.quant, "tp": tp, "pp": pp,
                  "ranks": tp * pp, "batch": batch, "prompt": prompt, "max_new_tokens": args.max_new_tokens,
                  "threads": args.threads, "launcher": args.launcher or "mpirun"}
        if args.extra:
            params["extra"] = args.extra
        rec.emit("e2e_rounds", params, res, {})
        rows.append([f"{tp}x{pp}", batch, prompt, f"{len(runs)}/{rounds}", f(res["decode_tokens_per_s_median"]),
                     f"{f(res['decode_tokens_per_s_min'])}-{f(res['decode_tokens_per_s_max'])}",
                     f(res["speedup_median"]), f"{f(res['speedup_min'])}-{f(res['speedup_max'])}",
                     " ".join(f(s) for _, _, s in runs)])
    table(f"end to end over {rounds} interleaved rounds: {model_name}, {args.quant}, {args.max_new_tokens} new tokens "
          f"(speedup of each round over that round's 1x1)",
          ["tp x pp", "batch", "prompt", "runs", "decode tok/s median", "range", "speedup median", "range",
           "speedup per round"], rows)


# ---- CLI --------------------------------------------------------------------------------------

# ---- sim ----------------------------------------------------------------------------------------

def plan_predictions(args, lattice, ranks):
    """`lattice plan --json` for the simulated job: {(tp, pp): layout prediction}."""
    quant = {"none": "fp16", "auto": "fp16"}.get(args.quant, args.quant)
    cmd = [lattice, "plan", "--model", args.preset, "--gpus", str(ranks), "--gpu", args.sim_gpu, "--interconnect",
           args.sim_link, "--quant", quant, "--batch", str(args.requests), "--prompt", str(args.prompt), "--json"]
    p = run_logged(cmd, 120)
    if p.returncode != 0:
        return {}, quant
    return {(l["tp"], l["pp"]): l for l in json.loads(p.stdout)["layouts"]}, quant


def bench_sim(args, rec):
    """The simulated device (--device sim): `lattice batch` of `requests` prompts of `prompt` random ids
    and `max_new_tokens` each (all queued at once) on every layout, beside the planner's prediction:
    its run time = requests x prompt / prefill tok/s + requests x max_new / decode tok/s."""
    lattice = lattice_bin(args)
    need(lattice, "lattice")
    layouts = args.layouts or [(8, 1), (4, 2), (2, 4), (1, 8)]
    vocab = PRESET_VOCAB.get(args.preset, 32000)
    inp = rec.raw("sim-input").replace(".json", ".jsonl")
    rng = __import__("random").Random(11)
    with open(inp, "w") as fh:
        for _ in range(args.requests):
            fh.write(json.dumps({"prompt": [rng.randrange(3, vocab) for _ in range(args.prompt)],
                                 "max_tokens": args.max_new_tokens}) + "\n")
    rows, plans = [], {}
    for tp, pp in layouts:
        np_ = tp * pp
        if np_ not in plans:
            plans[np_] = plan_predictions(args, lattice, np_)
        pred_all, plan_quant = plans[np_]
        tag = f"sim-tp{tp}-pp{pp}"
        raw, out = rec.raw(tag), rec.raw(tag + "-out").replace(".json", ".jsonl")
        for path in (raw, out):
            if os.path.exists(path):
                os.remove(path)
        cmd = mpirun_prefix(np_) + [lattice, "batch", "--random-weights", "--config", args.preset, "--device", "sim",
                                    "--sim-gpu", args.sim_gpu, "--sim-link", args.sim_link, "--quant", args.quant,
                                    "--tp", str(tp), "--pp", str(pp), "--input", inp, "--output", out,
                                    "--stats-json", raw, "--progress", "none"]
        cmd += ["--sim-step-ms", str(args.sim_step_ms)] if args.sim_step_ms else []
        cmd += shlex.split(args.extra) if args.extra else []
        p = run_logged(cmd, args.timeout, env=mpi_env())
        if p.returncode != 0 or not os.path.exists(raw):
            rec.fail(f"sim {tag}", p)
            continue
        st = json.load(open(raw))
        pred = pred_all.get((tp, pp), {})
        gen = st["generated_tokens"]
        run_s = st["run_seconds"]
        res = {k: st.get(k) for k in ("run_seconds", "tokens_per_s", "decode_tokens_per_s", "ttft_p50_s",
                                      "ttft_p90_s", "ttft_p99_s", "steps", "plans_sent", "plan_bytes",
                                      "plan_wait_seconds", "plan_blocked_seconds", "plan_cpu_seconds",
                                      "sim_overrun_seconds", "kv_blocks", "kv_blocks_free", "completed",
                                      "load_seconds")}
        share = lambda k: st[k] / run_s if run_s and st.get(k) is not None else None  # noqa: E731
        res["plan_wait_share"] = share("plan_wait_seconds")
        res["plan_blocked_share"] = share("plan_blocked_seconds")
        res["plan_cpu_share"] = share("plan_cpu_seconds")
        res["sim_overrun_share"] = share("sim_overrun_seconds")
        res["load_avg"] = os.getloadavg()[0]  # the machine's, after the run (other sessions share it)
        res["plan_bytes_per_plan"] = st["plan_bytes"] / st["plans_sent"] if st.get("plans_sent") else None
        ceil = {}
        if pred.get("prefill_tokens_per_s") and pred.get("decode_tokens_per_s"):
            pf = args.requests * args.prompt / pred["prefill_tokens_per_s"]
            dec = args.requests * args.max_new_tokens / pred["decode_tokens_per_s"]
            ceil = {"source": "lattice plan (parallel/plan_model)", "quant": plan_quant,
                    "predicted_run_seconds": pf + dec, "predicted_prefill_seconds": pf,
                    "predicted_tokens_per_s": gen / (pf + dec),
                    "predicted_decode_tokens_per_s": pred["decode_tokens_per_s"],
                    "predicted_ttft_ms_alone": pred.get("ttft_ms"), "fits": pred.get("fits")}
        params = {"model": args.preset, "device": "sim", "sim_gpu": args.sim_gpu, "sim_link": args.sim_link,
                  "sim_step_ms": args.sim_step_ms, "quant": args.quant, "tp": tp, "pp": pp, "ranks": np_,
                  "requests": args.requests, "prompt": args.prompt, "max_new_tokens": args.max_new_tokens}
        rec.emit("sim", params, res, ceil)
        ratio = lambda a, b: f(a / b) if a and b else "-"  # noqa: E731
        rows.append([f"{tp}x{pp}", f(res["tokens_per_s"], 0), f(ceil.get("predicted_tokens_per_s"), 0),
                     ratio(res["tokens_per_s"], ceil.get("predicted_tokens_per_s")),
                     f(res["decode_tokens_per_s"], 0), f(ceil.get("predicted_decode_tokens_per_s"), 0),
                     ratio(res["decode_tokens_per_s"], ceil.get("predicted_decode_tokens_per_s")),
                     f(res["ttft_p50_s"]), f(res["ttft_p99_s"]), f(ceil.get("predicted_prefill_seconds")),
                     res["steps"], f(res["plan_bytes_per_plan"], 0), f(100 * res["plan_wait_share"], 1),
                     f(100 * res["plan_blocked_share"], 2), f(100 * (res["plan_cpu_share"] or 0), 2),
                     f(100 * (res["sim_overrun_share"] or 0), 1), f(res["load_avg"], 1)])
    if rows:
        table(f"simulated device: {args.preset} on {args.sim_gpu} over {args.sim_link} ({args.quant}), "
              f"{args.requests} requests of {args.prompt} in / {args.max_new_tokens} out, all queued at once",
              ["tp x pp", "tok/s", "plan tok/s", "ratio", "decode tok/s", "plan decode", "ratio", "TTFT p50 s",
               "TTFT p99 s", "plan prefill s", "steps", "B / plan", "plan wait %", "plan blocked %", "plan CPU %",
               "overrun %", "load"], rows)


SPEC_TEXT = ("The old lighthouse stood at the edge of the cliff for more than two hundred years. Every night, its "
             "keeper climbed the narrow stairs to light the lamp, and every morning he wrote a few lines in a thick "
             "leather book: the weather, the ships that passed, and anything unusual he had seen on the water. When "
             "the last keeper retired, the town council decided to turn the building into a small museum.")
SPEC_TASKS = {
    # A repetitive task: the output copies the prompt (rewriting, editing, summarizing quote much of it).
    "rewrite": "Rewrite the following paragraph exactly, word for word:\n\n" + SPEC_TEXT +
               "\n\nRewritten paragraph:\n\nThe old lighthouse",
    # Free text: little to look up.
    "free": "Write a short story about a dragon who learns to bake bread.\n\nOnce upon a time",
}


def bench_spec(args, rec):
    """Speculative decoding by prompt lookup: single-stream decode of `lattice generate` (greedy) on one task
    with --speculative ngram at each draft count beside plain decoding, interleaved over rounds; the same
    ids are required of every run (greedy output does not change with drafts)."""
    lattice = lattice_bin(args)
    need(lattice, "lattice")
    source = ["--model", args.model] if args.model else []
    model_name = os.path.basename(os.path.normpath(args.model)) if args.model else "built-in SmolLM2-135M"
    per = {}  # (task, k) -> [(decode tok/s, drafted, accepted)]
    ids_of = {}
    for rnd in range(max(1, args.rounds)):
        for task in args.tasks:
            prompt = rec.raw(f"spec-prompt-{task}").replace(".json", ".txt")
            with open(prompt, "w") as fh:
                fh.write(SPEC_TASKS[task])
            for k in args.drafts:
                raw = rec.raw(f"spec-{task}-k{k}-r{rnd}")
                cmd = [lattice, "generate"] + source + ["--prompt-file", prompt, "-n", str(args.max_new_tokens),
                                                        "--ignore-eos", "--print-ids", "--stats-json", raw, "-q"]
                cmd += ["--threads", str(args.threads)] if args.threads else []
                cmd += ["--speculative", "ngram", "--num-speculative-tokens", str(k)] if k > 0 else []
                cmd += shlex.split(args.extra) if args.extra else []
                p = run_logged(cmd, args.timeout)
                if p.returncode != 0 or not os.path.exists(raw):
                    rec.fail(f"spec {task} k={k}", p)
                    continue
                st = json.load(open(raw))
                ids = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
                if ids_of.setdefault(task, ids) != ids:
                    rec.fail(f"spec {task} k={k}: greedy ids differ from the first run's")
                per.setdefault((task, k), []).append((st["decode_tokens_per_s"], st.get("drafted_tokens", 0),
                                                      st.get("accepted_tokens", 0)))
    rows = []
    for task in args.tasks:
        base = per.get((task, 0))
        base_med = statistics.median(r[0] for r in base) if base else None
        for k in args.drafts:
            runs = per.get((task, k))
            if not runs:
                continue
            med = statistics.median(r[0] for r in runs)
            drafted, accepted = sum(r[1] for r in runs), sum(r[2] for r in runs)
            res = {"decode_tokens_per_s": med, "decode_tokens_per_s_runs": [r[0] for r in runs],
                   "drafted_tokens": drafted, "accepted_tokens": accepted,
                   "acceptance": accepted / drafted if drafted else None,
                   "speedup_vs_plain": med / base_med if base_med and k > 0 else None}
            params = {"model": model_name, "task": task, "speculative": "ngram" if k else "none",
                      "num_speculative_tokens": k, "max_new_tokens": args.max_new_tokens, "rounds": len(runs),
                      "threads": args.threads, "load_avg": os.getloadavg()[0]}
            rec.emit("spec", params, res, {"baseline": "plain decoding, same binary, same run"})
            rows.append([task, k or "plain", f(med, 1), f(res["speedup_vs_plain"]),
                         f(100 * res["acceptance"], 0) if res["acceptance"] is not None else "-",
                         f"{accepted}/{drafted}"])
    if rows:
        table(f"speculative decoding (prompt lookup), {model_name}, greedy, {args.max_new_tokens} new tokens, "
              f"median of {max(1, args.rounds)} interleaved rounds (load {os.getloadavg()[0]:.1f})",
              ["task", "drafts", "decode tok/s", "speedup", "accepted %", "accepted/drafted"], rows)


def bench_kv(args, rec):
    """KV cache element types at a long context: single-stream decode of `lattice generate` after a prompt of
    each length, with each --kv-cache-dtype, interleaved over rounds; the ratio is to f16 in the same round
    set. Decode at long contexts reads the whole cache every token: its bytes per token (kv_bytes_per_token,
    from the model's layers and KV heads) beside the weights' set how fast it can go."""
    lattice = lattice_bin(args)
    need(lattice, "lattice")
    source = ["--model", args.model] if args.model else []
    model_name = os.path.basename(os.path.normpath(args.model)) if args.model else "built-in SmolLM2-135M"
    vocab = model_vocab(args) if args.model else None  # the built-in GGUF: ids below 1000 exist in any vocabulary
    per = {}  # (prompt, dtype) -> [decode tok/s]
    for rnd in range(max(1, args.rounds)):
        for n in args.prompts:
            ids = prompt_ids(n, vocab)
            for dt in args.dtypes:
                raw = rec.raw(f"kv-{dt}-p{n}-r{rnd}")
                cmd = [lattice, "generate"] + source + ["--prompt-ids", ",".join(map(str, ids)), "-n",
                                                        str(args.max_new_tokens), "--ignore-eos", "--max-seq",
                                                        str(n + args.max_new_tokens + 8), "--kv-cache-dtype", dt,
                                                        "--stats-json", raw, "-q"]
                cmd += ["--threads", str(args.threads)] if args.threads else []
                cmd += shlex.split(args.extra) if args.extra else []
                p = run_logged(cmd, args.timeout)
                if p.returncode != 0 or not os.path.exists(raw):
                    rec.fail(f"kv {dt} prompt {n}", p)
                    continue
                per.setdefault((n, dt), []).append(json.load(open(raw))["decode_tokens_per_s"])
    rows = []
    for n in args.prompts:
        base = per.get((n, "f16"))
        base_med = statistics.median(base) if base else None
        for dt in args.dtypes:
            runs = per.get((n, dt))
            if not runs:
                continue
            med = statistics.median(runs)
            res = {"decode_tokens_per_s": med, "decode_tokens_per_s_runs": runs,
                   "ratio_vs_f16": med / base_med if base_med else None}
            params = {"model": model_name, "prompt_tokens": n, "kv_cache_dtype": dt,
                      "max_new_tokens": args.max_new_tokens, "rounds": len(runs), "threads": args.threads,
                      "load_avg": os.getloadavg()[0], "extra": args.extra}
            rec.emit("kv", params, res, {"baseline": "--kv-cache-dtype f16, same binary, same run"})
            rows.append([n, dt, f(med, 1), f(res["ratio_vs_f16"])])
    if rows:
        table(f"KV cache element types, {model_name}, single stream, {args.max_new_tokens} new tokens, "
              f"median of {max(1, args.rounds)} interleaved rounds (load {os.getloadavg()[0]:.1f})",
              ["prompt", "KV dtype", "decode tok/s", "vs f16"], rows)


def common(p):
    g = p.add_argument_group("common")
    g.add_argument("--build", default=os.environ.get("LATTICE_BUILD", os.path.join(ROOT, "build")),
                   help="build folder holding launch/lattice and benchmarks/ (default: build)")
    g.add_argument("--lattice", help="the lattice executable (default: BUILD/launch/lattice)")
    g.add_argument("--out", default="bench-results", help="folder of results.jsonl, raw/ and plots/")
    g.add_argument("--label", default="", help="free text stored with every point (e.g. 'quiet machine')")
    g.add_argument("--plot", action="store_true", help="render the plots of OUT after the run")
    g.add_argument("--timeout", type=float, default=3600, help="seconds per benchmark process")
    g.add_argument("--threads", type=int, default=None, help="threads per process (default: each bench's own)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="see docs/benchmarks.md",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="bench", required=True)
    g = sub.add_parser("gemm", help="INT8 GEMM: bench_gemm_int8 (and bench_gpu_gemm on a CUDA build with a GPU)")
    g.add_argument("--full", action="store_true", help="every ISA path and shape (slow)")
    g.add_argument("--shapes", help="NxK,... (bench_gemm_int8 --shapes)")
    a = sub.add_parser("allreduce", help="all-reduce latency and bus bandwidth over MpiComm (bench_allreduce)")
    a.add_argument("--np", type=int_list, default=[2], help="rank counts, e.g. 2,4 (default 2)")
    a.add_argument("--min-bytes", type=parse_size, default=4)
    a.add_argument("--max-bytes", type=parse_size, default=256 << 20)
    a.add_argument("--dtype", default="f32", choices=["f32", "bf16", "i32"])
    a.add_argument("--comm", default="mpi", choices=["mpi", "mpi-noshm", "mpi-raw"])
    a.add_argument("--iters", type=int, default=0, help="timed calls per size (default: adaptive)")
    a.add_argument("--warmup", type=int, default=0, help="untimed calls per size (default: iters / 5)")
    t = sub.add_parser("attention", help="CPU paged decode attention (bench_attention)")
    t.add_argument("--contexts", type=int_list, default=[128, 512, 2048, 8192])
    t.add_argument("--batches", type=int_list, default=[1, 4, 16])
    t.add_argument("--config", default=DEFAULT_PRESET, help="model shape for the head counts")
    t.add_argument("--hot", action="store_true", help="one cache reused (no per-layer rotation)")
    t.add_argument("--min-time", type=float, default=0.2)
    tl = sub.add_parser("tplinear", help="the TP ceiling of decode's linears on CPU ranks (bench_tp_linear)")
    tl.add_argument("--np", type=int_list, default=[2], help="rank counts besides 1, e.g. 2,4 (default 2)")
    tl.add_argument("--config", default=DEFAULT_PRESET, help="model shape")
    tl.add_argument("--tokens", type=int, default=30, help="timed tokens per run (default 30)")
    tl.add_argument("--no-ceiling", action="store_true", help="skip the read-bandwidth ceiling (bench_stream_mpi)")
    e = sub.add_parser("e2e", help="lattice generate over layouts x batch x prompt lengths")
    e.add_argument("--layouts", type=layout_list, help=f"TPxPP,... (default: tp-only and pp-only up to {cores()} ranks)")
    e.add_argument("--batch", type=int_list, default=[1, 4, 16], help="concurrent sequences (default 1,4,16)")
    e.add_argument("--prompts", type=int_list, default=[64, 256], help="prompt lengths (default 64,256)")
    e.add_argument("--prompt-ids", help="one explicit prompt (comma-separated ids) instead of --prompts")
    e.add_argument("--max-new-tokens", type=int, default=16)
    e.add_argument("--rounds", type=int, default=1,
                   help="run every layout N times, interleaved (1x1, 2x1, 1x2, 1x1, ...), and add a table and "
                        "e2e_rounds points of medians and ranges (default 1)")
    src = e.add_mutually_exclusive_group()
    src.add_argument("--model", help="checkpoint (HF folder, GGUF, converted) instead of random weights")
    src.add_argument("--preset", "--config", dest="preset", default=DEFAULT_PRESET,
                     help=f"built-in shape for random weights (default {DEFAULT_PRESET})")
    e.add_argument("--quant", default="w8a8", help="none | w8a16 | w8a8 | auto (default w8a8)")
    e.add_argument("--launcher", default="mpirun",
                   help="mpirun | srun | a template with {np} {tp} {pp} (e.g. 'launch/lattice-mpirun --cpu --')")
    e.add_argument("--stats-path", help="where each run's --stats-json goes, a template with {tp} {pp} {batch} "
                                        "{prompt} (default OUT/raw/e2e-...json)")
    e.add_argument("--no-ceiling", action="store_true",
                   help="skip the read-bandwidth ceiling (bench_stream_mpi on the same rank count)")
    e.add_argument("--extra", default="", help="more lattice generate arguments, e.g. --extra='--comm-timeout 60'")
    sm = sub.add_parser("sim", help="the simulated device: lattice batch --device sim per layout vs lattice plan")
    sm.add_argument("--layouts", type=layout_list, help="TPxPP,... (default 8x1,4x2,2x4,1x8)")
    sm.add_argument("--requests", type=int, default=64)
    sm.add_argument("--prompt", type=int, default=512, help="prompt ids per request (default 512)")
    sm.add_argument("--max-new-tokens", type=int, default=128)
    sm.add_argument("--preset", "--config", dest="preset", default="llama-2-70b", help="model shape (default llama-2-70b)")
    sm.add_argument("--sim-gpu", default="a100-pcie-40gb")
    sm.add_argument("--sim-link", default="pcie4")
    sm.add_argument("--sim-step-ms", type=float, default=0, help="fixed step time instead of the planner's (0)")
    sm.add_argument("--quant", default="none", help="none (fp16 on the simulated GPU) | w8a16 | w8a8")
    sm.add_argument("--extra", default="", help="more lattice batch arguments")
    sp = sub.add_parser("spec", help="speculative decoding (prompt lookup) vs plain decoding, lattice generate")
    sp.add_argument("--model", help="checkpoint (default: the built-in model)")
    sp.add_argument("--tasks", type=lambda v: v.split(","), default=["rewrite", "free"],
                    help="rewrite (copies its prompt) and/or free (default both)")
    sp.add_argument("--drafts", type=lambda v: int_list(v, 0), default=[0, 2, 4, 8], help="draft counts, 0 = plain (default 0,2,4,8)")
    sp.add_argument("--max-new-tokens", type=int, default=96)
    sp.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    sp.add_argument("--extra", default="", help="more lattice generate arguments")
    kv = sub.add_parser("kv", help="--kv-cache-dtype at long contexts: single-stream decode, lattice generate")
    kv.add_argument("--model", help="checkpoint (default: the built-in model)")
    kv.add_argument("--prompts", type=lambda v: int_list(v, 1), default=[4000], help="prompt lengths (default 4000)")
    kv.add_argument("--dtypes", type=lambda v: v.split(","), default=["f32", "f16", "int8"])
    kv.add_argument("--max-new-tokens", type=int, default=32)
    kv.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    kv.add_argument("--extra", default="", help="more lattice generate arguments")
    sub.add_parser("all", help="gemm, allreduce, attention and e2e with their defaults")
    pl = sub.add_parser("plot", help="PNG plots from DIR/results.jsonl")
    pl.add_argument("dir", help="folder holding results.jsonl (plots go to DIR/plots)")
    pl.add_argument("--plots", help="output folder (default DIR/plots)")
    for p in (g, a, t, tl, e, sm, sp, kv, sub.choices["all"]):
        common(p)
    args = ap.parse_args(argv)

    if args.bench == "plot":
        return plot_main(args.dir, args.plots)
    if args.threads is None:
        args.threads = 1 if args.bench == "e2e" else 0
    rec = Recorder(args)
    todo = ["gemm", "allreduce", "attention", "e2e"] if args.bench == "all" else [args.bench]
    if args.bench == "all":  # the sub-benchmarks' defaults
        defaults = {"full": False, "shapes": None, "np": [2], "min_bytes": 4, "max_bytes": 256 << 20, "dtype": "f32",
                    "comm": "mpi", "iters": 0, "warmup": 0, "contexts": [128, 512, 2048, 8192],
                    "batches": [1, 4, 16], "config": DEFAULT_PRESET, "hot": False, "min_time": 0.2, "layouts": None,
                    "batch": [1, 4, 16], "prompts": [64, 256], "prompt_ids": None, "max_new_tokens": 16,
                    "model": None, "preset": DEFAULT_PRESET, "quant": "w8a8", "launcher": "mpirun",
                    "stats_path": None, "extra": "", "no_ceiling": False}
        for k, v in defaults.items():
            setattr(args, k, v)
    t0 = time.time()
    for b in todo:
        if args.bench == "all":
            args.threads = 1 if b == "e2e" else 0
        {"gemm": bench_gemm, "allreduce": bench_allreduce, "attention": bench_attention, "tplinear": bench_tplinear,
         "e2e": bench_e2e, "sim": bench_sim, "spec": bench_spec, "kv": bench_kv}[b](args, rec)
    print(f"\nrun.py: {rec.count} point(s) appended to {rec.path} (run {rec.run_id}, {time.time() - t0:.0f} s)"
          + (f"; {rec.failures} FAILED" if rec.failures else ""))
    if args.plot:
        plot_main(args.out, None, missing_ok=True)
    return 1 if rec.failures else 0


def plot_main(d, plots, missing_ok=False):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        venv_py = os.path.join(ROOT, ".venv", "bin", "python3")
        if os.path.exists(venv_py) and os.path.realpath(sys.executable) != os.path.realpath(venv_py) \
                and sh([venv_py, "-c", "import matplotlib"], timeout=30).returncode == 0:
            cmd = [venv_py, os.path.abspath(__file__), "plot", d] + (["--plots", plots] if plots else [])
            return subprocess.call(cmd)
        print("run.py: matplotlib is not installed: run scripts/setup.sh --bench (installs it into .venv/), then "
              f".venv/bin/python3 benchmarks/run.py plot {d}" + (" (the JSON lines are written)" if missing_ok else ""))
        return 0 if missing_ok else 3
    sys.path.insert(0, HERE)
    sys.dont_write_bytecode = True  # no benchmarks/__pycache__ in the checkout
    import bench_plot
    return bench_plot.plot_dir(d, plots)


if __name__ == "__main__":
    sys.exit(main())
