#!/usr/bin/env bash
# A real two-node Slurm on emulated hosts (hosts_lib.sh): slurmctld in the test's namespace (on the
# bridge, 10.77.0.254), one slurmd per host (`slurmd -N a` inside host a's namespaces, with a /tmp of its
# own as a real node has: PMIx keeps per-step folders there), auth/none + cred/none (no munge),
# proctrack/linuxproc + task/none (no cgroups). launch/slurm/lattice-multinode.sbatch, --nodes=2
# --ntasks-per-node=2, TP=2 PP=2 on CPU ranks:
#  - RUN=doctor with srun --mpi=pmix: ranks 0-1 on a, 2-3 on b (one TP group = one stage per node);
#  - RUN=generate with srun --mpi=pmix and with lattice-mpirun (mpirun inside the allocation): the
#    printed ids equal tiny-llama2's golden greedy ids (first 8).
#   test_hosts_slurm.sh serve: launch/slurm/serve.sbatch across the 2 nodes (TP=1 PP=2, SmolLM2; SKIP
#   without it), HOST=0.0.0.0: /health answers from outside the hosts (the test's namespace), a
#   completion of 8 tokens at temperature 0 comes back, scancel (TERM -> drain) ends the job and no
#   process is left on either host.
#   test_hosts_slurm.sh requeue: launch/slurm/batch.sbatch across the 2 nodes (TP=1 PP=auto: one stage per
#   node of the allocation, the default SmolLM2 model; SKIP without it) stopped by Slurm's TERM mid-run: lattice drains,
#   exits 75, the script requeues the job, and the restart completes it: COMPLETED, >= 1 restart, every
#   id in the output once.
# SKIP (77) without Slurm's tools or namespaces; the srun jobs are skipped (said so) without PMIx.
# Everything dies with the test (PID namespace); the Slurm folder under /var/tmp is removed on exit.
set -uo pipefail
source "$(dirname "$0")/hosts_lib.sh"
for tool in slurmctld slurmd sbatch scontrol sinfo srun; do
    command -v "$tool" > /dev/null || hosts_skip "$tool not installed (scripts/setup.sh installs Slurm)"
done
hosts_test_init "$0" "$@"
source "$src/tests/launch/slurm_conf.sh"
mode=${1:-run}
model="$shared/golden/tiny-llama2"
n=8
hosts_make a b || { echo "FAIL: cannot make the hosts"; exit 1; }
tmp=$(mktemp -d /var/tmp/lattice-slurm-hosts.XXXXXX)
trap 'hosts_cleanup; rm -rf "$tmp"' EXIT
ctl=$(hostname -s)
ip addr add 10.77.0.254/24 dev sw
echo "10.77.0.254 $ctl" >> "$HOSTS_DIR/hosts"
mkdir -p "$tmp/state" "$tmp/spool-a" "$tmp/spool-b"
slurm_conf_write "$tmp" latticehosts "$ctl" 10.77.0.254 \
    "NodeName=a NodeAddr=10.77.0.1 CPUs=2 RealMemory=1 State=UNKNOWN" \
    "NodeName=b NodeAddr=10.77.0.2 CPUs=2 RealMemory=1 State=UNKNOWN" \
    "PartitionName=lattice Nodes=a,b Default=YES MaxTime=10 State=UP"
# A requeued job may start again cred_expire (>= 5) s later, at the next scheduling pass (1 s here).
[ "$mode" = requeue ] && printf "AuthInfo=cred_expire=5\nSchedulerParameters=sched_interval=1\n" >> "$tmp/slurm.conf"
export SLURM_CONF="$tmp/slurm.conf"
slurmctld -D -i -f "$SLURM_CONF" > "$tmp/slurmctld.out" 2>&1 &
for h in a b; do
    host_run $h unshare --mount --propagation private \
        sh -c "mount -t tmpfs tmpfs /tmp && cd / && exec slurmd -D -N $h -f '$SLURM_CONF'" > "$tmp/slurmd-$h.out" 2>&1 &
done
state=""
for _ in $(seq 150); do
    state=$(timeout 5 sinfo -h -o %T 2> /dev/null | sort -u | tr '\n' ' ')
    [ "$state" = "idle " ] && break
    sleep 0.2
done
[ "$state" = "idle " ] || { echo "FAIL: Slurm did not come up (node states '$state')"; tail -n 5 "$tmp"/*.log "$tmp"/*.out; exit 1; }

run_job() {  # run_job NAME RUN LAUNCHER: lattice-multinode.sbatch on 2 nodes x 2 tasks, waited for (bounded)
    local name=$1 id st
    id=$(cd "$src" && MODEL="$model" TP=2 PP=2 RUN="$2" LAUNCHER="$3" LATTICE="$bin" PROMPT_IDS=$prompt \
         MAX_NEW_TOKENS=$n COMM_TIMEOUT=30 sbatch --parsable --output="$tmp/$name.out" --error="$tmp/$name.err" \
         --nodes=2 --ntasks-per-node=2 --gpus-per-node=0 --cpus-per-task=1 --time=2 \
         launch/slurm/lattice-multinode.sbatch 2>&1)
    [[ "$id" =~ ^[0-9]+$ ]] || { fail "$name: sbatch said: $id"; return 1; }
    for _ in $(seq 450); do  # <= 90 s
        st=$(job_state "$id")
        case "$st" in PENDING | CONFIGURING | RUNNING | COMPLETING | "") sleep 0.2 ;; *) break ;; esac
    done
    echo "$name: job $id $st"
    [ "$st" = COMPLETED ] || { fail "$name: job $id ended $st"; sed 's/^/  | /' "$tmp/$name.out" "$tmp/$name.err"; return 1; }
}
prompt=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['cases'][0]['prompt_ids'])))" "$model/expected.json")
want=$(python3 -c "import json,sys; print(' '.join(map(str, json.load(open(sys.argv[1]))['cases'][0]['greedy_ids'][:$n])))" "$model/expected.json")

long_model=$smol
[ "$mode" = run ] || need_smol
if [ "$mode" = serve ]; then
    id=$(cd "$src" && MODEL="$long_model" TP=1 PP=2 CPU_RANKS=1 LATTICE="$bin" HOST=0.0.0.0 PORT=8000 \
         DRAIN_SECONDS=2 COMM_TIMEOUT=30 EXTRA_ARGS="--threads 1" \
         sbatch --parsable --job-name=lattice-serve --output="$tmp/serve.out" --error="$tmp/serve.err" \
                --nodes=2 --ntasks-per-node=1 --gpus-per-node=0 --cpus-per-task=1 --time=3 launch/slurm/serve.sbatch 2>&1)
    [[ "$id" =~ ^[0-9]+$ ]] || { echo "FAIL: serve: sbatch said: $id"; exit 1; }
    python3 - <<'PY' || fail "serve: no answer from the server on host a"
import json, sys, time, urllib.request
base = "http://10.77.0.1:8000"
deadline = time.monotonic() + 90
while True:
    try:
        if urllib.request.urlopen(base + "/health", timeout=5).status == 200:
            break
    except OSError:
        pass
    if time.monotonic() > deadline:
        sys.exit("no /health 200 within 90 s")
    time.sleep(0.3)
req = urllib.request.Request(base + "/v1/completions", method="POST", headers={"Content-Type": "application/json"},
                             data=json.dumps({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}).encode())
r = json.load(urllib.request.urlopen(req, timeout=60))
n = r["usage"]["completion_tokens"]
print(f"serve: completion across 2 Slurm nodes: {n} tokens, {r['choices'][0]['text']!r}")
sys.exit(0 if n == 8 and r["choices"][0]["text"] else 1)
PY
    grep -q "1 per node on 2 node(s)" "$tmp/serve.err" || fail "serve: not one rank per node on 2 nodes"
    scancel "$id"
    for _ in $(seq 300); do  # <= 60 s
        st=$(job_state "$id")
        case "$st" in PENDING | CONFIGURING | RUNNING | COMPLETING | "") sleep 0.2 ;; *) break ;; esac
    done
    echo "serve: job $id $st after scancel"
    case "$st" in COMPLETED | CANCELLED) ;; *) fail "serve: job $id ended $st" ;; esac
    left=""
    for _ in $(seq 100); do
        left=$(for h in a b; do for p in $(host_pids $h); do
            tr '\0' ' ' < "/proc/$p/cmdline" 2> /dev/null | grep -q "lattice serve\|orted" && echo "$p"; done; done)
        [ -z "$left" ] && break
        sleep 0.2
    done
    [ -z "$left" ] || fail "serve: processes left: $left"
    [ $fails -eq 0 ] || sed 's/^/  | /' "$tmp/serve.out" "$tmp/serve.err"
    exit $((fails > 0))
fi
if [ "$mode" = requeue ]; then
    in="$tmp/requeue-in.jsonl" out="$tmp/requeue-out.jsonl" nreq=16
    python3 -c 'import json, sys
for i in range(int(sys.argv[1])):
    print(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                      "body": {"prompt": f"Once upon a time {i}", "max_tokens": 48, "temperature": 0}}))' $nreq > "$in"
    id=$(cd "$src" && MODEL="$long_model" INPUT="$in" OUTPUT="$out" TP=1 PP=auto CPU_RANKS=1 LATTICE="$bin" \
         DRAIN_SECONDS=1 COMM_TIMEOUT=300 EXTRA_ARGS="--threads 1 --progress none --max-seqs 2" \
         sbatch --parsable --job-name=lattice-requeue --output="$tmp/requeue.out" --error="$tmp/requeue.err" \
                --nodes=2 --ntasks-per-node=1 --gpus-per-node=0 --cpus-per-task=1 --time=3 launch/slurm/batch.sbatch 2>&1)
    [[ "$id" =~ ^[0-9]+$ ]] || { echo "FAIL: requeue: sbatch said: $id"; exit 1; }
    # The TERM must reach lattice after >= 2 records and before the last: the ranks are stopped there and
    # Slurm's TERM sent while they are (slurm_conf.sh). COMM_TIMEOUT is 300 s so that a peer stopped that
    # long does not read as dead.
    ranks=""
    for _ in $(seq 450); do
        ranks=$(for h in a b; do for p in $(host_pids $h); do
            [ "$(cat "/proc/$p/comm" 2> /dev/null)" = lattice ] && echo "$p"; done; done | tr '\n' ' ')
        [ -n "$ranks" ] && [ -f "$out" ] && [ "$(wc -l < "$out")" -ge 2 ] && kill -STOP $ranks && break
        sleep 0.2
    done
    records=$(wc -l < "$out" 2> /dev/null || echo 0)
    [ "$records" -ge 2 ] && [ "$records" -lt $nreq ] || fail "requeue: $records records when the ranks were stopped"
    slurm_term_stopped "$id" "$ranks" || fails=$((fails + 1))
    for _ in $(seq 450); do  # <= 90 s
        st=$(job_state "$id")
        case "$st" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL) break ;; esac
        sleep 0.2
    done
    restarts=$(scontrol -o show job "$id" 2> /dev/null | grep -o 'Restarts=[0-9]*' | cut -d= -f2)
    echo "requeue: job $id $st, restarts ${restarts:-?}"
    grep -q "scontrol requeue $id" "$tmp/requeue.out" || fail "requeue: the script did not requeue the job"
    [ "$st" = COMPLETED ] && [ "${restarts:-0}" -ge 1 ] || fail "requeue: want COMPLETED after >= 1 restart"
    [ "$(grep -c "2 CPU ranks, 1 per node on 2 node(s)" "$tmp/requeue.err")" -ge 2 ] ||
        fail "requeue: both runs were not one rank per node on 2 nodes"
    [ "$(grep -c "TP=1 PP=2 on 2 node(s) a,b" "$tmp/requeue.out")" -ge 2 ] ||
        fail "requeue: PP=auto did not make one stage per node of the allocation"
    python3 - "$out" $nreq <<'PY' || fail "requeue: records"
import json, sys
ids = [json.loads(l)["custom_id"] for l in open(sys.argv[1])]
ok = sorted(ids) == sorted(f"r{i}" for i in range(int(sys.argv[2])))
print(f"requeue: {len(ids)} records, every id once: {ok}")
sys.exit(0 if ok else 1)
PY
    [ $fails -eq 0 ] || sed 's/^/  | /' "$tmp/requeue.out" "$tmp/requeue.err"
    exit $((fails > 0))
fi
launchers="mpirun"
if srun --mpi=list 2>&1 | grep -qw pmix; then launchers="srun mpirun"; else echo "SKIP (srun jobs): this Slurm has no PMIx plugin"; fi
if [[ "$launchers" == srun* ]] && run_job doctor doctor srun; then
    for line in "world: 4 rank(s) on 2 host(s), asked tp 2 x pp 2" "rank 0 on a:" "rank 1 on a:" "rank 2 on b:" "rank 3 on b:"; do
        grep -qF -- "$line" "$tmp/doctor.out" || { fail "doctor: no '$line'"; sed 's/^/  | /' "$tmp/doctor.out"; }
    done
fi
for l in $launchers; do
    run_job "generate-$l" generate "$l" || continue
    if grep -qxF -- "$want" "$tmp/generate-$l.out"; then
        echo "generate-$l: $n golden tokens across 2 Slurm nodes"
    else
        fail "generate-$l: want '$want'"; sed 's/^/  | /' "$tmp/generate-$l.out" "$tmp/generate-$l.err"
    fi
done
[ $fails -eq 0 ]
