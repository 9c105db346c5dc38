#!/usr/bin/env bash
# A real single-node Slurm: starts Debian's slurmctld + slurmd (foreground, root, config in a temp
# folder: auth/none + cred/none so no munge, proctrack/linuxproc + task/none so no cgroups,
# NodeAddr=127.0.0.1 + slurmd -N so the hostname does not matter, free ports), submits the
# templates in launch/slurm on CPU ranks and checks the job outputs; then stops Slurm and whatever
# is left of it, always (trap). Jobs:
#  - lattice.sbatch RUN=doctor, TP=2, with srun --mpi=pmix and with lattice-mpirun: 2 ranks, 1 host, ok
#  - lattice-multinode.sbatch RUN=doctor, TP=2 on the one node: same
#  - lattice.sbatch RUN=generate on tiny-llama2 with both launchers: the printed ids equal
#    expected.json case 0's greedy_ids (first MAX_NEW_TOKENS); TP=2 with `generate`, 1 rank with `doctor`
#  - scaling-sweep.sbatch as a job array (1x1; 1x1 2x1 1x2 with `generate`): sweep.json holds
#    every layout's --stats-json with the right tp, pp and token count
#  - scancel of a long generation (SmolLM2 default model, when fetched): no rank process left
#  - requeue (its own mode): launch/slurm/batch.sbatch on SmolLM2, Slurm's TERM to the batch script
#    (`scancel --batch --signal=TERM`, what `--signal=B:TERM@120` sends before the time limit) mid-run:
#    lattice drains and exits 75, the script runs `scontrol requeue`, Slurm restarts the job and the
#    restart completes it: the job ends COMPLETED with one restart, every id in the output once
#   test_slurm.sh doctor|generate|requeue
# Exit 77 (CTest: skipped, with the reason printed) only where Slurm is not installed.
set -uo pipefail
mode=${1:-doctor}
src=${LATTICE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
shared=${LATTICE_SHARED_DIR:-$src/../shared}
source "$src/tests/launch/slurm_conf.sh"
model="$shared/golden/tiny-llama2"
new_tokens=8
for tool in slurmctld slurmd sbatch scontrol squeue sinfo srun; do
    command -v "$tool" >/dev/null || { echo "SKIP: $tool not installed (scripts/setup.sh installs Slurm)"; exit 77; }
done
[ "$(id -u)" -eq 0 ] || { echo "SKIP: a local slurmd needs root"; exit 77; }
case "$mode" in
    doctor|generate|requeue) bin=${LATTICE_BIN:?set LATTICE_BIN to the lattice executable} ;;
    *)               echo "usage: $0 doctor|generate|requeue"; exit 2 ;;
esac
[ -x "$bin" ] || { echo "FAIL: $bin is not built"; exit 1; }

tmp=$(mktemp -d /tmp/lattice-slurm.XXXXXX)
ctld_pid=""; slurmd_pid=""
cleanup() {
    export SLURM_CONF="$tmp/slurm.conf"
    if [ -n "$ctld_pid" ] && kill -0 "$ctld_pid" 2>/dev/null; then
        timeout 10 scancel --full --quiet --user=root 2>/dev/null
        for _ in $(seq 50); do [ -z "$(timeout 5 squeue -h 2>/dev/null)" ] && break; sleep 0.2; done
        timeout 10 scontrol shutdown >/dev/null 2>&1
    fi
    for pid in $slurmd_pid $ctld_pid; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null
    done
    # slurmstepd of our jobs (cmdline "slurmstepd: [<jobid>.<step>]") that outlived slurmd.
    for id in ${job_ids:-}; do
        for pid in $(pgrep -f "^slurmstepd: \[$id\."); do kill -KILL "$pid" 2>/dev/null; done
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

read -r port1 port2 < <(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1", 0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
node=latticenode
cpus=$(nproc)
mkdir -p "$tmp/state" "$tmp/spool-$node"
slurm_conf_write "$tmp" latticetest "$(hostname -s)" 127.0.0.1 "SlurmctldPort=$port1" "SlurmdPort=$port2" \
    "NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=1 State=UNKNOWN" \
    "PartitionName=lattice Nodes=$node Default=YES MaxTime=10 State=UP"
# A requeued job waits cred_expire seconds (default 120, minimum 5) before it may start again, then for
# the next scheduling pass (sched_interval, default 60 s): 5 and 1 here. Job ids from 9000: the cleanup
# below kills slurmstepd by job id, and launch_slurm (job ids from 1) may run at the same time.
[ "$mode" = requeue ] && printf "AuthInfo=cred_expire=5\nSchedulerParameters=sched_interval=1\nFirstJobId=9000\n" >> "$tmp/slurm.conf"
# PMIx's per-step folders (spmix_appdir_<uid>_<job>.<step>) in this run's folder, not /tmp: one left
# there by a killed run made every later first job's srun step fail ("task launch failed").
mkdir -p "$tmp/pmix"
echo "PMIxCliTmpDirBase=$tmp/pmix" > "$tmp/mpi.conf"
export SLURM_CONF="$tmp/slurm.conf"
t0=$(date +%s)
slurmctld -D -i -f "$SLURM_CONF" > "$tmp/slurmctld.out" 2>&1 & ctld_pid=$!
slurmd -D -N "$node" -f "$SLURM_CONF" > "$tmp/slurmd.out" 2>&1 & slurmd_pid=$!
state=""
for _ in $(seq 100); do
    state=$(timeout 5 sinfo -h -n "$node" -o %T 2>/dev/null)
    [ "$state" = idle ] && break
    sleep 0.2
done
if [ "$state" != idle ]; then
    echo "FAIL: Slurm did not come up (node state '$state')"; tail -n 20 "$tmp"/slurmctld.log "$tmp/slurmd-$node.log" "$tmp"/*.out
    exit 1
fi
echo "slurm up in $(( $(date +%s) - t0 )) s (ports $port1/$port2)"

fails=0
job_ids=""
# run_job NAME RUN LAUNCHER [TEMPLATE [TP [MODEL [TOKENS]]]]: submits a template (default
# lattice.sbatch) as TP*PPV CPU ranks (TP default 2, PPV default 1) and waits for it (bounded).
# SUBMIT_ONLY=1: no wait.
run_job() {
    local name=$1 run=$2 launcher=$3 template=${4:-lattice.sbatch} tp=${5:-2} m=${6:-$model} tokens=${7:-$new_tokens} id st
    id=$(cd "$src" && MODEL="$m" TP=$tp PP=${PPV:-1} CPU_RANKS=1 RUN="$run" LAUNCHER="$launcher" LATTICE="$bin" \
         PROMPT_IDS=${PROMPT:-93} MAX_NEW_TOKENS=$tokens COMM_TIMEOUT=30 \
         sbatch --parsable --job-name="lattice-$name" --output="$tmp/$name.out" --error="$tmp/$name.err" \
                --nodes=1 --ntasks-per-node=$((tp * ${PPV:-1})) --gpus-per-node=0 --cpus-per-task=1 --time=2 \
                "launch/slurm/$template" 2>&1)
    if ! [[ "$id" =~ ^[0-9]+$ ]]; then echo "FAIL: $name: sbatch said: $id"; fails=$((fails + 1)); return 1; fi
    job_ids="$job_ids $id"
    last_job=$id
    [ "${SUBMIT_ONLY:-0}" = 1 ] && return 0
    for _ in $(seq 300); do  # <= 60 s
        st=$(job_state "$id")
        case "$st" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|PREEMPTED|BOOT_FAIL|DEADLINE) break ;; esac
        sleep 0.2
    done
    echo "$name: job $id $st"
    if [ "$st" != COMPLETED ]; then
        echo "FAIL: $name: job $id ended $st"; sed 's/^/  | /' "$tmp/$name.out" "$tmp/$name.err" 2>/dev/null
        [ "$st" = RUNNING ] || [ "$st" = PENDING ] && scancel "$id"
        fails=$((fails + 1)); return 1
    fi
}
check() {  # check NAME pattern
    grep -qF -- "$2" "$tmp/$1.out" && return
    echo "FAIL: $1: '$2' not in the job output:"; sed 's/^/  | /' "$tmp/$1.out" "$tmp/$1.err"; fails=$((fails + 1))
}
check_tokens() {  # the generated ids, as a run of integers in one line of output, equal the golden ones
    python3 - "$tmp/$1.out" "$model/expected.json" "$new_tokens" <<'PY' || { sed 's/^/  | /' "$tmp/$1.out" "$tmp/$1.err"; fails=$((fails + 1)); }
import json, re, sys
out, ref, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
want = json.load(open(ref))["cases"][0]["greedy_ids"][:n]
for line in open(out):
    ids = [int(x) for x in re.findall(r"-?\d+", line)] if re.fullmatch(r"[\s\d,\[\]:a-z_]*", line.strip()) else []
    for i in range(len(ids) - n + 1):
        if ids[i:i + n] == want:
            print(f"tokens ok: {want}"); sys.exit(0)
print(f"FAIL: {out}: no line holds the greedy ids {want}"); sys.exit(1)
PY
}

# batch.sbatch stopped by Slurm's TERM requeues itself; the restart finishes every id once.
requeue_test() {
    local long_model="$src/models/SmolLM2-135M-Instruct.Q4_1.gguf" in="$tmp/requeue-in.jsonl" out="$tmp/requeue-out.jsonl"
    local n=24 id st restarts
    [ -e "$long_model" ] || { echo "FAIL: requeue needs $long_model (scripts/setup.sh fetches it)"; return 1; }
    python3 -c 'import json, sys
for i in range(int(sys.argv[1])):
    print(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                      "body": {"prompt": f"Once upon a time {i}", "max_tokens": 64, "temperature": 0}}))' $n > "$in"
    id=$(cd "$src" && MODEL="$long_model" INPUT="$in" OUTPUT="$out" TP=1 PP=1 CPU_RANKS=1 LATTICE="$bin" \
         DRAIN_SECONDS=1 COMM_TIMEOUT=30 EXTRA_ARGS="--threads 1 --progress none --max-seqs 2" \
         sbatch --parsable --job-name=lattice-requeue --output="$tmp/requeue.out" --error="$tmp/requeue.err" \
                --nodes=1 --ntasks-per-node=1 --gpus-per-node=0 --cpus-per-task=1 --time=3 launch/slurm/batch.sbatch 2>&1)
    if ! [[ "$id" =~ ^[0-9]+$ ]]; then echo "FAIL: requeue: sbatch said: $id"; return 1; fi
    job_ids="$job_ids $id"
    # The TERM must find the batch after >= 2 records and before the last: its rank is stopped there (one
    # rank: the lattice process whose environment holds this job's id; ctest may run other tests' beside it).
    local ranks="" p records
    for _ in $(seq 300); do
        ranks=$(for p in $(pgrep -x lattice); do
            tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx "SLURM_JOB_ID=$id" && echo "$p"; done | tr '\n' ' ')
        [ -n "$ranks" ] && [ -f "$out" ] && [ "$(wc -l < "$out")" -ge 2 ] && kill -STOP $ranks && break
        sleep 0.2
    done
    records=$(wc -l < "$out" 2> /dev/null || echo 0)
    if ! [ "$records" -ge 2 ] || ! [ "$records" -lt $n ]; then
        echo "FAIL: requeue: $records records when the rank was stopped"; [ -n "$ranks" ] && kill -CONT $ranks; return 1
    fi
    echo "requeue: rank ${ranks% } stopped at $records of $n records; Slurm's TERM sent"
    slurm_term_stopped "$id" "$ranks" || return 1
    for _ in $(seq 600); do  # <= 120 s
        st=$(job_state "$id")
        [ "$st" = COMPLETED ] || [ "$st" = FAILED ] || [ "$st" = CANCELLED ] || [ "$st" = TIMEOUT ] && break
        sleep 0.2
    done
    restarts=$(scontrol -o show job "$id" 2>/dev/null | grep -o 'Restarts=[0-9]*' | cut -d= -f2)
    echo "requeue: job $id $st, restarts ${restarts:-?}"
    grep -q "scontrol requeue $id" "$tmp/requeue.out" && [ "$st" = COMPLETED ] && [ "${restarts:-0}" -ge 1 ] &&
    python3 - "$out" $n <<'PY' || { sed 's/^/  | /' "$tmp/requeue.out" "$tmp/requeue.err"; return 1; }
import json, sys
ids = [json.loads(l)["custom_id"] for l in open(sys.argv[1])]
ok = sorted(ids) == sorted(f"r{i}" for i in range(int(sys.argv[2])))
print(f"requeue: {len(ids)} records, every id once: {ok}")
sys.exit(0 if ok else 1)
PY
}
if [ "$mode" = requeue ]; then
    requeue_test || fails=$((fails + 1))
    [ $fails -eq 0 ] && echo "slurm: all checks passed"
    exit $((fails > 0))
fi

for launcher in srun mpirun; do
    name="doctor-$launcher"
    if run_job "$name" doctor "$launcher"; then
        check "$name" "launcher=$launcher"
        check "$name" "world: 2 rank(s) on 1 host(s), asked tp 2 x pp 1"
        check "$name" "rank 1 on"
        check "$name" "result: ok"
    fi
done
# The multi-node template on the one node there is (TP=2 inside it, PP=1): same launch path.
if run_job doctor-multinode doctor srun lattice-multinode.sbatch; then
    check doctor-multinode "TP=2 PP=1 ranks=2 nodes=1 launcher=srun"
    check doctor-multinode "world: 2 rank(s) on 1 host(s), asked tp 2 x pp 1"
    check doctor-multinode "result: ok"
fi
# Golden tokens from a generate job: TP=2 in `generate` mode, one rank otherwise.
gen_tp=1; [ "$mode" = generate ] && gen_tp=2
for launcher in srun mpirun; do
    name="generate-$launcher"
    if run_job "$name" generate "$launcher" lattice.sbatch "$gen_tp"; then
        check "$name" "TP=$gen_tp PP=1 ranks=$gen_tp launcher=$launcher"
        check_tokens "$name"
    fi
done
# Scaling sweep: one array task per layout, merged into sweep.json with every layout's stats.
layouts="1x1"; [ "$mode" = generate ] && layouts="1x1 2x1 1x2"
read -r -a lay <<< "$layouts"
sweep_id=$(cd "$src" && MODEL="$model" LAYOUTS="$layouts" CPU_RANKS=1 LAUNCHER=srun LATTICE="$bin" RESULTS="$tmp/sweep" \
           PROMPT_IDS=93 MAX_NEW_TOKENS=$new_tokens COMM_TIMEOUT=30 \
           sbatch --parsable --array=0-$((${#lay[@]} - 1)) --output="$tmp/sweep-%a.out" --error="$tmp/sweep-%a.err" \
                  --nodes=1 --ntasks-per-node=2 --gpus-per-node=0 --cpus-per-task=1 --time=2 \
                  launch/slurm/scaling-sweep.sbatch 2>&1)
if [[ "$sweep_id" =~ ^[0-9]+$ ]]; then
    job_ids="$job_ids $sweep_id"
    for _ in $(seq 450); do [ -z "$(squeue -h -j "$sweep_id" 2>/dev/null)" ] && break; sleep 0.2; done
    python3 - "$tmp/sweep/sweep.json" "$new_tokens" $layouts <<'PY' || { cat "$tmp"/sweep-*.out "$tmp"/sweep-*.err; fails=$((fails + 1)); }
import json, sys
path, n, layouts = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
try:
    d = json.load(open(path))
except (OSError, ValueError) as e:
    print(f"FAIL: sweep: {path}: {e}"); sys.exit(1)
got = {f"{r['tp']}x{r['pp']}": r for r in d["runs"]}
bad = [l for l in layouts if l not in got or not got[l]["ok"] or got[l]["stats"].get("generated_tokens") != n
       or f"{got[l]['stats'].get('tp')}x{got[l]['stats'].get('pp')}" != l]
if bad or len(got) != len(layouts):
    print(f"FAIL: sweep: layouts {bad} missing or wrong in {json.dumps(d)[:2000]}"); sys.exit(1)
print(f"sweep: {len(layouts)} layout(s) in sweep.json, {n} tokens each")
PY
else
    echo "FAIL: sweep: sbatch said: $sweep_id"; fails=$((fails + 1))
fi
# scancel of a running generation leaves no rank behind (needs a model that decodes for a while).
long_model="$src/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -e "$long_model" ]; then
    # A prompt unique to this run, so the process pattern matches no other test's ranks.
    PROMPT="1,2,$((RANDOM % 30000 + 100)),$$"
    pat="^$bin generate --model $long_model --prompt-ids $PROMPT "
    # SmolLM2 has 9 heads (no TP 2): 2 ranks as 2 pipeline stages in `generate` mode.
    cancel_ranks=$gen_tp
    PPV=$gen_tp SUBMIT_ONLY=1 run_job cancel generate srun lattice.sbatch 1 "$long_model" 4000
    for _ in $(seq 100); do [ "$(job_state "$last_job")" = RUNNING ] && break; sleep 0.2; done
    for _ in $(seq 100); do [ "$(pgrep -fc "$pat")" -ge "$cancel_ranks" ] && break; sleep 0.2; done
    sleep 3
    if [ "$(pgrep -fc "$pat")" -lt "$cancel_ranks" ]; then
        echo "FAIL: cancel: the generation was not running before scancel"; sed 's/^/  | /' "$tmp/cancel.out" "$tmp/cancel.err"
        fails=$((fails + 1))
    fi
    scancel "$last_job"
    for _ in $(seq 150); do  # <= 30 s (KillWait)
        [ "$(job_state "$last_job")" = CANCELLED ] && [ "$(pgrep -fc "$pat")" -eq 0 ] && break
        sleep 0.2
    done
    left=$(pgrep -f "$pat" | tr '\n' ' ')
    echo "cancel: job $last_job $(job_state "$last_job"), rank processes left: ${left:-none}"
    if [ -n "$left" ]; then echo "FAIL: cancel left rank processes: $left"; kill -KILL $left; fails=$((fails + 1)); fi
else
    echo "FAIL: scancel of a running generation needs $long_model (scripts/setup.sh fetches it)"
    fails=$((fails + 1))
fi
[ $fails -eq 0 ] && echo "slurm: all checks passed"
[ $fails -eq 0 ]
