#!/usr/bin/env bash
# A simulated cluster of 2 nodes x 4 GPUs on one machine: `lattice batch --device sim` on 8 ranks over
# two emulated hosts (tests/hosts/hosts_lib.sh: a network + UTS namespace each, TCP between them), the
# link between the hosts shaped to the planner's inter-node link, beside `lattice plan`'s prediction
# for the same cluster (--nodes 2 --inter-node-link L). Not a test: a benchmark (root, ~2 min).
#   benchmarks/sim_hosts.sh [--link ib-hdr100] [--requests 64] [--prompt 512] [--max-new-tokens 128]
#                           [--preset llama-2-70b] [--sim-gpu a100-pcie-40gb] [--sim-link pcie4]
#                           [--layouts "4x2 8x1 4x2@1"] [--out bench-results/sim-hosts] [--no-shape]
# Layouts: 4x2 is tp 4 inside each host and one pipeline stage per host (launched by lattice-mpirun
# --hosts a:4,b:4: the activations cross the link); 8x1 is one TP group over both hosts (lattice-mpirun
# refuses it, so plain mpirun --host a:4,b:4 starts it), simulated with --sim-link L: the planner models
# a TP group across nodes as a ring all-reduce whose slowest hops are L, so the simulated step of 8x1 is
# the planner's own for that cluster. LAYOUT@1 runs the same 8 ranks on host a alone (stages meet over
# shared memory, no TCP), beside the planner's figure for 2 nodes: what the crossing itself costs.
# MTU=1500 keeps Ethernet's frame size (default: 65000, see below).
# The link: a token bucket (`tc qdisc ... tbf`) at L's bandwidth on both switch ports (each direction);
# the kernel here has no netem, so L's latency is not added: the veth's own round trip (measured and
# printed, with the shaped bandwidth) stands in for it.
# Printed: the link as measured, then a markdown table per layout: tokens/s against the planner's (run
# time predicted as requests x prompt / prefill tok/s + requests x new tokens / decode tok/s), decode
# tok/s, TTFT, the leader's plan wait as a share of the run, the overrun of the simulated steps, the
# load; and tp 8 over tp 4 x pp 2 measured against predicted. One JSON line per layout in OUT/results.jsonl.
# What a 2-core machine can say: the simulated forwards are sleeps of the planner's step times, so 8
# ranks on 2 cores reproduce the time model as long as the real work of a step (scheduling, the plan
# send, the real all-reduce and hand-off over TCP) fits inside its simulated time; what does not is
# reported as overrun (sim_overrun_seconds) and the plan wait share (docs/benchmark-results.md).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/tests/hosts/hosts_lib.sh"
export LATTICE_BIN=${LATTICE_BIN:-$root/build/launch/lattice}
hosts_test_init "$0" "$@"
link=ib-hdr100 requests=64 prompt=512 new=128 preset=llama-2-70b gpu=a100-pcie-40gb node_link=pcie4
layouts="4x2 8x1 4x2@1" out=$root/bench-results/sim-hosts shape=1
while [ $# -gt 0 ]; do
    case "$1" in
        --link) link=$2; shift ;;
        --requests) requests=$2; shift ;;
        --prompt) prompt=$2; shift ;;
        --max-new-tokens) new=$2; shift ;;
        --preset) preset=$2; shift ;;
        --sim-gpu) gpu=$2; shift ;;
        --sim-link) node_link=$2; shift ;;
        --layouts) layouts=$2; shift ;;
        --out) out=$2; shift ;;
        --no-shape) shape=0 ;;
        *) echo "sim_hosts.sh: unknown option $1"; exit 2 ;;
    esac
    shift
done
[ -x "$bin" ] || { echo "sim_hosts.sh: $bin is not built"; exit 1; }
mkdir -p "$out"
hosts_make a b || { echo "sim_hosts.sh: cannot make the hosts"; exit 1; }
d=$HOSTS_DIR
# Jumbo frames (64 KB) on the emulated link: TCP over a veth costs CPU per packet, and this machine's
# cores are what carries the link (at 1500 bytes it reaches ~0.6 GB/s on 2 loaded cores).
if [ "${MTU:-65000}" != 1500 ]; then
    for dev in sw p-a p-b; do ip link set "$dev" mtu "${MTU:-65000}"; done
    for h in a b; do host_run $h ip link set eth0 mtu "${MTU:-65000}"; done
fi

# The planner's view of the cluster (also gives the link's bandwidth for the shaping).
"$bin" plan --model "$preset" --gpus 8 --nodes 2 --gpu "$gpu" --interconnect "$node_link" --inter-node-link "$link" \
    --quant fp16 --batch "$requests" --prompt "$prompt" --json > "$d/plan.json" || { echo "lattice plan failed"; exit 1; }
"$bin" plan --model "$preset" --gpus 8 --gpu "$gpu" --interconnect "$node_link" --quant fp16 --batch "$requests" \
    --prompt "$prompt" --json > "$d/plan1.json" || { echo "lattice plan (one node) failed"; exit 1; }
bw=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["inter_node_link_spec"]["bw_gbs"])' "$d/plan.json")
if [ "$shape" = 1 ]; then
    mbit=$(python3 -c "print(int($bw * 8000))")
    burst=$(python3 -c "print(max(1 << 20, int($bw * 1e9 / 250)))")  # >= rate / HZ
    for h in a b; do
        tc qdisc add dev "p-$h" root tbf rate "${mbit}mbit" burst "$burst" latency 20ms ||
            { echo "sim_hosts.sh: tc tbf refused"; exit 1; }
    done
fi

# The link as it is: TCP bandwidth b -> a (256 MiB) and the round trip of a 64-byte message.
host_run a python3 - > "$d/link.txt" <<'PY' &
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("10.77.0.1", 5099)); s.listen(1)
c, _ = s.accept()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for _ in range(200):
    c.sendall(c.recv(64))
n, t0 = 0, time.monotonic()
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    n += len(b)
print(f"{n / (time.monotonic() - t0) / 1e9:.2f}")
PY
server=$!
rtt=$(host_run b python3 - <<'PY'
import socket, time
for _ in range(300):  # until the server listens (a bounded retry)
    try:
        c = socket.create_connection(("10.77.0.1", 5099))
        break
    except OSError:
        time.sleep(0.05)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rt = []
for _ in range(200):
    t0 = time.monotonic(); c.sendall(b"x" * 64); got = 0
    while got < 64:
        got += len(c.recv(64 - got))
    rt.append(time.monotonic() - t0)
buf = b"\0" * (1 << 20)
for _ in range(256):
    c.sendall(buf)
c.close()
rt.sort()
print(f"{rt[len(rt) // 2] * 1e6:.0f}")
PY
)
wait $server
echo "link b -> a: $(cat "$d/link.txt") GB/s measured (shaped to $bw GB/s: $([ $shape = 1 ] && echo yes || echo no)), median round trip ${rtt} us (TCP, 64 B)"

python3 -c "import json, random; r = random.Random(11); [print(json.dumps({'prompt': [r.randrange(3, 32000) for _ in range($prompt)], 'max_tokens': $new})) for _ in range($requests)]" > "$d/in.jsonl"
common=(batch --random-weights --config "$preset" --device sim --sim-gpu "$gpu" --quant none --input "$d/in.jsonl"
        --progress none --comm-timeout 300)
for l in $layouts; do
    spec=${l%@1} tp=${spec%x*} pp=${spec#*x} where=a:4,b:4
    [ "$spec" != "$l" ] && where=a:8  # LAYOUT@1: the same 8 ranks on host a alone (no TCP), a baseline
    rm -f "$d/out-$l.jsonl"
    if [ $((4 % tp)) -eq 0 ] || [ $where = a:8 ]; then  # TP inside a host: the wrapper, one stage per host
        host_run a timeout 600 "$W" --hosts $where --tp "$tp" --pp "$pp" --cpu --bind none -q -- "$bin" "${common[@]}" \
            --sim-link "$node_link" --output "$d/out-$l.jsonl" --stats-json "$d/stats-$l.json" > "$d/run-$l.log" 2>&1
    else  # TP across the hosts: plain mpirun, the TP all-reduce over the inter-node link
        host_run a timeout 600 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 8 --host a:4,b:4 \
            --map-by ppr:4:node "$bin" "${common[@]}" --tp "$tp" --pp "$pp" --sim-link "$link" \
            --output "$d/out-$l.jsonl" --stats-json "$d/stats-$l.json" > "$d/run-$l.log" 2>&1
    fi
    rc=$?
    echo "$l: exit $rc, load $(cut -d' ' -f1 /proc/loadavg)"
    [ $rc -eq 0 ] || tail -n 5 "$d/run-$l.log"
    echo "$(cut -d' ' -f1 /proc/loadavg)" > "$d/load-$l"
done

python3 - "$d" "$out/results.jsonl" "$link" "$bw" "$shape" "$(cat "$d/link.txt")" "$rtt" "$requests" "$prompt" "$new" \
    "$layouts" "$preset" "$gpu" "$node_link" <<'PY'
import json, os, platform, sys, time
d, res, link, bw, shaped, meas_bw, rtt, req, prompt, new, layouts, preset, gpu, node_link = sys.argv[1:15]
req, prompt, new = int(req), int(prompt), int(new)
plans = {n: {(x["tp"], x["pp"]): x for x in json.load(open(os.path.join(d, f)))["layouts"]}
         for n, f in ((2, "plan.json"), (1, "plan1.json"))}
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
rows, got = [], {}
for l in layouts.split():
    tp, pp = map(int, l.split("@")[0].split("x"))
    path = os.path.join(d, f"stats-{l}.json")
    if not os.path.exists(path):
        rows.append(f"| {tp}x{pp} | {link} | failed |")
        continue
    one = l.endswith("@1")  # one host: beside the planner's one-node figure
    st, p = json.load(open(path)), plans[1 if one else 2][(tp, pp)]
    pf, dec = req * prompt / p["prefill_tokens_per_s"], req * new / p["decode_tokens_per_s"]
    pred = st["generated_tokens"] / (pf + dec)
    run = st["run_seconds"]
    r = {"tp": tp, "pp": pp, "tokens_per_s": st["tokens_per_s"], "predicted_tokens_per_s": pred,
         "ratio": st["tokens_per_s"] / pred, "decode_tokens_per_s": st["decode_tokens_per_s"],
         "predicted_decode_tokens_per_s": p["decode_tokens_per_s"], "ttft_p50_s": st["ttft_p50_s"],
         "predicted_run_seconds": pf + dec, "run_seconds": run,
         "plan_wait_share": st["plan_wait_seconds"] / run, "sim_overrun_share": st["sim_overrun_seconds"] / run,
         "load": float(open(os.path.join(d, f"load-{l}")).read())}
    r["hosts"] = 1 if one else 2
    got[l] = r
    rows.append(f"| {tp}x{pp}{' on 1 host' if l.endswith('@1') else ''} | {link if r['hosts'] == 2 else '-'} | {r['tokens_per_s']:.0f} | {pred:.0f} | **{r['ratio']:.2f}** | "
                f"{r['decode_tokens_per_s']:.0f} | {p['decode_tokens_per_s']:.0f} | {r['ttft_p50_s']:.2f} | "
                f"{run:.1f} | {pf + dec:.1f} | {100 * r['plan_wait_share']:.1f} | {100 * r['sim_overrun_share']:.1f} | "
                f"{r['load']:.1f} |")
    with open(res, "a") as f:
        f.write(json.dumps({"bench": "sim_hosts", "params": {"preset": preset, "sim_gpu": gpu, "node_link": node_link,
                            "inter_node_link": link, "link_bw_gbs": float(bw), "shaped": shaped == "1",
                            "measured_link_gbs": float(meas_bw), "rtt_us": float(rtt), "requests": req,
                            "prompt": prompt, "max_new_tokens": new}, "results": r, "cpu": cpu,
                            "cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")
print(f"\n{preset} on 2 x 4 simulated {gpu} ({node_link} in a node, {link} between: {bw} GB/s), {req} requests of "
      f"{prompt} in / {new} out; link measured {meas_bw} GB/s, RTT {rtt} us; {cpu}, {os.cpu_count()} CPUs\n")
print("| tp x pp | inter-node | tok/s | plan tok/s | ratio | decode tok/s | plan decode | TTFT p50 s | run s | "
      "plan run s | plan wait % | overrun % | load |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
print("\n".join(rows))
if "8x1" in got and "4x2" in got:
    m = got["8x1"]["tokens_per_s"] / got["4x2"]["tokens_per_s"]
    pr = got["8x1"]["predicted_tokens_per_s"] / got["4x2"]["predicted_tokens_per_s"]
    print(f"\ntp 8 / tp 4 x pp 2 tokens/s: measured {m:.2f}, planner {pr:.2f}")
PY
