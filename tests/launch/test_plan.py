#!/usr/bin/env python3
"""`lattice plan`: its validation against runs measured on this project's CPU machine, and its CLI.

1. Validation: benchmarks/validate_plan.py --check re-predicts every run recorded in
   benchmarks/results/*/plan_validation.json (one per machine) from the calibration measured with them
   and fails when a prediction (decode or prefill tokens/s) leaves +-25% of what was measured.
   (The runs are measured by `validate_plan.py --out` on a quiet machine, never inside ctest.)
2. The command: a recommendation for 70B on 4 A100s, the JSON form, "no layout fits" as exit 1,
   and bad input (unknown device, missing model, broken calibration file) named in one error line;
   Mixtral 8x7B's experts counted (46.7 B parameters held, 12.9 B active per token: its model card's); 4-bit
   weights on GPUs (W4A8 planned as W4A16, ~5/8 of int8's bytes; 70B fits 2 A100-40GB).
Usage: test_plan.py LATTICE REPO_ROOT
"""
import json
import os
import subprocess
import sys
import tempfile

lattice, root = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def plan(*args):
    return subprocess.run([lattice, "plan", *args], capture_output=True, text=True, timeout=120)


# 1. validation against measured runs: every record in benchmarks/results/*/plan_validation.json
#    (one per machine it was measured on)
import glob

build = os.path.dirname(os.path.dirname(lattice))
records = sorted(glob.glob(os.path.join(root, "benchmarks/results/*/plan_validation.json")))
check(len(records) >= 1, f"there are recorded validation runs ({records})")
for record in records:
    r = subprocess.run([sys.executable, os.path.join(root, "benchmarks/validate_plan.py"), "--build", build, "--check",
                        record], capture_output=True, text=True, timeout=300)
    print(record + "\n" + r.stdout + r.stderr)
    doc = json.load(open(record))
    layouts = {(x["tp"], x["pp"]) for x in doc["runs"]}
    check(len(layouts) >= 3 and {(1, 1), (2, 1), (1, 2)} <= layouts,
          f"{record}: the record covers 1x1, 2x1 and 1x2 ({sorted(layouts)})")
    check(r.returncode == 0, f"{record}: every recorded run is predicted within 25% (decode and prefill tokens/s)")

# 2. the command
r = plan("--model", "llama-2-70b", "--gpus", "4", "--gpu", "a100-pcie-40gb")
check(r.returncode == 0 and "recommended: tp 4 x pp 1" in r.stdout, "70B int8 on 4 A100 PCIe: tp 4 recommended")
r = plan("--model", "llama-2-70b", "--gpus", "8", "--gpu", "a100-pcie-40gb", "--quant", "fp16", "--json")
j = json.loads(r.stdout) if r.returncode == 0 else {}
lay = j.get("layouts", [])
check(len(lay) == 4 and all("decode_tokens_per_s" in x and x["memory_gib"]["total"] > 0 for x in lay if x["feasible"]),
      "--json: every layout of 8 GPUs with memory and speed")
check(j.get("recommended", {}).get("tp") == lay[0]["tp"] if lay else False, "--json: the first layout is the recommended one")
r = plan("--model", "mixtral-8x7b", "--gpus", "4", "--gpu", "a100-sxm-80gb", "--json")
j = json.loads(r.stdout) if r.returncode == 0 else {}
check(j.get("experts") == 8 and j.get("experts_per_token") == 2 and abs(j.get("parameters", 0) / 1e9 - 46.7) < 0.1 and
      abs(j.get("active_parameters", 0) / 1e9 - 12.9) < 0.1, "mixtral-8x7b: 8 experts, 2 per token, 46.7B held, 12.9B active")
lay = [x for x in j.get("layouts", []) if x["feasible"]]
# INT8: ~44 GiB of weights over 4 GPUs (each GPU holds a quarter of every expert and of attention).
check(len(lay) == 3 and all(10.5 < x["memory_gib"]["weights"] < 11.5 for x in lay),
      f"mixtral-8x7b w8a8 on 4 GPUs: ~11 GiB of weights per GPU in every layout ({[x['memory_gib']['weights'] for x in lay]})")
# 4-bit on GPUs (CUDA's W4A16 kernels): ~0.63 bytes a weight, so 70B fits 2 A100-40GB; W4A8 is planned as W4A16.
r8 = plan("--model", "llama-2-70b", "--gpus", "4", "--gpu", "a100-pcie-40gb", "--json")
r4 = plan("--model", "llama-2-70b", "--gpus", "4", "--gpu", "a100-pcie-40gb", "--quant", "w4a8", "--json")
j8 = json.loads(r8.stdout) if r8.returncode == 0 else {}
j4 = json.loads(r4.stdout) if r4.returncode == 0 else {}
w8 = [x["memory_gib"]["weights"] for x in j8.get("layouts", []) if x["tp"] == 4]
w4 = [x["memory_gib"]["weights"] for x in j4.get("layouts", []) if x["tp"] == 4]
check(j4.get("quant") == "w4a16" and len(w4) == 1 and len(w8) == 1 and 0.55 < w4[0] / w8[0] < 0.7,
      f"70B --quant w4a8 on 4 A100s: planned as w4a16, ~5/8 of int8's weight bytes ({w4} vs {w8} GiB, {r4.stderr.strip()!r})")
r = plan("--model", "llama-2-70b", "--gpus", "2", "--gpu", "a100-pcie-40gb", "--quant", "w4a16")
check(r.returncode == 0 and "recommended:" in r.stdout, f"70B w4a16 fits 2 A100-40GB ({r.stdout[-300:]!r} {r.stderr!r})")
r = plan("--model", "llama-2-70b", "--gpus", "1", "--gpu", "a10")
check(r.returncode == 1 and "no layout fits" in r.stdout, "70B on one A10: no layout fits, exit 1")
r = plan("--model", "llama-2-70b", "--gpus", "2", "--gpu", "a200")
check(r.returncode != 0 and "a100-pcie-40gb" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
      f"an unknown device: one line listing the known ones ({r.stderr.strip()!r})")
r = plan("--model", "/nonexistent/model", "--gpus", "2")
check(r.returncode != 0 and "/nonexistent/model" in r.stderr, "a missing model is named")
with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    f.write("{not json")
r = plan("--model", "tinyllama-1.1b", "--gpus", "2", "--gpu", "cpu", "--calibration", f.name)
check(r.returncode != 0 and f.name in r.stderr, "a broken calibration file is named")
os.unlink(f.name)
gguf = os.path.join(root, "models/SmolLM2-135M-Instruct.Q4_1.gguf")
if os.path.exists(gguf):
    r = plan("--model", gguf, "--gpus", "3", "--gpu", "cpu")
    check(r.returncode == 0 and "tp 3" in r.stdout and "30 layers" in r.stdout, "a GGUF file's shape (SmolLM2: 30 layers, tp 1 or 3)")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
