#!/usr/bin/env bash
# lattice across emulated hosts (hosts_lib.sh: a network + UTS namespace each, TCP between them, OpenMPI's
# rsh agent entering the namespace), launched as a user would: lattice-mpirun --hosts ... on host a.
#   test_hosts_generate.sh 2: hosts a, b; tp 2 x pp 2, 2 ranks per host.
#     - `lattice doctor` sees 4 ranks on 2 hosts, ranks 0,1 on a and 2,3 on b;
#     - MPI's own transport table (btl_base_verbose: "Using <btl> btl for send to <rank> on node <host>")
#       shows every TP pair (same pipeline stage) on shared memory (vader) inside its host and every
#       pair across pipeline stages on TCP: checked, not assumed from the rank order;
#     - generate gives the golden greedy tokens of tiny-llama2 (2 prompts).
#   test_hosts_generate.sh 4: hosts a..d, one rank each; tp 1 x pp 4 of tiny-gqa-llama3 (4 layers) gives
#     its golden tokens; tp 2 x pp 2 over 4 hosts of 1 slot is refused with one line (a TP group must
#     stay inside a node) before anything starts.
set -uo pipefail
source "$(dirname "$0")/hosts_lib.sh"
hosts_test_init "$0" "$@"
mode=${1:-2}
n=16

golden() {  # golden MODEL CASE prompt|greedy
    python3 - "$1/expected.json" "$2" "$3" "$n" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["cases"][int(sys.argv[2])]
ids = c["prompt_ids"] if sys.argv[3] == "prompt" else c["greedy_ids"][:int(sys.argv[4])]
print(("," if sys.argv[3] == "prompt" else " ").join(map(str, ids)))
PY
}

generate() {  # generate MODEL CASE HOSTS TP PP: checks the golden tokens
    local model=$1 case=$2 hosts=$3 tp=$4 pp=$5 out rc want t0
    want=$(golden "$model" "$case" greedy)
    t0=$(date +%s.%N)
    out=$(host_run a timeout 100 "$W" --hosts "$hosts" --tp "$tp" --pp "$pp" --cpu --bind none -q -- "$bin" generate \
          --model "$model" --prompt-ids "$(golden "$model" "$case" prompt)" --max-new-tokens $n --temperature 0 \
          --ignore-eos --print-ids --comm-timeout 30 2> "$HOSTS_DIR/err")
    rc=$?
    if [ $rc -ne 0 ] || ! grep -qxF -- "$want" <<< "$out"; then
        fail "$(basename "$model") on $hosts, tp $tp x pp $pp, case $case: rc $rc"
        echo "  want: $want"; echo "  got:  $out"; tail -n 5 "$HOSTS_DIR/err"
    else
        echo "$(basename "$model") on $hosts, tp $tp x pp $pp, case $case: $n golden tokens ($(elapsed "$t0") s)"
    fi
}

if [ "$mode" = 2 ]; then
    hosts_make a b || { echo "FAIL: cannot make the hosts"; exit 1; }
    host_run a "$W" --hosts a:2,b:2 --tp 2 --pp 2 --cpu --bind none -q -- "$bin" doctor > "$HOSTS_DIR/doctor" 2>&1 ||
        fail "doctor exited $?"
    for want in "world: 4 rank(s) on 2 host(s), asked tp 2 x pp 2" "rank 0 on a:" "rank 1 on a:" "rank 2 on b:" \
                "rank 3 on b:" "result: ok"; do
        grep -qF -- "$want" "$HOSTS_DIR/doctor" || fail "doctor: no '$want'"
    done
    [ $fails -eq 0 ] || sed 's/^/  | /' "$HOSTS_DIR/doctor"
    # The transport of every pair of ranks, from MPI itself, on a short tp 2 x pp 2 generation.
    model="$shared/golden/tiny-llama2"
    OMPI_MCA_btl_base_verbose=1 host_run a timeout 100 "$W" --hosts a:2,b:2 --tp 2 --pp 2 --cpu --bind none -q -- \
        "$bin" generate --model "$model" --prompt-ids 1,2 --max-new-tokens 2 --temperature 0 --ignore-eos \
        --comm-timeout 30 > "$HOSTS_DIR/btl" 2>&1 || fail "generate with the transport table exited $?"
    python3 - "$HOSTS_DIR/btl" 2 <<'PY' || fails=$((fails + 1))
import re, sys
tp = int(sys.argv[2])
rank_of, host_of, sends = {}, {}, []  # pid -> own rank (the one it reaches through 'self'), rank -> host
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"\[(\S+):(\d+)\] mca: bml: Using (\w+) btl for send to \[\[\d+,\d+\],(\d+)\] on node (\S+)", line)
    if not m:
        continue
    host, pid, btl, peer, peer_host = m.group(1), m.group(2), m.group(3), int(m.group(4)), m.group(5)
    host_of[peer] = peer_host
    if btl == "self":
        rank_of[pid] = peer
    sends.append((pid, btl, peer))
bad = []
pairs = set()
for pid, btl, peer in sends:
    me = rank_of.get(pid)
    if me is None or me == peer:
        continue
    same_stage = me // tp == peer // tp
    want = "vader" if same_stage else "tcp"
    pairs.add((me, peer, btl))
    if btl != want:
        bad.append(f"rank {me} -> {peer}: {btl}, want {want}")
    if same_stage != (host_of.get(me) == host_of.get(peer)):
        bad.append(f"rank {me} on {host_of.get(me)} and rank {peer} on {host_of.get(peer)}")
world = len(rank_of)
if world != 4 or len(pairs) != world * (world - 1):
    bad.append(f"transport table incomplete: {world} ranks, {len(pairs)} pairs")
for b in bad:
    print("FAIL: transport:", b)
if not bad:
    print("transport: TP pairs on vader (shared memory) inside a host, PP pairs on tcp across hosts:",
          ", ".join(f"{a}->{b} {t}" for a, b, t in sorted(pairs)))
sys.exit(1 if bad else 0)
PY
    for case in 0 1; do generate "$model" $case a:2,b:2 2 2; done
else
    hosts_make a b c d || { echo "FAIL: cannot make the hosts"; exit 1; }
    for case in 0 1; do generate "$shared/golden/tiny-gqa-llama3" $case a:1,b:1,c:1,d:1 1 4; done
    out=$(host_run a "$W" --hosts a:1,b:1,c:1,d:1 --tp 2 --pp 2 --cpu -- "$bin" generate \
          --model "$shared/golden/tiny-llama2" --prompt-ids 1 --max-new-tokens 1 2>&1)
    rc=$?
    if [ $rc -ne 2 ] || [ "$(wc -l <<< "$out")" -ne 1 ] || ! grep -qF "do not hold whole TP groups of 2" <<< "$out"; then
        fail "tp 2 x pp 2 over 4 one-slot hosts: want exit 2 and one line refusing it, got rc $rc:"
        sed 's/^/  | /' <<< "$out"
    else
        echo "tp 2 x pp 2 over 4 one-slot hosts refused: $out"
    fi
fi
[ $fails -eq 0 ]
