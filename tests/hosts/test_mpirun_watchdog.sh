#!/usr/bin/env bash
# lattice-mpirun's watchdog (launch/mpirun_watchdog.py) without namespaces or root: a stand-in mpirun
# (--mpirun) on two named hosts plays the launcher's failures.
#  - "hang": prints a rank's fatal line ("lattice: error: ...") and keeps running (as mpirun does when it
#    cannot reach a lost host): the wrapper ends it --abort-grace 1 s later (TERM ignored, so KILL 3 s
#    after), one line saying so; the job exits non-zero within 10 s and the relay leaves nothing behind.
#  - "banner": prints OpenMPI's lost-daemon banner for host b and exits 205: one line "lost host b
#    (ranks 2-3)", the exit code passed through, every byte of the stand-in's stderr relayed in order.
#  - "ok": prints a fatal-looking line and exits 0 2 s later, with --abort-grace 0 (never kill):
#    nothing added, exit 0.
# The stand-in's own children stay in its (the caller's) process group: the watchdog must signal them
# one by one, never that group (it would kill the caller: a shell, a batch script).
set -uo pipefail
src=${LATTICE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
W="$src/launch/lattice-mpirun"
: "${LATTICE_BIN:?set LATTICE_BIN to the lattice executable}"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
cat > "$tmp/mpirun" <<'SH'
#!/usr/bin/env bash
case $FAKE in
    hang) trap '' TERM; echo "lattice: error: recv timed out; rank 2 [pid 7 on b]" >&2; while :; do sleep 0.1; done ;;
    banner) for i in $(seq 50); do echo "line $i" >&2; done
            printf '%s\n' "ORTE has lost communication with a remote daemon." "" \
                "  HNP daemon   : [[1,0],0] on node a" "  Remote daemon: [[1,0],1] on node b" >&2
            exit 205 ;;
    ok) echo "out"; echo "lattice: error: x" >&2; sleep 2; exit 0 ;;
esac
SH
chmod +x "$tmp/mpirun"
run() {  # run FAKE [wrapper options]: rc and stderr in $tmp/err, seconds in $dt
    local fake=$1 t0; shift
    t0=$(date +%s.%N)
    rm -f "$tmp/rc"
    # The caller (a subshell in its own process group, set -m) shares that group with the wrapper and
    # the stand-in's children: it must live to record the exit code.
    ( FAKE=$fake "$W" --mpirun "$tmp/mpirun" --hosts a:2,b:2 --tp 2 --pp 2 --cpu --bind none -q "$@" \
        -- "$LATTICE_BIN" generate > "$tmp/out" 2> "$tmp/err"; echo $? > "$tmp/rc" ) &
    local caller=$! _
    for _ in $(seq 300); do kill -0 $caller 2> /dev/null || break; sleep 0.1; done
    kill -0 $caller 2> /dev/null && { fail "$fake: still running after 30 s"; kill -KILL -- -$caller; }
    wait $caller
    rc=$(cat "$tmp/rc" 2> /dev/null || echo "none: the caller was killed")
    dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
}
set -m  # this script is its own process group's leader; a kill of that group would end it here
run hang --abort-grace 1
[[ "$rc" =~ ^[0-9]+$ ]] && [ "$rc" -ne 0 ] || fail "hang: rc $rc"
awk -v t="$dt" 'BEGIN { exit !(t < 10) }' || fail "hang: took $dt s"
grep -q "^lattice-mpirun: mpirun did not end 1 s after a rank's fatal error (recv timed out; rank 2 \[pid 7 on b\]); killing it" \
    "$tmp/err" || { fail "hang: no watchdog line"; cat "$tmp/err"; }
echo "hang: exit $rc after $dt s"
run banner
[ "$rc" = 205 ] || fail "banner: rc $rc, want 205"
grep -qx "lattice-mpirun: lost host b (ranks 2-3): OpenMPI lost its daemon there or could not start it (host down or unreachable); the job ends" \
    "$tmp/err" || { fail "banner: no line naming host b"; cat "$tmp/err"; }
[ "$(grep "^line " "$tmp/err" | tr '\n' ' ')" = "$(seq -f 'line %g' 50 | tr '\n' ' ')" ] || fail "banner: relay lost or reordered lines"
run ok --abort-grace 0
[ "$rc" = 0 ] && [ "$(cat "$tmp/out")" = out ] && [ "$(cat "$tmp/err")" = "lattice: error: x" ] ||
    { fail "ok: rc $rc, out '$(cat "$tmp/out")', err:"; cat "$tmp/err"; }
# Nothing of the relay left once the job is over (it exits at end of file).
for _ in $(seq 50); do pgrep -f "$tmp/mpirun" > /dev/null || break; sleep 0.1; done
pgrep -fa "$tmp/mpirun" && fail "processes left"
[ $fails -eq 0 ] && echo "watchdog: all checks passed"
[ $fails -eq 0 ]
