#!/usr/bin/env bash
# One line per error. A user must see one line naming the culprit, once, from one rank,
# without source locations; --verbose restores the origin and every rank's own line.
#  - 1 rank: a bad flag -> exit 2, one line, "see lattice generate --help", no [file:line]; a malformed
#    LATTICE_SCHED_SLICE_US -> exit 1, one line naming it;
#    a missing --model -> exit 1, one line naming it, no [host r0/1 file:line]; --verbose adds it.
#  - mpirun -np 4 with a missing --model: every rank exits 1 through MPI_Finalize (no MPI_ABORT
#    banner, no SIGTERM notices); of lattice's own lines exactly one, naming the path (mpirun's own
#    "exited with non-zero status" block may follow: it is mpirun's, not lattice's).
#  - the same through `lattice-mpirun --quiet` (mpirun -q): stderr is exactly that one line.
#  - mpirun -np 4 with a bad flag: one line (the launcher's rank 0), exit 2.
# Usage: test_error_lines.sh single|ranks — the 1-rank half (ctest launch_error_lines) or the mpirun
# half (launch_error_lines_ranks), which exits 77 (CTest: Skipped, with the reason) without mpirun.
set -uo pipefail
part=${1:?usage: test_error_lines.sh single|ranks}
case $part in single|ranks) ;; *) echo "test_error_lines.sh: unknown part '$part' (single or ranks)"; exit 2 ;; esac
src=${LATTICE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
bin=${LATTICE_BIN:?LATTICE_BIN must name the lattice executable}
source "$src/tests/launch/check_lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bad=/nonexistent/model.gguf

lines() { grep -c . "$1" || true; }
# Lines of a run's stderr that are lattice's: drops mpirun's own banner blocks (between its
# "-----" rulers) and the wrapper's announced command.
own_lines() { awk '/^--------------------+$/ {inside = !inside; next} !inside' "$1" | grep -v '^lattice-mpirun: ' | grep -c . || true; }
expect() {  # expect DESCRIPTION FILE WANT_LINES PATTERN [ANTI_PATTERN]
    local what=$1 f=$2 n=$3 pat=$4 anti=${5:-}
    local got; got=$(own_lines "$f")
    if [ "$got" != "$n" ] || ! grep -q -- "$pat" "$f" || { [ -n "$anti" ] && grep -qE -- "$anti" "$f"; }; then
        echo "FAILED: $what: want $n line(s) with '$pat'${anti:+ and none matching '$anti'}, got $got:"
        sed 's/^/  | /' "$f"
        fail=$((fail + 1))
    else
        pass=$((pass + 1))
    fi
}
rc_is() { [ "$1" = "$2" ] || { echo "  exit code $1, want $2"; return 1; }; }
loc='\[[^]]* r[0-9]+/[0-9]+ [^]]*:[0-9]+\]'  # the [host rR/N file:line] origin

single_rank() {
    "$bin" generate --max-new-tokens=-3 >"$tmp/o" 2>"$tmp/e"; rc=$?
    check "bad flag exits 2" rc_is $rc 2
    expect "bad flag: one line" "$tmp/e" 1 "see lattice generate --help" "$loc"

    "$bin" generate --model "$bad" --prompt hi >"$tmp/o" 2>"$tmp/e"; rc=$?
    check "missing model exits 1" rc_is $rc 1
    expect "missing model: one line, no origin" "$tmp/e" 1 "$bad" "$loc"

    "$bin" --verbose generate --model "$bad" --prompt hi >"$tmp/o" 2>"$tmp/e"; rc=$?
    check "--verbose: exit 1" rc_is $rc 1
    expect "--verbose: the origin is back" "$tmp/e" 1 "$bad" ""
    check "--verbose: [host r0/1 file:line]" grep -qE "$loc" "$tmp/e"

    LATTICE_SCHED_SLICE_US=fast "$bin" generate --model "$bad" --prompt hi >"$tmp/o" 2>"$tmp/e"; rc=$?
    check "bad LATTICE_SCHED_SLICE_US exits 1" rc_is $rc 1
    expect "bad LATTICE_SCHED_SLICE_US: one line naming it" "$tmp/e" 1 "LATTICE_SCHED_SLICE_US=fast" "$loc"
}

ranks() {
    command -v mpirun >/dev/null || { echo "SKIP: no mpirun on PATH: the multi-rank cases cannot run here"; exit 77; }
    timeout 120 "${mpirun[@]}" -np 4 "$bin" generate --model "$bad" --prompt hi --threads 1 >"$tmp/o" 2>"$tmp/e"; rc=$?
    check "mpirun -np 4, missing model: exit 1" rc_is $rc 1
    expect "mpirun -np 4, missing model: one line of lattice's" "$tmp/e" 1 "$bad" "MPI_ABORT|SIGTERM|ORTE_ERROR_LOG|$loc"

    timeout 120 "${mpirun[@]}" -np 4 "$bin" -v generate --model "$bad" --prompt hi --threads 1 >"$tmp/o" 2>"$tmp/e"; rc=$?
    check "mpirun -np 4 --verbose: exit 1" rc_is $rc 1
    expect "mpirun -np 4 --verbose: every rank's line with its origin" "$tmp/e" 4 "r3/4" "MPI_ABORT"

    timeout 120 "${mpirun[@]}" -np 4 "$bin" generate --top-k=-1 >"$tmp/o" 2>"$tmp/e"; rc=$?
    check "mpirun -np 4, bad flag: exit 2" rc_is $rc 2
    expect "mpirun -np 4, bad flag: one line" "$tmp/e" 1 "top-k" "$loc"

    LATTICE_BIN="$bin" timeout 120 python3 "$src/launch/lattice-mpirun" --quiet --tp 1 --pp 4 --cpu -- \
        "$bin" generate --model "$bad" --prompt hi --threads 1 >"$tmp/o" 2>"$tmp/e"; rc=$?
    check "lattice-mpirun --quiet, missing model: exit 1" rc_is $rc 1
    check "lattice-mpirun --quiet, missing model: stderr is one line" [ "$(lines "$tmp/e")" = 1 ]
    expect "lattice-mpirun --quiet: the line names the model" "$tmp/e" 1 "$bad" "$loc"
}

if [ "$part" = single ]; then
    single_rank
    finish error_lines_single
else
    ranks
    finish error_lines_ranks
fi
