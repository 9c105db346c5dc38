"""Plots for benchmarks/run.py (`run.py plot DIR`): PNGs from DIR/results.jsonl (schema lattice-bench/1).

Of several points with the same bench and params the latest (by "time") is plotted. One figure per
question, the machine in every title, units on every axis:
  e2e_scaling_<model>_<quant>_p<prompt>.png      decode/prefill speedup and parallel efficiency vs ranks,
                                                 per layout family (tp only, pp only, tp x pp) and batch
  e2e_concurrency_<model>_<quant>_p<prompt>.png  aggregate decode tok/s and per-token latency vs batch
  e2e_breakdown_<model>_<quant>_p<prompt>.png    rank 0's time per decode/prefill step, stacked
                                                 (compute, communication, pipeline bubble, sampling, host)
  allreduce.png                                  busBw vs message size (memcpy ceiling), p50/p99 latency
  gemm.png                                       int8 GOP/s per core vs m, per n x k (int8 peak per core)
  attention.png                                  KV read GB/s vs context length (stream-read ceiling)
  sim_<model>_<gpu>.png                          the simulated device (run.py sim): tokens/s per layout
                                                 beside the planner's prediction, and the leader's plan wait
Speedup = decode (prefill) tok/s of a layout / that of 1x1 at the same model, quant, batch and prompt;
efficiency = speedup / ranks."""
import collections
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PARTS = [("compute", "compute", "#4c72b0"), ("communication", "communication", "#dd8452"),
         ("pipeline_bubble", "pipeline bubble", "#c44e52"), ("sampling", "sampling", "#55a868"),
         ("host_overhead", "host overhead", "#8172b3")]
DPI = 100


def load(d):
    path = d if d.endswith(".jsonl") else os.path.join(d, "results.jsonl")
    latest = {}
    with open(path) as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except ValueError:
                print(f"plot: {path}:{n}: not JSON, skipped", file=sys.stderr)
                continue
            if r.get("schema") != "lattice-bench/1":
                continue
            if r["bench"] == "e2e" and r["params"].get("extra"):
                continue  # the plots show lattice's default configuration; --extra runs stay in the tables
            key = (r["bench"], json.dumps(r["params"], sort_keys=True))
            if key not in latest or r["time"] >= latest[key]["time"]:
                latest[key] = r
    by = collections.defaultdict(list)
    for r in latest.values():
        by[r["bench"]].append(r)
    return by


def machine_line(recs):
    ms = collections.Counter()
    for r in recs:
        m = r.get("machine", {})
        cpu = m.get("cpu", "?")
        if m.get("cpu_family_model"):
            cpu += f" (family/model {m['cpu_family_model']})"
        isa = m.get("isa") or []
        best = next((i for i in ("amx_int8", "avx512_vnni", "avx512f", "avx_vnni", "avx2") if i in isa), None)
        ms[f"{cpu}, {m.get('cores', '?')} cores" + (f", {best}" if best else "") +
           (f", {m['mem_gib']:.0f} GiB" if m.get("mem_gib") else "")] += 1
    dates = sorted(r["time"][:10] for r in recs)
    when = dates[0] if dates[0] == dates[-1] else f"{dates[0]}..{dates[-1]}"
    return f"{ms.most_common(1)[0][0]}; {when}"


def slug(s):
    return re.sub(r"[^A-Za-z0-9.]+", "-", str(s)).strip("-")


def save(fig, plots, name, made):
    path = os.path.join(plots, name)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    made.append(path)


def family(tp, pp):
    return "tp only" if pp == 1 else "pp only" if tp == 1 else "tp x pp"


def e2e_groups(recs):
    groups = collections.defaultdict(list)
    for r in recs:
        p = r["params"]
        groups[(p["model"], p["quant"], p["prompt"])].append(r)
    return groups


def plot_scaling(recs, plots, made, notes):
    for (model, quant, prompt), rs in sorted(e2e_groups(recs).items()):
        base = {(r["params"]["batch"]): r["results"] for r in rs if (r["params"]["tp"], r["params"]["pp"]) == (1, 1)}
        if not base or len({r["params"]["ranks"] for r in rs}) < 2:
            notes.append(f"e2e scaling {model} {quant} p{prompt}: needs 1x1 and a multi-rank layout")
            continue
        fig, ax = plt.subplots(2, 2, figsize=(11, 8), sharex=True, layout="constrained")
        max_r = max(r["params"]["ranks"] for r in rs)
        for row, metric, what in ((0, "decode_tokens_per_s", "decode"), (1, "prefill_tokens_per_s", "prefill")):
            lines = collections.defaultdict(list)
            for r in rs:
                p, b = r["params"], base.get(r["params"]["batch"])
                if not b or not b.get(metric) or not r["results"].get(metric):
                    continue
                fams = [family(p["tp"], p["pp"])] if p["ranks"] > 1 else ["tp only", "pp only"]
                for fam in fams:
                    lines[(fam, p["batch"])].append((p["ranks"], r["results"][metric] / b[metric]))
            for (fam, batch), pts in sorted(lines.items()):
                pts.sort()
                xs, sp = [x for x, _ in pts], [y for _, y in pts]
                style = {"tp only": "-o", "pp only": "--s", "tp x pp": ":^"}[fam]
                lbl = f"{fam}, batch {batch}"
                ax[row][0].plot(xs, sp, style, label=lbl)
                ax[row][1].plot(xs, [s / x for s, x in zip(sp, xs)], style, label=lbl)
            ax[row][0].plot([1, max_r], [1, max_r], color="gray", lw=1, ls=":", label="ideal")
            ax[row][1].axhline(1.0, color="gray", lw=1, ls=":", label="ideal")
            ax[row][0].set_ylabel(f"{what} speedup over 1x1 (x)")
            ax[row][1].set_ylabel(f"{what} parallel efficiency (speedup / ranks)")
            ax[row][0].set_title(f"{what}: speedup")
            ax[row][1].set_title(f"{what}: parallel efficiency")
            ax[row][1].set_ylim(0, max(1.15, ax[row][1].get_ylim()[1]))
        for a in ax.flat:
            a.grid(alpha=0.3)
            a.set_xticks(sorted({r["params"]["ranks"] for r in rs}))
        for a in ax[1]:
            a.set_xlabel("MPI ranks (tp x pp)")
        ax[0][0].legend(fontsize=8)
        fig.suptitle(f"lattice scaling on CPU ranks: {model}, {quant}, prompt {prompt} tokens, "
                     f"{rs[0]['params']['max_new_tokens']} new tokens, {rs[0]['params'].get('threads')} thread(s)/rank\n"
                     f"{machine_line(rs)}", fontsize=10)
        save(fig, plots, f"e2e_scaling_{slug(model)}_{quant}_p{prompt}.png", made)


def plot_concurrency(recs, plots, made, notes):
    for (model, quant, prompt), rs in sorted(e2e_groups(recs).items()):
        if len({r["params"]["batch"] for r in rs}) < 2:
            notes.append(f"e2e concurrency {model} {quant} p{prompt}: one batch size only")
            continue
        fig, ax = plt.subplots(1, 2, figsize=(11, 4.5), layout="constrained")
        lines = collections.defaultdict(list)
        for r in rs:
            lines[(r["params"]["ranks"], r["params"]["pp"], r["params"]["tp"])].append(r)
        for (_, pp, tp), lr in sorted(lines.items()):
            lr.sort(key=lambda r: r["params"]["batch"])
            xs = [r["params"]["batch"] for r in lr]
            ax[0].plot(xs, [r["results"]["decode_tokens_per_s"] for r in lr], "-o", label=f"tp {tp} x pp {pp}")
            ax[1].plot(xs, [r["results"]["per_token_latency_ms"] for r in lr], "-o", label=f"tp {tp} x pp {pp}")
        ax[0].set_ylabel("decode throughput, all sequences (tokens/s)")
        ax[1].set_ylabel("per-token latency of a sequence (ms / token)")
        ax[0].set_title("aggregate decode throughput")
        ax[1].set_title("decode latency per token")
        for a in ax:
            a.set_xscale("log", base=2)
            a.set_xticks(sorted({r["params"]["batch"] for r in rs}))
            a.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            a.set_xlabel("concurrent sequences (batch)")
            a.set_ylim(bottom=0)
            a.grid(alpha=0.3)
            a.legend(fontsize=8)
        fig.suptitle(f"lattice decode vs concurrency: {model}, {quant}, prompt {prompt} tokens\n{machine_line(rs)}",
                     fontsize=10)
        save(fig, plots, f"e2e_concurrency_{slug(model)}_{quant}_p{prompt}.png", made)


def plot_breakdown(recs, plots, made, notes):
    have = [r for r in recs if r["results"].get("breakdown")]
    if not have:
        notes.append("e2e breakdown: no point has a per-step breakdown (this lattice's --stats-json predates it): "
                     "no breakdown plot")
        return
    for (model, quant, prompt), rs in sorted(e2e_groups(have).items()):
        rs.sort(key=lambda r: (r["params"]["batch"], r["params"]["ranks"], r["params"]["pp"]))
        labels = [f"{r['params']['tp']}x{r['params']['pp']}\nb{r['params']['batch']}" for r in rs]
        fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rs) + 3), 4.8), layout="constrained")
        bottom = [0.0] * len(rs)
        for key, name, color in PARTS:
            vals = [1e3 * r["results"]["breakdown"]["rank0"].get(key, 0.0) / r["results"]["breakdown"]["steps"]
                    for r in rs]
            ax.bar(labels, vals, bottom=bottom, label=name, color=color)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_ylabel("rank 0 time per engine step (ms)")
        ax.set_xlabel("layout tp x pp, batch (concurrent sequences)")
        ax.legend(fontsize=8, loc="upper left")
        ax.grid(axis="y", alpha=0.3)
        fig.suptitle(f"where a step's time goes (rank 0, wall seconds / steps): {model}, {quant}, prompt {prompt}\n"
                     f"{machine_line(rs)}", fontsize=10)
        save(fig, plots, f"e2e_breakdown_{slug(model)}_{quant}_p{prompt}.png", made)


def size_label(b, _pos=None):
    for unit, sh in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << sh:
            return f"{b / (1 << sh):g}{unit}"
    return f"{b:g}"


def plot_allreduce(recs, plots, made, notes):
    if not recs:
        return
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.8), layout="constrained")
    lines = collections.defaultdict(list)
    for r in recs:
        p = r["params"]
        lines[(p["ranks"], p["comm"], p["dtype"])].append(r)
    for i, ((ranks, comm, dtype), lr) in enumerate(sorted(lines.items())):
        lr.sort(key=lambda r: r["params"]["bytes"])
        xs = [r["params"]["bytes"] for r in lr]
        c = f"C{i}"
        ax[0].plot(xs, [r["results"]["busbw_gbps"] for r in lr], "-o", ms=3, color=c, label=f"{ranks} ranks, {comm}, {dtype}")
        if lr[0]["results"].get("p50_us") is not None:
            ax[1].plot(xs, [r["results"]["p50_us"] for r in lr], "-o", ms=3, color=c, label=f"{ranks} ranks, {comm} p50")
            ax[1].plot(xs, [r["results"]["p99_us"] for r in lr], "--", color=c, label=f"{ranks} ranks, {comm} p99")
        else:
            ax[1].plot(xs, [r["results"]["time_us"] for r in lr], "-o", ms=3, color=c, label=f"{ranks} ranks, {comm} mean")
    cp = [r["ceilings"].get("memcpy_gbps") for r in recs if r["ceilings"].get("memcpy_gbps")]
    if cp:
        ax[0].axhline(max(cp), color="gray", ls=":", label=f"ceiling: 1-thread memcpy {max(cp):.1f} GB/s")
    ax[0].set_ylabel("bus bandwidth busBw (GB/s)")
    ax[0].set_title("all-reduce bus bandwidth (algBw x 2(n-1)/n)")
    ax[1].set_ylabel("time per all-reduce, slowest rank (us)")
    ax[1].set_title("all-reduce latency (p50 solid, p99 dashed)")
    ax[1].set_yscale("log")
    for a in ax:
        a.set_xscale("log", base=2)
        a.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=4))
        a.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(size_label))
        a.set_xlabel("message size (bytes)")
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.suptitle(f"MPI all-reduce sum (bench_allreduce)\n{machine_line(recs)}", fontsize=10)
    save(fig, plots, "allreduce.png", made)


def plot_gemm(recs, plots, made, notes):
    cpu = [r for r in recs if r["params"].get("device") == "cpu" and r["params"]["isa"] != "scalar"]
    if not cpu:
        return
    shapes = sorted({(r["params"]["n"], r["params"]["k"]) for r in cpu})
    fig, ax = plt.subplots(1, len(shapes), figsize=(5.5 * len(shapes), 4.6), squeeze=False, sharey=True,
                           layout="constrained")
    for a, (n, k) in zip(ax[0], shapes):
        lines = collections.defaultdict(list)
        for r in cpu:
            p = r["params"]
            if (p["n"], p["k"]) == (n, k):
                lines[(p["isa"], p["mode"], p["kind"])].append(r)
        colors = {im: f"C{i}" for i, im in enumerate(sorted({(k[0], k[1]) for k in lines}))}
        for (isa, mode, kind), lr in sorted(lines.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] != "hot")):
            lr.sort(key=lambda r: r["params"]["m"])
            xs = [r["params"]["m"] for r in lr]
            style = "-o" if kind == "hot" else "x"
            a.plot(xs, [r["results"]["gops_core"] for r in lr], style, ms=6 if kind != "hot" else 4,
                   color=colors[(isa, mode)],
                   label=f"{isa} {mode}" + ("" if kind == "hot" else f" ({kind}: weights from DRAM)"))
        peak = cpu[0]["ceilings"].get("int8_peak_gops_core")
        if peak:
            a.axhline(peak, color="gray", ls=":", label=f"int8 peak/core {peak:.0f} ({cpu[0]['ceilings'].get('int8_peak_kind')})")
        a.set_xscale("log", base=2)
        a.set_xticks(sorted({r["params"]["m"] for r in cpu}))
        a.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        a.set_xlabel("m (rows of activations = tokens)")
        a.set_title(f"n x k = {n} x {k}")
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    ax[0][0].set_ylabel("GOP/s per core (thread CPU time)")
    fig.suptitle(f"INT8 GEMM (bench_gemm_int8)\n{machine_line(cpu)}", fontsize=10)
    save(fig, plots, "gemm.png", made)


def plot_attention(recs, plots, made, notes):
    if not recs:
        return
    fig, ax = plt.subplots(figsize=(7, 4.6), layout="constrained")
    lines = collections.defaultdict(list)
    for r in recs:
        lines[(r["params"]["batch"], r["params"]["mode"])].append(r)
    for (batch, mode), lr in sorted(lines.items()):
        lr.sort(key=lambda r: r["params"]["ctx"])
        ax.plot([r["params"]["ctx"] for r in lr], [r["results"]["kv_gbs"] for r in lr], "-o",
                label=f"batch {batch}" + (" (hot cache)" if mode == "hot" else ""))
    bw = max(r["ceilings"]["read_bw_gbs"] for r in recs)
    ax.axhline(bw, color="gray", ls=":", label=f"ceiling: stream read {bw:.1f} GB/s")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({r["params"]["ctx"] for r in recs}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("context length (positions in the KV cache)")
    ax.set_ylabel("KV cache read (GB/s)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    p = recs[0]["params"]
    fig.suptitle(f"paged decode attention, heads {p['n_heads']}/{p['n_kv_heads']} x {p['head_dim']}, "
                 f"{p['threads']} threads, "
                 f"{'one hot cache' if p['mode'] == 'hot' else 'caches rotated per layer (>= 1 GiB)'}\n{machine_line(recs)}", fontsize=10)
    save(fig, plots, "attention.png", made)


def plot_sim(recs, plots, made, notes):
    groups = collections.defaultdict(list)
    for r in recs:
        p = r["params"]
        groups[(p["model"], p["sim_gpu"], p["sim_link"], p["requests"], p["prompt"], p["max_new_tokens"])].append(r)
    for (model, gpu, link, n, prompt, new), rs in sorted(groups.items()):
        rs.sort(key=lambda r: (-r["params"]["tp"], r["params"]["pp"]))
        names = [f"{r['params']['tp']}x{r['params']['pp']}" for r in rs]
        x = range(len(rs))
        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
        a.bar([i - 0.2 for i in x], [r["results"]["tokens_per_s"] for r in rs], 0.4, label="simulated run")
        a.bar([i + 0.2 for i in x], [r["ceilings"].get("predicted_tokens_per_s") or 0 for r in rs], 0.4,
              label="lattice plan")
        a.set_xticks(list(x), names)
        a.set_xlabel("tp x pp")
        a.set_ylabel("generated tokens / s (whole run)")
        a.legend()
        b.bar(list(x), [100 * (r["results"].get("plan_wait_share") or 0) for r in rs], 0.5, color="#c44e52",
              label="in plan sends")
        b.bar(list(x), [100 * (r["results"].get("plan_cpu_share") or 0) for r in rs], 0.5, color="#55a868",
              label="of which the leader ran (CPU)")
        b.bar(list(x), [100 * (r["results"].get("plan_blocked_share") or 0) for r in rs], 0.5, color="#4c72b0",
              label="of which waiting on a follower")
        b.axhline(5, color="gray", ls="--", lw=1)
        b.set_xticks(list(x), names)
        b.set_xlabel("tp x pp")
        b.set_ylabel("% of the run (leader)")
        b.legend()
        fig.suptitle(f"--device sim: {model} on {gpu} / {link}, {n} requests of {prompt} in / {new} out\n"
                     f"{machine_line(rs)}", fontsize=10)
        save(fig, plots, f"sim_{slug(model)}_{slug(gpu)}.png", made)


def plot_dir(d, plots=None):
    by = load(d)
    plots = plots or os.path.join(d if os.path.isdir(d) else os.path.dirname(d), "plots")
    os.makedirs(plots, exist_ok=True)
    made, notes = [], []
    e2e = by.get("e2e", [])
    if e2e:
        plot_scaling(e2e, plots, made, notes)
        plot_concurrency(e2e, plots, made, notes)
        plot_breakdown(e2e, plots, made, notes)
    plot_allreduce(by.get("allreduce", []), plots, made, notes)
    plot_gemm(by.get("gemm", []), plots, made, notes)
    plot_attention(by.get("attention", []), plots, made, notes)
    plot_sim(by.get("sim", []), plots, made, notes)
    for n in notes:
        print(f"plot: note: {n}")
    for m in made:
        print(f"plot: wrote {m}")
    if not made:
        print(f"plot: nothing to plot in {d}")
    return 0
