#!/usr/bin/env python3
"""benchmarks/run.py end to end, small and untimed (asserts what is written, never how fast):
  - `e2e` on the golden tiny-llama2 over layouts 1x1 and 1x2 (2 ranks) and batch 1 and 2, 2 new
    tokens: one lattice-bench/1 line per point with every schema field, params as asked, the
    token counts of the run, a markdown table on stdout;
  - `e2e` on an impossible layout (3x1: 4 heads) fails (exit != 0) and appends nothing;
  - `e2e --rounds 2` interleaves the layouts and adds one e2e_rounds summary (medians, ranges) each;
  - `allreduce` on 2 ranks, 4..64 bytes: 3 lines, p50 <= p99, no wrong elements;
  - `tplinear` on the tiny model's shapes: 1 rank, 2 ranks with and without the all-reduces;
  - `plot` writes the scaling, concurrency, breakdown (when the stats carry one) and all-reduce
    PNGs (exit 77 with the reason where matplotlib is missing: scripts/setup.sh --bench).
Usage: test_run_py.py --build DIR --lattice BIN --source DIR --shared DIR"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile

SKIP = 77


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def run(cmd, ok=True):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if ok and p.returncode != 0:
        fail(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def lines(path):
    if not os.path.exists(path):
        return []
    return [json.loads(l) for l in open(path) if l.strip()]


def check_schema(r):
    for k in ("schema", "bench", "run_id", "params", "results", "ceilings", "machine", "versions", "git_commit",
              "time"):
        if k not in r:
            fail(f"field {k!r} missing in {json.dumps(r)[:500]}")
    if r["schema"] != "lattice-bench/1":
        fail(f"schema {r['schema']!r}")
    for k in ("params", "results", "ceilings", "machine", "versions"):
        if not isinstance(r[k], dict):
            fail(f"{k} is not an object: {r[k]!r}")
    m = r["machine"]
    if not (isinstance(m.get("cores"), int) and m["cores"] >= 1 and m.get("cpu") and m.get("kernel")):
        fail(f"machine incomplete: {m}")
    if not str(r["versions"].get("lattice", "")).startswith("lattice "):
        fail(f"versions.lattice: {r['versions']}")
    if not r["versions"].get("python") or "mpirun" not in r["versions"]:
        fail(f"versions: {r['versions']}")
    if r["git_commit"] is not None and not re.fullmatch(r"[0-9a-f]{40}", r["git_commit"]):
        fail(f"git_commit {r['git_commit']!r}")
    datetime.datetime.fromisoformat(r["time"])


def main():
    ap = argparse.ArgumentParser()
    for a in ("--build", "--lattice", "--source", "--shared"):
        ap.add_argument(a, required=True)
    a = ap.parse_args()
    model = os.path.join(a.shared, "golden", "tiny-llama2")
    if not os.path.isdir(model):
        print(f"SKIP: {model} not found (the golden data of ../shared)")
        sys.exit(SKIP)
    runpy = os.path.join(a.source, "benchmarks", "run.py")
    out = tempfile.mkdtemp(prefix="lattice-runpy-")
    jsonl = os.path.join(out, "results.jsonl")
    base = [sys.executable, runpy]
    common = ["--build", a.build, "--lattice", a.lattice, "--out", out]

    # e2e: 2 layouts x 2 batch sizes.
    p = run(base + ["e2e", "--model", model, "--layouts", "1x1,1x2", "--batch", "1,2", "--prompts", "8",
                    "--max-new-tokens", "2", "--quant", "none", "--no-ceiling", "--label", "ctest"] + common)
    recs = lines(jsonl)
    if len(recs) != 4:
        fail(f"e2e: {len(recs)} lines in {jsonl}, want 4:\n{p.stdout}")
    seen = set()
    for r in recs:
        check_schema(r)
        pr, res = r["params"], r["results"]
        if r["bench"] != "e2e" or r["label"] != "ctest" or pr["model"] != "tiny-llama2" or pr["prompt"] != 8:
            fail(f"e2e params: {pr}")
        seen.add((pr["tp"], pr["pp"], pr["batch"]))
        if pr["ranks"] != pr["tp"] * pr["pp"]:
            fail(f"ranks {pr}")
        if res["generated_tokens"] != 2 * pr["batch"] or res["sequences"] != pr["batch"] or \
                res["prompt_tokens"] != 8 * pr["batch"]:
            fail(f"e2e token counts {res} for {pr}")
        for k in ("prefill_tokens_per_s", "decode_tokens_per_s", "ttft_s", "per_token_latency_ms"):
            if not (isinstance(res.get(k), (int, float)) and res[k] > 0):
                fail(f"e2e results.{k} = {res.get(k)!r}")
        bd = res.get("breakdown")
        if bd is not None and (bd["steps"] < 1 or len(bd["per_rank"]) != pr["ranks"]):
            fail(f"breakdown {bd}")
    if seen != {(1, 1, 1), (1, 2, 1), (1, 1, 2), (1, 2, 2)}:
        fail(f"e2e points {seen}")
    if len({r["run_id"] for r in recs}) != 1:
        fail("one invocation, one run_id")
    if "| 1x2 | 2 | 2 | 8 |" not in p.stdout:
        fail(f"e2e table row missing:\n{p.stdout}")

    # A layout the model cannot take: the run fails, says so, appends nothing.
    p = run(base + ["e2e", "--model", model, "--layouts", "3x1", "--batch", "1", "--prompts", "8",
                    "--max-new-tokens", "2", "--quant", "none", "--no-ceiling"] + common, ok=False)
    if p.returncode == 0 or "FAILED" not in p.stderr or len(lines(jsonl)) != 4:
        fail(f"e2e 3x1 on a 4-head model: rc {p.returncode}, {len(lines(jsonl))} lines\n{p.stderr[-2000:]}")

    # --rounds 2: the layouts interleaved (1x1, 1x2, 1x1, 1x2), then one e2e_rounds summary per layout.
    n0 = len(lines(jsonl))
    p = run(base + ["e2e", "--model", model, "--layouts", "1x1,1x2", "--batch", "1", "--prompts", "8",
                    "--max-new-tokens", "2", "--quant", "none", "--no-ceiling", "--rounds", "2"] + common)
    new = lines(jsonl)[n0:]
    order = [(r["bench"], r["params"]["pp"], r["results"].get("round")) for r in new]
    if order != [("e2e", 1, 0), ("e2e", 2, 0), ("e2e", 1, 1), ("e2e", 2, 1), ("e2e_rounds", 1, None),
                 ("e2e_rounds", 2, None)]:
        fail(f"--rounds 2 points {order}")
    for r in new[4:]:
        check_schema(r)
        res = r["results"]
        runs = [x["decode_tokens_per_s"] for x in res["per_round"]]
        if res["rounds"] != 2 or len(runs) != 2 or res["decode_tokens_per_s_min"] != min(runs) or \
                res["decode_tokens_per_s_max"] != max(runs) or \
                not res["speedup_min"] <= res["speedup_median"] <= res["speedup_max"]:
            fail(f"e2e_rounds point {r['params']} {res}")
    if new[4]["results"]["speedup_median"] != 1.0 or "over 2 interleaved rounds" not in p.stdout:
        fail(f"e2e_rounds: 1x1 is each round's baseline; table:\n{p.stdout}")

    # allreduce: 4, 16, 64 bytes on 2 ranks.
    if not os.path.exists(os.path.join(a.build, "benchmarks", "bench_allreduce")):
        fail(f"{a.build}/benchmarks/bench_allreduce is not built")
    run(base + ["allreduce", "--np", "2", "--min-bytes", "4", "--max-bytes", "64"] + common)
    ar = [r for r in lines(jsonl) if r["bench"] == "allreduce"]
    if [r["params"]["bytes"] for r in ar] != [4, 16, 64]:
        fail(f"allreduce sizes {[r['params'] for r in ar]}")
    for r in ar:
        check_schema(r)
        res = r["results"]
        if res["errors"] != 0 or not (0 < res["p50_us"] <= res["p99_us"]) or not res["busbw_gbps"] > 0 \
                or r["params"]["ranks"] != 2 or not r["ceilings"].get("memcpy_gbps"):
            fail(f"allreduce point {r['params']} {res} {r['ceilings']}")

    # tplinear: 1 rank, 2 ranks with and without all-reduces, on the tiny model's shapes.
    cfg = os.path.join(model, "config.json")
    run(base + ["tplinear", "--np", "2", "--config", cfg, "--tokens", "2", "--no-ceiling"] + common)
    tl = [r for r in lines(jsonl) if r["bench"] == "tplinear"]
    if [(r["params"]["ranks"], r["params"]["sync"]) for r in tl] != [(1, True), (2, True), (2, False)]:
        fail(f"tplinear points {[r['params'] for r in tl]}")
    layers = json.load(open(cfg))["num_hidden_layers"]
    for r in tl:
        check_schema(r)
        pr, res = r["params"], r["results"]
        if pr["allreduces_per_token"] != (2 * layers if pr["sync"] else 0) or pr["tokens"] != 2 or \
                len(res["allreduce_wait_ms_per_rank"]) != pr["ranks"]:
            fail(f"tplinear point {pr} {res}")
        if not (0 < res["ms_per_token_best"] <= res["ms_per_token_median"]) or not res["gbs_all_ranks"] > 0:
            fail(f"tplinear times {res}")
    if tl[0]["results"]["speedup_vs_1_rank"] != 1.0 or \
            not tl[1]["params"]["weight_bytes_per_rank"] < tl[0]["params"]["weight_bytes_per_rank"]:
        fail(f"tplinear: the 1-rank run is the baseline and 2 ranks hold less each: {[r['params'] for r in tl]}")

    # kv: each --kv-cache-dtype once, the ratio to f16 in the same run.
    run(base + ["kv", "--model", model, "--prompts", "8", "--dtypes", "f16,int8", "--max-new-tokens", "2",
                "--rounds", "1"] + common)
    kv = [r for r in lines(jsonl) if r["bench"] == "kv"]
    if [r["params"]["kv_cache_dtype"] for r in kv] != ["f16", "int8"]:
        fail(f"kv points {[r['params'] for r in kv]}")
    for r in kv:
        check_schema(r)
        if not r["results"]["decode_tokens_per_s"] > 0 or r["params"]["prompt_tokens"] != 8:
            fail(f"kv point {r['params']} {r['results']}")
    if kv[0]["results"]["ratio_vs_f16"] != 1.0:
        fail(f"kv: f16 is the baseline: {kv[0]['results']}")

    # plot: needs matplotlib (this interpreter's or the checkout's .venv).
    py = None
    for cand in (sys.executable, os.path.join(a.source, ".venv", "bin", "python3")):
        if os.path.exists(cand) and subprocess.run([cand, "-c", "import matplotlib"], capture_output=True).returncode == 0:
            py = cand
            break
    if py is None:
        print("e2e, allreduce and tplinear lines ok")
        print("SKIP: plot: matplotlib is not installed (scripts/setup.sh --bench puts it into .venv/)")
        sys.exit(SKIP)
    p = run([py, runpy, "plot", out])
    want = ["e2e_scaling_tiny-llama2_none_p8.png", "e2e_concurrency_tiny-llama2_none_p8.png", "allreduce.png"]
    if any(r["results"].get("breakdown") for r in recs):
        want.append("e2e_breakdown_tiny-llama2_none_p8.png")
    for w in want:
        path = os.path.join(out, "plots", w)
        if not os.path.exists(path) or open(path, "rb").read(8) != b"\x89PNG\r\n\x1a\n":
            fail(f"plot: {path} is not a PNG; plot said:\n{p.stdout}\n{p.stderr}")
    print(f"run.py: e2e, allreduce, tplinear and plot ok ({len(want)} PNGs) in {out}")
    subprocess.run(["rm", "-rf", out])


if __name__ == "__main__":
    main()
