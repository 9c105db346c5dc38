#!/usr/bin/env bash
# A batch job that lost a node finishes on the node left, at a smaller layout (emulated hosts,
# hosts_lib.sh). launch/slurm/batch.sbatch run as a plain script on host a (as a restarted Slurm job
# runs it), PP=auto (one pipeline stage per node it has), TP=2, tiny-llama2 (CPU ranks, greedy, ignore_eos):
#  1. HOSTS=a:2,b:2: tp 2 x pp 2, one stage per host; once >= 2 records are written, every process on
#     b is SIGKILLed: the job ends (non-zero) with some ids left. The test does not pace the job: it only
#     watches the output, so the batch is long enough (24 requests of 200 tokens, ~2 s idle; each record
#     ~80 ms) that the watcher sees record 2 long before the last (12 requests of 24 tokens, 0.11 s in all,
#     finished before a 50 ms watcher could kill b);
#  2. HOSTS=a:2 (what is left): the script picks tp 2 x pp 1 on a, resumes from OUTPUT and exits 0.
# Checks: the second run's layout line says TP=2 PP=1 on 1 node; every custom_id has exactly one record;
# the records written before the loss are unchanged (byte for byte, the output's first lines); ids i and
# i + 12 share a prompt, so an id done at tp 2 x pp 2 before the loss has a twin done at tp 2 after it
# (requests run in order, --max-seqs 1): their texts must be equal (greedy outputs do not depend on pp). ~10 s.
set -uo pipefail
source "$(dirname "$0")/hosts_lib.sh"
hosts_test_init "$0" "$@"
model="$shared/golden/tiny-llama2"
nreq=24
hosts_make a b || { echo "FAIL: cannot make the hosts"; exit 1; }
in="$HOSTS_DIR/in.jsonl"
python3 - "$in" $nreq <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    n = int(sys.argv[2])
    for i in range(n):
        f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"prompt": [1, 5 + i % (n // 2), 7, 9], "max_tokens": 200, "temperature": 0,
                                     "ignore_eos": True}}) + "\n")
PY

# COMM_TIMEOUT=30: set when, with 10, b's ranks reached the first collective more than 10 s after a's beside two
# busy processes (CI: "creating communicator 'plans': not every rank arrived within 10 s", 0 records); that
# start-up wait is now --start-timeout's (default 600 s). The loss of b is not waited out by it: mpirun sees b's
# daemon die and ends the job at once.
batch() {  # batch HOSTS OUTPUT LOG: batch.sbatch as a plain script on host a
    host_run a env MODEL="$model" INPUT="$in" OUTPUT="$2" TP=2 PP=auto HOSTS="$1" CPU_RANKS=1 LATTICE="$bin" \
        LATTICE_MPIRUN="$W" DRAIN_SECONDS=1 COMM_TIMEOUT=30 EXTRA_ARGS="--threads 1 --progress none --max-seqs 1" \
        timeout 100 bash "$src/launch/slurm/batch.sbatch" > "$3" 2>&1
}

# 1. two hosts, b lost mid-batch
out="$HOSTS_DIR/out.jsonl"
t0=$(date +%s.%N)
batch a:2,b:2 "$out" "$HOSTS_DIR/run1.log" &
job=$!
while :; do  # no deadline of its own (the job's `timeout 100` bounds it): on CI's loaded 2 cores the two-host
    # start alone took over 30 s
    [ -f "$out" ] && [ "$(wc -l < "$out")" -ge 2 ] && break
    kill -0 $job 2> /dev/null || break
    sleep 0.02
done
kill -KILL $(host_pids b) 2> /dev/null
wait $job
rc1=$?
# The complete lines the loss left (a torn last line would be cut by the rerun).
python3 -c 'import sys; d = open(sys.argv[1], "rb").read(); open(sys.argv[2], "wb").write(d[:d.rfind(b"\n") + 1])' \
    "$out" "$HOSTS_DIR/before.jsonl" 2> /dev/null || : > "$HOSTS_DIR/before.jsonl"
n1=$(wc -l < "$HOSTS_DIR/before.jsonl")
echo "run 1 (tp 2 x pp 2 on a:2,b:2, b killed): exit $rc1 after $(elapsed "$t0") s, $n1 of $nreq records"
grep -qF "TP=2 PP=2 on 2 node(s)" "$HOSTS_DIR/run1.log" || fail "run 1: not TP=2 PP=2 on 2 nodes"
[ $rc1 -ne 0 ] || fail "run 1 exited 0: b was killed too late"
[ "$n1" -ge 2 ] && [ "$n1" -lt $nreq ] || fail "run 1: want 2..$((nreq - 1)) records before the loss, got $n1"

# 2. what is left: host a alone
t0=$(date +%s.%N)
batch a:2 "$out" "$HOSTS_DIR/run2.log"
rc2=$?
echo "run 2 (PP=auto on a:2): exit $rc2 after $(elapsed "$t0") s; $(grep -o 'TP=2 PP=[0-9]* on [0-9]* node(s)' "$HOSTS_DIR/run2.log")"
[ $rc2 -eq 0 ] || fail "run 2 exited $rc2"
grep -qF "TP=2 PP=1 on 1 node(s)" "$HOSTS_DIR/run2.log" || fail "run 2: not TP=2 PP=1 on 1 node"

python3 - "$out" "$HOSTS_DIR/before.jsonl" $nreq <<'PY' || fails=$((fails + 1))
import json, sys
out, before = (open(p, "rb").read() for p in sys.argv[1:3])
n = int(sys.argv[3])
bad = []
if not out.startswith(before):
    bad.append("the records written before the loss changed")
recs = [json.loads(l) for l in out.splitlines()]
ids = [r["custom_id"] for r in recs]
if sorted(ids) != sorted(f"r{i}" for i in range(n)):
    bad.append(f"ids: {sorted(ids)}")
text = lambda r: r["response"]["body"]["choices"][0]["text"]  # noqa: E731
by_id = {r["custom_id"]: text(r) for r in recs}
early = {json.loads(l)["custom_id"] for l in before.splitlines()}
half = n // 2
pairs = [(f"r{i}", f"r{i + half}") for i in range(half) if f"r{i}" in early and f"r{i + half}" not in early]
diff = [p for p in pairs if by_id.get(p[0]) != by_id.get(p[1])]
if diff or not pairs:
    bad.append(f"outputs differ between tp 2 x pp 2 (before the loss) and tp 2 (after it): {diff or 'no pair'}")
for b in bad:
    print("FAIL:", b)
kept = len(before.splitlines())
if not bad:
    print(f"every id once ({len(ids)} records), the {kept} written before the loss unchanged; "
          f"{len(pairs)} of them equal to their twins run at tp 2 on one host")
sys.exit(1 if bad else 0)
PY
[ $fails -eq 0 ] || sed 's/^/  | /' "$HOSTS_DIR"/run*.log
[ $fails -eq 0 ]
