#!/usr/bin/env bash
# Kill one of 4 ranks (tp 1 x pp 4, CPU) with SIGKILL in the middle of a generation started by
# lattice-mpirun: every other rank must exit within the communicator timeout + 5 s, the job exits
# non-zero, its output names the killed rank and its host, and no rank process is left.
# Needs a model that decodes for longer than the test waits: the default SmolLM2-135M GGUF
# (scripts/fetch_default_model.sh); fails when it is not there. Its 9
# attention heads allow no TP 2, hence 4 pipeline stages.
set -uo pipefail
set -m
src=${LATTICE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
bin=${LATTICE_BIN:?set LATTICE_BIN to the lattice executable}
W="$src/launch/lattice-mpirun"
model=${LATTICE_KILL_TEST_MODEL:-$src/models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -e "$model" ] || { echo "FAIL: $model missing (scripts/setup.sh fetches it)"; exit 1; }
timeout_s=10
victim=2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$W" --tp 1 --pp 4 --cpu --oversubscribe -- "$bin" generate --model "$model" --prompt-ids 1,2,3 \
    --max-new-tokens 4000 --temperature 0 --ignore-eos --comm-timeout $timeout_s > "$log" 2>&1 &
job=$!
# The ranks are children of mpirun; find rank $victim by its OMPI_COMM_WORLD_RANK.
pid=""
for _ in $(seq 300); do
    for p in $(pgrep -P "$job"); do
        if { tr '\0' '\n' < "/proc/$p/environ"; } 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$victim"; then pid=$p; fi
    done
    [ -n "$pid" ] && break
    sleep 0.1
done
[ -n "$pid" ] || { echo "FAIL: rank $victim never started"; cat "$log"; kill -TERM "$job"; exit 1; }
ranks=$(pgrep -P "$job" | tr '\n' ' ')
sleep 4  # past model load, into decode
kill -0 "$job" 2>/dev/null || { echo "FAIL: the job ended before the kill (not mid-generation)"; cat "$log"; exit 1; }
kill -KILL "$pid"
t0=$(date +%s.%N)
limit=$((timeout_s + 5))
for _ in $(seq $((limit * 10))); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
fails=0
if kill -0 "$job" 2>/dev/null; then
    echo "FAIL: the job still runs ${limit} s after rank $victim was killed"; kill -KILL "$job"; fails=$((fails + 1))
fi
wait "$job"; rc=$?
[ $rc -ne 0 ] || { echo "FAIL: the job exited 0 after losing a rank"; fails=$((fails + 1)); }
left=""  # a zombie (exited, parent gone, not yet reaped by init) is not left behind
for p in $ranks; do
    st=$(ps -o stat= -p "$p" 2>/dev/null)
    [ -n "$st" ] && [[ "$st" != Z* ]] && left="$left $p"
done
[ -z "$left" ] || { echo "FAIL: rank processes left behind:$left"; kill -KILL $left; fails=$((fails + 1)); }
host=$(hostname)
grep -E "rank $victim\b" "$log" | grep -qF "$host" ||
    { echo "FAIL: no line names rank $victim and host $host:"; sed 's/^/  | /' "$log"; fails=$((fails + 1)); }
echo "killed rank $victim (pid $pid): job exited $rc after ${dt} s; lines naming it:"
grep -E "rank $victim\b" "$log" | sed 's/^/  | /' | head -5
[ $fails -eq 0 ]
