#!/usr/bin/env python3
"""The reporting half of benchmarks/gpu/check.sh: everything it writes that is more than a line of shell.

  summary WORK OUT                  summary.json and summary.txt from WORK/steps.tsv (finished steps),
                                    WORK/current (the step running now, if any), WORK/meta.json (stage,
                                    budget, start time, GPU, environment) and the steps' JSON files;
                                    both written to a temporary name and renamed, so a run killed at
                                    any point leaves the last complete summary, never half of one.
                                    summary.txt ends with the verdict of every test: status, seconds,
                                    seed, the first CUDA error, and for a failure its rerun with the same
                                    seed and its memcheck.
  note KIND PATH                    one line for a step's note: tests | diagnose | sanitize (the
                                    runner's JSON) or gemm | attention | decode | e2e (a benchmark's)
  device JSON FIELDS VALUES         the nvidia-smi fields and PyTorch's device properties -> JSON
  nccl JSON WHEEL_ROOT KIT_HEADER   the NCCL wheel's library version (ncclGetVersion via ctypes) and
                                    header versions -> JSON; prints one line for the environment
Standard library only; never raises on a missing or partial input (a step that did not run has none).
"""
import ctypes
import json
import os
import re
import sys
import time


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except Exception:
        return None


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def read_steps(work):
    steps = []
    try:
        lines = open(os.path.join(work, "steps.tsv")).read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split("\t")
        if len(parts) != 6:
            continue  # a line being appended when the run was killed
        name, status, secs, deadline, needs_gpu, note = parts
        steps.append({"name": name, "status": status, "seconds": float(secs), "deadline_s": float(deadline),
                      "needs_gpu": needs_gpu == "1", "note": note})
    try:
        name, started, deadline = open(os.path.join(work, "current")).read().split("\t")[:3]
        steps.append({"name": name, "status": "RUNNING", "seconds": round(time.time() - float(started), 1),
                      "deadline_s": float(deadline), "needs_gpu": None,
                      "note": "running when this summary was written (a cut-off run ends here)"})
    except (OSError, ValueError):
        pass
    return steps


def test_lines(tests):
    """The per-test verdicts: one line each, then the diagnosis of each failure."""
    if not tests or not tests.get("runs"):
        return []
    lines = ["", f"{'test':<28} {'status':<8} {'seconds':>7}  {'seed':<20} first CUDA error / failing cases"]
    for r in sorted(tests["runs"], key=lambda r: (r["status"] in ("PASS", "SKIP"), r["name"])):
        what = r.get("first_cuda_error") or ", ".join(r.get("failed_cases") or [])
        echo = "" if r.get("seed_echoed") in (True, None) else " (seed NOT echoed)"
        lines.append(f"{r['name']:<28} {r['status']:<8} {r.get('seconds', 0):>7}  {str(r.get('seed', '-')):<20} "
                     f"{what[:110]}{echo}")
        d = r.get("diagnosis") or {}
        if "rerun" in d:
            rr, mc = d["rerun"], d.get("memcheck", {})
            lines.append(f"    rerun, same seed, CUDA_LAUNCH_BLOCKING=1: {rr['status']} ("
                         f"{'reproduced' if d.get('reproduced') else 'NOT reproduced'}) {rr.get('first_cuda_error', '')[:80]}")
            lines.append(f"    compute-sanitizer memcheck: {mc.get('status')} {mc.get('summary', '')} "
                         f"{mc.get('first_error', '')[:90]}".rstrip())
        elif d.get("note"):
            lines.append(f"    not diagnosed: {d['note']}")
    return lines


def summary(work, out):
    meta = load(os.path.join(work, "meta.json")) or {}
    steps = read_steps(work)
    elapsed = time.time() - meta.get("t0", time.time())
    tests = load(os.path.join(work, "tests.json"))
    doc = dict(meta, check="lattice benchmarks/gpu/check.sh v3", elapsed_s=round(elapsed, 1), steps=steps,
               tests=tests, diagnose=load(os.path.join(work, "diagnose.json")),
               sanitize=load(os.path.join(work, "sanitize.json")), device=load(os.path.join(work, "device.json")),
               nccl=load(os.path.join(work, "nccl.json")), gemm=load(os.path.join(out, "gemm.json")),
               attention=load(os.path.join(work, "attention.json")), decode=load(os.path.join(out, "decode.json")),
               e2e=load(os.path.join(work, "e2e.json")))
    write_atomic(os.path.join(out, "summary.json"), json.dumps(doc, indent=2) + "\n")
    gpu = meta.get("gpu")
    lines = [f"lattice GPU check, stage {meta.get('stage', '?')}: "
             f"{gpu + ' (sm_' + str(meta.get('sm')) + ')' if gpu else 'NO GPU on this machine (GPU steps SKIP)'}",
             f"  {meta.get('environment', '')}",
             f"  {elapsed:.0f} s of the {meta.get('budget_s', '?')} s budget",
             f"{'step':<10} {'status':<8} {'seconds':>7}  note"]
    for s in steps:
        lines.append(f"{s['name']:<10} {s['status']:<8} {s['seconds']:>7.1f}  {s['note']}")
    bad = [s["name"] for s in steps if s["status"] in ("FAIL", "TIMEOUT")]
    skipped = [s["name"] for s in steps if s["status"] == "SKIP"]
    running = [s["name"] for s in steps if s["status"] == "RUNNING"]
    lines.append("result: " + ("FAILED: " + ", ".join(bad) if bad else "no step failed") +
                 (f"; skipped: {', '.join(skipped)}" if skipped else "") +
                 (f"; still running: {', '.join(running)}" if running else ""))
    lines += test_lines(tests)
    text = "\n".join(lines) + "\n"
    write_atomic(os.path.join(out, "summary.txt"), text)
    return text


def note(kind, path):
    d = load(path)
    if d is None:
        return ""
    if kind == "tests":
        bad = [f"{r['name']} {r['status']} (seed {r.get('seed')})" for r in d["runs"] if r["status"] in ("FAIL", "TIMEOUT")]
        s = f"{d['passed']} passed, {d['failed']} failed, {d['timed_out']} timed out, {d['skipped']} skipped"
        if d.get("not_run"):
            s += f", {d['not_run']} not run"
        unfinished = [n for n in d.get("tests", []) if n not in {r["name"] for r in d["runs"]}]
        if unfinished:  # the runner was cut off by the step's deadline while these ran or waited
            s += f", {len(unfinished)} not finished: {', '.join(unfinished)}"
        if bad:
            s += ": " + "; ".join(bad)
        elif d["passed"] == 0 and d.get("skip_reasons"):
            s += f" ({d['skip_reasons'][0]})"
        return s
    if kind == "diagnose":
        parts = []
        for r in d["runs"]:
            dg = r.get("diagnosis") or {}
            if "rerun" not in dg:
                parts.append(f"{r['name']}: not diagnosed ({dg.get('note', '?')})")
                continue
            parts.append(f"{r['name']}: {'reproduced' if dg['reproduced'] else 'NOT reproduced'} with seed "
                         f"{r['seed']}, memcheck {dg['memcheck']['status']}")
        return "; ".join(parts) or "no failure to diagnose"
    if kind == "sanitize":
        by = {}
        for r in d["runs"]:
            tool = r["name"].split(":")[0]
            by.setdefault(tool, []).append(r["status"])
        return ", ".join(f"{t}: " + ", ".join(f"{st.count(x)} {x}" for x in ("PASS", "FAIL", "INCOMPLETE", "NOT RUN")
                                               if st.count(x)) for t, st in by.items())
    if kind == "gemm":
        r = [x for x in d["rows"] if x["kernel"].startswith("int8")]
        head = [x for x in r if x["m"] == x["n"] == x["k"] == 4096]
        line = (f"int8 4096^3 {head[0]['tops']:.0f} TOPS = {head[0]['pct_peak']:.0f}% of {d['peaks']['int8_tops']:.0f}"
                if head else "no 4096^3 row")
        return line + f"; {len(d['rows'])} rows" + ("" if d.get("complete") else " (cut at its deadline)")
    if kind == "attention":
        return ", ".join(f"ctx {x['ctx']} b{x['batch']} {x['pct_copy']:.0f}%" for x in d["rows"]) + " of the copy bandwidth"
    if kind == "decode":
        parts = []
        for sec in d.get("sections", []):
            p = []
            for key in ("slope", "graph", "engine"):
                b1 = [x for x in sec.get(key, []) if x["batch"] == 1]
                if b1:
                    p.append(f"{key} {b1[0]['pct_of_floor']:.0f}%" +
                             (f" ({b1[0]['tokens_per_s']:.0f} tok/s)" if key == "engine" else ""))
            parts.append(f"{sec['shape']} b1: " + (", ".join(p) or "nothing measured"))
        return ("; ".join(parts) + " of the floor" if parts else "no section") + \
            ("" if d.get("complete", True) else " (cut at its deadline)")
    if kind == "e2e":
        return f"{d['decode_tokens_per_s']:.0f} tok/s (load {d['load_seconds']:.0f} s)"
    return ""


def device(path, fields, values):
    doc = {"nvidia_smi": dict(zip(fields.split(","), [v.strip() for v in values.split(",")]))}
    try:
        import torch
        p = torch.cuda.get_device_properties(0)
        doc["properties"] = {"name": p.name, "sm_count": p.multi_processor_count,
                             "l2_bytes": getattr(p, "L2_cache_size", None), "memory_bytes": p.total_memory,
                             "torch": torch.__version__, "torch_cuda": torch.version.cuda}
    except Exception as e:
        doc["properties"] = {"error": f"{e.__class__.__name__}: {e}"}
    write_atomic(path, json.dumps(doc, indent=2))
    s, p = doc["nvidia_smi"], doc["properties"]
    print("SM %s/%s, power cap %s, MIG %s, ECC %s, %s SMs" % (
        s.get("clocks.sm"), s.get("clocks.max.sm"), s.get("power.limit"), s.get("mig.mode.current"),
        s.get("ecc.mode.current"), p.get("sm_count", "?")))


def header_version(h):
    try:
        t = open(h).read()
        return ".".join(re.search(rf"#define NCCL_{k} (\d+)", t).group(1) for k in ("MAJOR", "MINOR", "PATCH"))
    except Exception:
        return None


def nccl(path, root, kit_h):
    doc = {"wheel": root or None, "library": None, "wheel_header": None, "kit_header": header_version(kit_h)}
    if root:
        v = ctypes.c_int()
        try:
            ctypes.CDLL(os.path.join(root, "lib", "libnccl.so.2")).ncclGetVersion(ctypes.byref(v))
            code = v.value
            doc["library"] = f"{code // 10000}.{code // 100 % 100}.{code % 100}" if code >= 10000 else str(code)
        except Exception as e:
            doc["library"] = f"not loadable: {e}"
        doc["wheel_header"] = header_version(os.path.join(root, "include", "nccl.h"))
    write_atomic(path, json.dumps(doc, indent=2))
    if not root:
        print("no NCCL wheel")
    else:
        wh = doc["wheel_header"]
        print(f"NCCL {doc['library']} (header: {'wheel ' + wh if wh else 'kit ' + str(doc['kit_header'])})")


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    try:
        if cmd == "summary":
            print(summary(*args), end="")
        elif cmd == "note":
            print(note(*args))
        elif cmd == "device":
            device(*args)
        elif cmd == "nccl":
            nccl(*args)
        else:
            sys.exit(__doc__)
    except Exception as e:  # a report must never stop the check
        print(f"(check_report {cmd}: {e.__class__.__name__}: {e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
