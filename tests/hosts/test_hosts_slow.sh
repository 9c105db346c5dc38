#!/usr/bin/env bash
# Slow is not dead: host b's link shaped mid-generation to 200 kbit/s (`tc qdisc ... tbf`: a token
# bucket, what this machine's kernel offers; it has no netem) must only slow the job down. tp 1 x pp 2,
# one stage per host, the default SmolLM2 model (SKIP without it), 48 greedy tokens of a text prompt,
# --comm-timeout 60. The bucket is 80 KiB: tbf drops every packet larger than its bucket, and the veth
# hands it GSO packets of up to 64 KiB, so with a 4 KiB bucket a large enough send (more of them on a
# loaded machine) was dropped at each retransmission: the link stalled for good and the job ended on the
# communicator timeout (CI, twice). The rate still binds: decode needs ~2 KB a token. Checks: the shaped run exits 0 with the same text as an unshaped run on the same
# hosts, and its decode is slower (the stats line's tok/s), i.e. the shaping did bite.
set -uo pipefail
source "$(dirname "$0")/hosts_lib.sh"
hosts_test_init "$0" "$@"
need_smol
model=$smol
command -v tc > /dev/null || hosts_skip "tc not found"
hosts_make a b || { echo "FAIL: cannot make the hosts"; exit 1; }

run() {  # run NAME [shape]: generation on a:1,b:1; with "shape", b's port is rate-limited once text streams
    host_run a timeout 100 "$W" --hosts a:1,b:1 --tp 1 --pp 2 --cpu --bind none -q -- "$bin" generate --model "$model" \
        --prompt "Once upon a time" --max-new-tokens 48 --temperature 0 --ignore-eos --comm-timeout 60 \
        > "$HOSTS_DIR/$1.out" 2> "$HOSTS_DIR/$1.err" &
    local job=$! _
    if [ "${2:-}" = shape ]; then
        for _ in $(seq 1200); do
            [ "$(stat -c %s "$HOSTS_DIR/$1.out")" -gt 8 ] && break
            kill -0 $job 2> /dev/null || break
            sleep 0.05
        done
        kill -0 $job 2> /dev/null || fail "$1: the run ended before the link was shaped"
        tc qdisc add dev "p-b" root tbf rate 200kbit burst 80kb latency 2s || fail "$1: tc refused the shaping"
        host_run b tc qdisc add dev eth0 root tbf rate 200kbit burst 80kb latency 2s || fail "$1: tc refused (b)"
    fi
    wait $job
    rc=$?
    [ $rc -eq 0 ] || { fail "$1: exit $rc"; sed 's/^/  | /' "$HOSTS_DIR/$1.err"; }
}
speed() { grep -o 'decode: [0-9]* tokens in [0-9.]* s ([0-9.]* tok/s)' "$HOSTS_DIR/$1.out" "$HOSTS_DIR/$1.err" |
          head -1 | sed 's/.*(\([0-9.]*\) tok\/s)/\1/'; }
run plain
run slow shape
text() { grep -v '^prefill:' "$HOSTS_DIR/$1.out"; }
[ "$(text plain)" = "$(text slow)" ] && [ -n "$(text plain)" ] ||
    { fail "the shaped run's text differs:"; echo "  plain: $(text plain)"; echo "  slow:  $(text slow)"; }
p=$(speed plain) s=$(speed slow)
awk -v p="${p:-0}" -v s="${s:-0}" 'BEGIN { exit !(s > 0 && p > 0 && s < p) }' ||
    fail "decode not slower on the shaped link (plain ${p:-?} tok/s, shaped ${s:-?} tok/s)"
echo "slow link (200 kbit/s from mid-run): same text, exit 0; decode ${p:-?} -> ${s:-?} tok/s"
[ $fails -eq 0 ]
