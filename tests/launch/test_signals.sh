#!/usr/bin/env bash
# SIGTERM / SIGINT to a job started by lattice-mpirun stop every rank: the wrapper execs mpirun, so
# the signal reaches mpirun itself, which forwards it to the ranks. Checks: the job exits non-zero
# within 15 s and no rank process is left (pgrep on a command line unique to this test run).
# The ranks are `sleep` here (any program); test_kill_rank.sh does the same with lattice generate.
set -uo pipefail
set -m  # background jobs get their own process group and keep SIGINT (not ignored as without job control)
src=${LATTICE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
W="$src/launch/lattice-mpirun"
fails=0
for sig in TERM INT; do
    marker="400.$$$RANDOM"  # sleep seconds: a command line no other process has
    "$W" --tp 2 --pp 2 --cpu --oversubscribe -- sleep "$marker" 2>/dev/null &
    job=$!
    for _ in $(seq 100); do [ "$(pgrep -fc "^sleep $marker\$")" -eq 4 ] && break; sleep 0.1; done
    ranks=$(pgrep -fc "^sleep $marker\$")
    if [ "$ranks" -ne 4 ]; then
        echo "FAIL: SIG$sig: expected 4 ranks running, found $ranks"; fails=$((fails + 1))
    fi
    t0=$(date +%s.%N)
    kill -s "$sig" "$job"
    for _ in $(seq 150); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$job" 2>/dev/null; then
        echo "FAIL: SIG$sig: mpirun still running 15 s after the signal"; kill -KILL "$job"; fails=$((fails + 1))
    fi
    wait "$job"; rc=$?
    dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    sleep 0.5
    left=$(pgrep -fc "^sleep $marker\$")
    if [ "$left" -ne 0 ]; then
        echo "FAIL: SIG$sig: $left rank process(es) left behind:"; pgrep -fa "^sleep $marker\$"
        kill -KILL $(pgrep -f "^sleep $marker\$"); fails=$((fails + 1))
    fi
    [ "$rc" -ne 0 ] || { echo "FAIL: SIG$sig: job exited 0"; fails=$((fails + 1)); }
    echo "SIG$sig: job exited $rc after ${dt}s, $left rank(s) left"
done
[ $fails -eq 0 ]
