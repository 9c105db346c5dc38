#!/usr/bin/env bash
# SIGTERM / SIGINT to a job started by lattice-mpirun stop every rank: the wrapper execs mpirun, so
# the signal reaches mpirun itself, which forwards it to the ranks. Checks: the job exits non-zero
# within 15 s and no rank process is left (zombies awaiting init's reaping do not count).
# Ranks: `sleep` (any program), then `lattice generate` on 2 pipeline stages of the default
# SmolLM2 model mid-decode, which must be present (scripts/setup.sh fetches it).
set -uo pipefail
set -m  # background jobs get their own process group and keep SIGINT (not ignored as without job control)
src=${LATTICE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
W="$src/launch/lattice-mpirun"
bin=${LATTICE_BIN:-}
model="$src/models/SmolLM2-135M-Instruct.Q4_1.gguf"
fails=0

alive() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null); [ -n "$st" ] && [[ "$st" != Z* ]]; }

# signal_job SIG RANKS SETTLE_S LABEL wrapper-args...: start, wait for RANKS children of mpirun,
# wait SETTLE_S more, send SIG to mpirun, check that it and every rank are gone.
signal_job() {
    local sig=$1 nranks=$2 settle=$3 label=$4; shift 4
    "$W" "$@" >/dev/null 2>&1 &
    local job=$! ranks="" _ p
    for _ in $(seq 150); do
        ranks=$(pgrep -P "$job" | tr '\n' ' ')
        [ "$(wc -w <<< "$ranks")" -ge "$nranks" ] && break
        sleep 0.1
    done
    if [ "$(wc -w <<< "$ranks")" -lt "$nranks" ]; then
        echo "FAIL: SIG$sig $*: expected $nranks ranks, found: $ranks"; kill -KILL "$job"; fails=$((fails + 1)); return
    fi
    sleep "$settle"
    alive "$job" || { echo "FAIL: SIG$sig $*: the job ended before the signal"; fails=$((fails + 1)); return; }
    local t0; t0=$(date +%s.%N)
    kill -s "$sig" "$job"
    for _ in $(seq 150); do alive "$job" || break; sleep 0.1; done
    if alive "$job"; then
        echo "FAIL: SIG$sig: mpirun still running 15 s after the signal"; kill -KILL "$job"; fails=$((fails + 1))
    fi
    wait "$job"; local rc=$?
    local dt; dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    sleep 0.5
    local left=""
    for p in $ranks; do alive "$p" && left="$left $p"; done
    if [ -n "$left" ]; then echo "FAIL: SIG$sig: rank processes left behind:$left"; kill -KILL $left; fails=$((fails + 1)); fi
    [ "$rc" -ne 0 ] || { echo "FAIL: SIG$sig: job exited 0"; fails=$((fails + 1)); }
    echo "SIG$sig to $nranks ranks of $label: job exited $rc after ${dt} s, left:${left:- none}"
}

for sig in TERM INT; do
    signal_job "$sig" 4 0 sleep --tp 2 --pp 2 --cpu --oversubscribe -- sleep "400.$$$RANDOM"
done
if [ -n "$bin" ] && [ -x "$bin" ] && [ -e "$model" ]; then
    for sig in TERM INT; do
        signal_job "$sig" 2 4 "lattice generate" --tp 1 --pp 2 --cpu --oversubscribe -- "$bin" generate --model "$model" \
            --prompt-ids 1,2,3 --max-new-tokens 4000 --temperature 0 --ignore-eos --comm-timeout 10
    done
else
    echo "FAIL: signals to lattice generate need LATTICE_BIN and $model (scripts/setup.sh fetches it)"
    fails=$((fails + 1))
fi
[ $fails -eq 0 ]
