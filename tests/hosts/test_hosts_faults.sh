#!/usr/bin/env bash
# A host or link lost mid-generation (emulated hosts, hosts_lib.sh): the whole job ends - every process
# on every host, launcher included - within the communicator timeout T plus a stated grace G, with one
# line naming the lost host and rank. Layout: tp 1 x pp 2, one stage per host (a: rank 0 and the
# launcher, b: rank 1), the default SmolLM2 model streaming text (SKIP without it), --comm-timeout T.
#   test_hosts_faults.sh kill      every process on b SIGKILLed (a host's processes lost)
#   test_hosts_faults.sh link      b's link taken down (`ip link set ... down`: no reset, a cut cable)
#   test_hosts_faults.sh link-nokeepalive
#                                  the same with OpenMPI's daemon-link keepalive off
#                                  (OMPI_MCA_oob_tcp_keepalive_time=0): mpirun waits on the lost host
#                                  forever, so the wrapper's watchdog must end it G s after rank 0's
#                                  fatal line; the line naming rank 1 and host b is rank 0's own. b's
#                                  MPI daemon stays (nothing can reach it; it would wait for its TCP
#                                  to give up), but b's rank must be gone.
#   test_hosts_faults.sh start     b unreachable from the start (its link down before the launch): its
#                                  MPI daemon cannot call back; the job ends naming b (times from launch)
#   test_hosts_faults.sh daemon    b's MPI daemon frozen (SIGSTOP), then b's link down: b's rank times
#                                  out, its MPI_Abort cannot reach its daemon, so it must exit by itself
#                                  with code 69 (parallel/world_session.h) within T + 10 s.
# Each prints "fault MODE: exit RC after S s; all processes gone after S2 s; line: ..." (the measured
# times of docs/multi-host.md). Waits are bounded polls on conditions.
set -uo pipefail
source "$(dirname "$0")/hosts_lib.sh"
hosts_test_init "$0" "$@"
mode=${1:?mode: kill, link, link-nokeepalive, daemon or start}
need_smol
model=$smol
T=8      # --comm-timeout
G=10     # lattice-mpirun --abort-grace
SELF=10  # a rank's self-exit after a failed MPI_Abort (kAbortSelfExitAfterS)
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
hosts_make a b || { echo "FAIL: cannot make the hosts"; exit 1; }
[ "$mode" = link-nokeepalive ] && export OMPI_MCA_oob_tcp_keepalive_time=0

live_pids() {  # live_pids HOST: processes on HOST that have not exited (zombies excluded)
    local p st
    for p in $(host_pids "$1"); do
        st=$(awk '{ sub(/.*\) /, ""); print $1 }' "/proc/$p/stat" 2>/dev/null)
        [ -n "$st" ] && [ "$st" != Z ] && echo "$p"
    done
}
rank_pid() {  # rank_pid HOST: the lattice rank process on HOST
    local p
    for p in $(live_pids "$1"); do
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = lattice ] && { echo "$p"; return; }
    done
}

t0=$(date +%s.%N)
[ "$mode" = start ] && link_down b  # b never reachable: its daemon cannot call back
host_run a "$W" --hosts a:1,b:1 --tp 1 --pp 2 --cpu --bind none --abort-grace $G -- "$bin" generate --model "$model" \
    --prompt "Once upon a time" --max-new-tokens 4000 --temperature 0 --ignore-eos --comm-timeout $T \
    > "$HOSTS_DIR/out" 2> "$HOSTS_DIR/err" &
job=$!
# Mid-generation: the streamed text (flushed per token) has grown past 20 bytes.
for _ in $(seq 1200); do
    [ "$mode" = start ] && break
    [ "$(stat -c %s "$HOSTS_DIR/out")" -gt 20 ] && break
    kill -0 $job 2> /dev/null || break
    sleep 0.1
done
if [ "$mode" != start ] && { [ "$(stat -c %s "$HOSTS_DIR/out")" -le 20 ] || ! kill -0 $job 2> /dev/null; }; then
    echo "FAIL: the generation never started streaming"; sed 's/^/  | /' "$HOSTS_DIR/err"; exit 1
fi
if [ "$mode" != start ]; then
    victim=$(rank_pid b)
    [ -n "$victim" ] || { echo "FAIL: no rank on host b"; exit 1; }
    orted=$(for p in $(live_pids b); do [ "$(cat /proc/$p/comm)" = orted ] && echo "$p"; done)
    t0=$(date +%s.%N)
fi
case $mode in
    start) ;;
    kill) kill -KILL $(live_pids b) ;;
    link | link-nokeepalive) link_down b ;;
    daemon) kill -STOP $orted; link_down b ;;
    *) echo "FAIL: unknown mode $mode"; exit 1 ;;
esac
limit=$((T + G + 5))  # + 5: the watchdog's TERM-to-KILL 3 s and the poll
for _ in $(seq $((limit * 10))); do kill -0 $job 2> /dev/null || break; sleep 0.1; done
t_launcher=$(elapsed "$t0")
if kill -0 $job 2> /dev/null; then
    fail "the launcher still runs $limit s after the fault"
    kill -KILL $job
fi
wait $job; rc=$?
# Every process on every host (b's daemon aside where nothing can reach it) is gone.
left=""
for _ in $(seq $((limit * 10))); do
    left="$(live_pids a) $(live_pids b)"
    if [ "$mode" = link-nokeepalive ] || [ "$mode" = daemon ]; then  # b's unreachable daemon (and its shell) stay
        left=$(for p in $left; do tr '\0' ' ' < "/proc/$p/cmdline" 2> /dev/null | grep -q orted || echo "$p"; done)
    fi
    [ -z "$(tr -d ' \n' <<< "$left")" ] && break
    sleep 0.1
done
t_all=$(elapsed "$t0")
[ -z "$(tr -d ' \n' <<< "$left")" ] || {
    fail "processes left $t_all s after the fault:"; for p in $left; do ps -o pid=,args= -p "$p"; done; }
awk -v a="$t_all" -v l="$limit" 'BEGIN { exit !(a <= l) }' || fail "the job took $t_all s to end (limit T + G + 5 = $limit s)"
[ $rc -ne 0 ] || fail "the job exited 0 after losing host b"

case $mode in
    kill | link | start) line=$(grep -m1 "^lattice-mpirun: lost host b (rank 1)" "$HOSTS_DIR/err") ;;
    link-nokeepalive)
        line=$(grep -m1 "^lattice: error: .*rank 1 \[pid $victim on b\]" "$HOSTS_DIR/err")
        grep -q "^lattice-mpirun: mpirun did not end $G s after a rank's fatal error" "$HOSTS_DIR/err" ||
            fail "no line from the wrapper's watchdog" ;;
    daemon)
        line=$(grep -m1 "^lattice-mpirun: lost host b (rank 1)" "$HOSTS_DIR/err")
        # b's rank is a zombie of its frozen daemon: its exit code is in /proc (field 52, waitpid's form).
        code=$(awk '{ sub(/.*\) /, ""); print $50 }' "/proc/$victim/stat" 2>/dev/null)
        if [ "${code:-x}" != $((69 << 8)) ]; then
            fail "rank 1 did not exit by itself with code 69 (waitpid status ${code:-gone})"
        else
            echo "rank 1 on b exited by itself with code 69 (MPI_Abort could not reach its frozen daemon)"
        fi ;;
esac
[ -n "$line" ] || fail "no line naming host b and rank 1"
[ $fails -eq 0 ] || { echo "stderr:"; sed 's/^/  | /' "$HOSTS_DIR/err"; cat "$HOSTS_DIR"/*.daemon.log 2> /dev/null | tail -5; }
echo "fault $mode: exit $rc after $t_launcher s (launcher); all processes gone after $t_all s; line: $line"
[ $fails -eq 0 ]
