#!/usr/bin/env python3
"""`--device sim` (runtime/backend/sim/sim_device.h) end to end: the simulated llama-2-70b at
tp 4 x pp 2 under mpirun -np 8 (each stage step a fixed 1 ms) runs `lattice batch` over 64 requests
(16 prompt ids, 8 new tokens each):
  - it starts in seconds (no weights: load_seconds < 10) and finishes every request with exactly 8
    tokens, finish "length";
  - the tokens are the device's pseudo-tokens: hash(sequence id, position), never the eos id, so
    they equal this file's copy of the hash (requests get ids 0..63 in input order);
  - every KV block is back in the pool (kv_blocks_free == kv_blocks), the leader's stats show its
    steps (>= 8: each request needs 8 decode rounds) and plans (one per step at least, with bytes),
    the leader's CPU time in plan sends (within their wall time) and the steps' overrun;
  - a GPU name the device table lacks is refused naming it, before any rank starts.
Usage: test_sim_device.py LATTICE_BINARY   (exit 0 pass, 77 skip without mpirun, 1 fail)"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

lattice = sys.argv[1]
fails = []
MASK = (1 << 64) - 1
VOCAB, EOS = 32000, [2]  # llama-2-70b


def check(ok, what):
    if not ok:
        fails.append(what)
        print("FAILED:", what)


def pseudo_token(seq, position):
    """SimDevice::pseudo_token."""
    h = ((seq * 0x9E3779B97F4A7C15) & MASK) ^ ((position + 0x632BE59BD9B4E019) & MASK)
    h ^= h >> 31
    h = (h * 0xBF58476D1CE4E5B9) & MASK
    h ^= h >> 29
    t = h % VOCAB
    while t in EOS:
        t = (t + 1) % VOCAB
    return t


def main():
    p = subprocess.run([lattice, "generate", "--random-weights", "--config", "llama-2-70b", "--device", "sim",
                        "--sim-gpu", "no-such-gpu", "--prompt-ids", "5,6", "-n", "1"],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode != 0 and "no-such-gpu" in p.stderr and "a100-pcie-40gb" in p.stderr,
          f"an unknown --sim-gpu is refused naming it and the known ones: rc {p.returncode}, {p.stderr[-400:]!r}")
    mpirun = shutil.which("mpirun")
    if not mpirun:
        print("SKIP: no mpirun")
        return 77
    with tempfile.TemporaryDirectory() as d:
        inp, out, stats = (os.path.join(d, n) for n in ("in.jsonl", "out.jsonl", "stats.json"))
        rng = random.Random(7)
        with open(inp, "w") as f:
            for _ in range(64):
                f.write(json.dumps({"prompt": [rng.randrange(3, VOCAB) for _ in range(16)], "max_tokens": 8}) + "\n")
        cmd = [mpirun, "--oversubscribe", "--bind-to", "none", "-np", "8"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        cmd += [lattice, "batch", "--random-weights", "--config", "llama-2-70b", "--device", "sim", "--sim-step-ms",
                "1", "--tp", "4", "--pp", "2", "--input", inp, "--output", out, "--stats-json", stats, "--progress",
                "none"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        check(p.returncode == 0, f"sim batch exits 0: rc {p.returncode}, {p.stderr[-1500:]!r}")
        if p.returncode != 0:
            return 1
        st = json.load(open(stats))
        print(json.dumps({k: st.get(k) for k in ("load_seconds", "run_seconds", "steps", "plans_sent", "plan_bytes",
                                                 "plan_wait_seconds", "plan_cpu_seconds", "sim_overrun_seconds", "kv_blocks",
                                                 "kv_blocks_free")}))
        check(st["load_seconds"] < 10, f"starts in seconds: load_seconds {st['load_seconds']}")
        check(st["completed"] == 64 and st["errors"] == 0, f"64 completed, 0 errors: {st['completed']}, {st['errors']}")
        check(st["generated_tokens"] == 64 * 8, f"64 x 8 tokens: {st['generated_tokens']}")
        check(st["kv_blocks_free"] == st["kv_blocks"], f"every KV block back: {st['kv_blocks_free']} of {st['kv_blocks']}")
        check(st["steps"] >= 8, f"the leader's steps: {st['steps']}")
        check(0 <= st["plan_cpu_seconds"] <= st["plan_wait_seconds"] + 1e-3,
              f"the leader's CPU time in plan sends is part of their wall time: {st['plan_cpu_seconds']} of "
              f"{st['plan_wait_seconds']} s")
        check(0 <= st["sim_overrun_seconds"] < st["run_seconds"],
              f"the overrun of simulated steps is within the run: {st['sim_overrun_seconds']} s")
        check(st["plans_sent"] >= st["steps"] and st["plan_bytes"] > 0,
              f"a plan per step: {st['plans_sent']} plans ({st['plan_bytes']} bytes) for {st['steps']} steps")
        recs = [json.loads(l) for l in open(out)]
        check(len(recs) == 64, f"64 result lines: {len(recs)}")
        for r in recs:
            i = int(r["custom_id"].split("-")[1]) - 1  # line-N: request id N - 1
            want = [pseudo_token(i, 16 + k) for k in range(8)]
            ch = ((r.get("response") or {}).get("body") or {}).get("choices", [{}])[0]
            if ch.get("finish_reason") != "length" or ch.get("token_ids") != want:
                check(False, f"{r['custom_id']}: {ch.get('finish_reason')} {ch.get('token_ids')}, want length {want}")
                break
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
