#!/usr/bin/env python3
"""The LoRA fronts end to end on the golden tiny-llama2 and its fixture adapters (tests/runtime/model/lora):
prompt scoring with an adapter (echo + logprobs, prompt_logprobs, `lattice score --lora`) applies it, in
`lattice batch`, `lattice serve` and `lattice score`.

1. `lattice batch` generates 6 greedy tokens with logprobs for the prompt under a4, b16 and the base.
2. `lattice batch` echoes prompt + those tokens (max_tokens 0, logprobs 1) under the same model: each generated
   token's prompt logprob equals its generate-side logprob (1e-4), and a4's differ from the base's scoring.
3. `lattice score --lora a4=...` of the same ids: its log-softmax gives the same logprobs.
4. `lattice serve --max-loras 1` (when the build has it): echo under b16 and prompt_logprobs under a4 give the
   batch's values.
Usage: test_lora_fronts.py LATTICE_BINARY SHARED_DIR SOURCE_DIR   (exit 0: pass)"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import serve_harness
from serve_harness import check, fails

lattice, shared, source = sys.argv[1], sys.argv[2], sys.argv[3]
base = os.path.join(shared, "golden", "tiny-llama2")
fixtures = os.path.join(source, "tests", "runtime", "model", "lora", "tiny-llama2")
loras = [f"{a}={os.path.join(fixtures, a)}" for a in ("a4", "b16")]
PROMPT = [1, 5, 9, 12, 40]
N = 6


def lora_flags():
    return [x for l in loras for x in ("--lora", l)]


def batch(tmp, name, bodies):
    """The response bodies of `lattice batch` on these completions bodies, by custom_id."""
    inp, out = os.path.join(tmp, name + ".jsonl"), os.path.join(tmp, name + ".out.jsonl")
    with open(inp, "w") as f:
        for cid, body in bodies.items():
            f.write(json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/completions", "body": body}) + "\n")
    p = subprocess.run([lattice, "batch", "--model", base, *lora_flags(), "--input", inp, "--output", out],
                       capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, f"batch {name}: rc {p.returncode}: {p.stderr[-400:]}")
    got = {}
    for line in open(out):
        r = json.loads(line)
        check(r["response"]["status_code"] == 200, f"batch {name}: {r['custom_id']}: {line[:300]}")
        got[r["custom_id"]] = r["response"]["body"]
    return got


def close(a, b, tol=1e-4):
    return len(a) == len(b) and all(abs(x - y) < tol for x, y in zip(a, b))


def score_logprobs(tmp, ids, lora):
    """The logprob of each id after the first under `lattice score --lora`."""
    out = os.path.join(tmp, "score.safetensors")
    p = subprocess.run([lattice, "score", "--model", base, "--lora", lora, "--prompt-ids", ",".join(map(str, ids)),
                        "--out", out], capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, f"score: rc {p.returncode}: {p.stderr[-400:]}")
    data = open(out, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    e = json.loads(data[8:8 + n])["logits"]
    T, V = e["shape"]
    flat = struct.unpack(f"<{T * V}f", data[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]])
    lps = []
    for i in range(1, T):
        row = flat[(i - 1) * V:i * V]
        m = max(row)
        lse = m + math.log(sum(math.exp(x - m) for x in row))
        lps.append(row[ids[i]] - lse)
    return lps


def serve_check(ids, want):
    """`lattice serve --max-loras 1`: echo under b16, prompt_logprobs under a4, against the batch's values."""
    s = serve_harness.Server([lattice, "serve", "--model", base, *lora_flags(), "--max-loras", "1", "--port", "0"],
                             ready_s=120)
    try:
        def post(body):
            return s.request_json("POST", "/v1/completions", body, timeout=120)

        st, b = post({"model": "b16", "prompt": ids["b16"], "max_tokens": 0, "echo": True, "logprobs": 1})
        check(st == 200, f"serve echo b16: {st} {b}")
        if st == 200:
            got = b["choices"][0]["logprobs"]["token_logprobs"][len(PROMPT):]
            check(close(got, want["b16"]), f"serve echo b16: {got} vs {want['b16']}")
        st, b = post({"model": "a4", "prompt": ids["a4"], "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0})
        check(st == 200, f"serve prompt_logprobs a4: {st} {b}")
        if st == 200:
            pl = b["choices"][0]["prompt_logprobs"]
            got = [next(v["logprob"] for k, v in pl[i].items() if int(k) == ids["a4"][i])
                   for i in range(len(PROMPT), len(ids["a4"]))]
            check(close(got, want["a4"]), f"serve prompt_logprobs a4: {got} vs {want['a4']}")
        print("serve --max-loras 1: echo under b16 and prompt_logprobs under a4 checked", flush=True)
    finally:
        s.stop(what="serve --max-loras 1")


def main():
    with tempfile.TemporaryDirectory(prefix="lattice_lora_fronts") as tmp:
        who = {"a4": "a4", "b16": "b16", "base": None}
        gen = batch(tmp, "gen", {k: {**({"model": m} if m else {}), "prompt": PROMPT, "max_tokens": N,
                                     "temperature": 0, "logprobs": 1} for k, m in who.items()})
        ids, want = {}, {}
        for k in who:
            c = gen[k]["choices"][0]
            ids[k] = PROMPT + c["token_ids"]
            want[k] = c["logprobs"]["token_logprobs"]
        check(ids["a4"] != ids["base"] and ids["b16"] != ids["base"], f"the adapters change the output: {ids}")
        bodies = {k: {**({"model": m} if m else {}), "prompt": ids[k], "max_tokens": 0, "echo": True,
                      "logprobs": 1} for k, m in who.items()}
        bodies["a4-on-base"] = {"prompt": ids["a4"], "max_tokens": 0, "echo": True, "logprobs": 1}
        echo = batch(tmp, "echo", bodies)
        scored = {k: echo[k]["choices"][0]["logprobs"]["token_logprobs"][len(PROMPT):] for k in bodies}
        for k in who:
            check(close(scored[k], want[k]), f"batch echo {k}: {scored[k]} vs generate's {want[k]}")
        check(not close(scored["a4-on-base"], want["a4"], 1e-2), "the base scores a4's tokens otherwise")
        check(close(score_logprobs(tmp, ids["a4"], loras[0])[len(PROMPT) - 1:], want["a4"]), "score --lora a4")
        if "serve" in subprocess.run([lattice, "--help"], capture_output=True, text=True).stdout:
            serve_check(ids, want)
        else:
            print("lattice serve is not built (no Boost): its part skipped")
    print("FAILED" if fails else "OK", f"({len(fails)} failure(s))")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
