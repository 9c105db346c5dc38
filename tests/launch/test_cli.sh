#!/usr/bin/env bash
# The `lattice` executable as users and scripts drive it: golden tokens through generate, logits
# through score (checked against the float64 reference), the stats JSON, multi-rank runs printing
# once and agreeing with one rank, and bad input giving one line on stderr and exit code 1.
# Usage: test_cli.sh LATTICE_BINARY SHARED_DIR
set -u
lattice=$1
shared=$2
source "$(dirname "$0")/check_lib.sh"

g=$shared/golden/tiny-gqa-llama3
prompt=$(python3 -c "import json; print(','.join(map(str, json.load(open('$g/expected.json'))['cases'][1]['prompt_ids'])))")
want=$(python3 -c "import json; print(' '.join(map(str, json.load(open('$g/expected.json'))['cases'][1]['greedy_ids'])))")

# generate: ids on one line, timings on stderr, stats JSON.
out=$("$lattice" generate --model "$g" --prompt-ids "$prompt" --max-new-tokens 24 --ignore-eos --print-ids \
      --stats-json "$tmp/stats.json" 2>"$tmp/err")
check "generate prints the golden greedy ids" test "$out" = "$want"
check "generate reports the decode count its rate divides (23 after the prefilled first token) and the 24 generated" grep -q "decode: 23 tokens in .* tok/s), 24 generated" "$tmp/err"
check "stats JSON has the documented fields" python3 -c "
import json; j = json.load(open('$tmp/stats.json'))
for k in ('prompt_tokens', 'prefill_seconds', 'generated_tokens', 'decode_seconds', 'threads', 'ranks', 'quant'):
    assert k in j, k
assert j['generated_tokens'] == 24 and j['ranks'] == 1 and j['quant'] == 'none'
b = j['breakdown']; parts = ('compute', 'communication', 'pipeline_bubble', 'sampling', 'host_overhead')
assert b['steps'] >= 24 and len(b['per_rank']) == 1, b
assert abs(sum(b['rank0'][k] for k in parts) - b['wall_seconds']) < 1e-6 + 1e-6 * b['wall_seconds'], b
assert b['rank0']['compute'] > 0 and b['rank0']['sampling'] > 0 and b['rank0']['communication'] == 0, b"

# layout: the rules of parallel/world_config, as the mpirun wrapper asks for them.
check "layout fits: 4 GPU ranks per node" test "$("$lattice" layout --tp 4 --pp 2 --gpus-per-node 8 --json)" = \
    '{"ok":true,"pp":2,"ranks":8,"ranks_per_node":8,"tp":4}'
out=$("$lattice" layout --tp 2 --model "$shared/golden/tiny-fp16-tied" --cpu --cores-per-node 4 --json); rc=$?
check "layout of a model whose heads allow tp 2" test $rc -eq 0
out=$("$lattice" layout --tp 4 --model "$shared/golden/tiny-fp16-tied" --cpu --cores-per-node 4 --json); rc=$?
check "layout refused (exit 1) for heads that do not split over tp 4" test $rc -eq 1
check "layout refusal names the field" grep -q "does not divide num_attention_heads 6" <<<"$out"

# Speculative options without --speculative are refused, not ignored.
out=$("$lattice" generate --model "$g" --prompt-ids "$prompt" --max-new-tokens 2 --num-speculative-tokens 3 2>&1 >/dev/null); rc=$?
check "--num-speculative-tokens without --speculative refused (exit 1)" test $rc -eq 1
check "... with one line naming what it needs" grep -q -- "--num-speculative-tokens needs --speculative" <<<"$out"

# generate stops at eos unless --ignore-eos: the model's eos id (2) ends the output.
out=$("$lattice" generate --model "$g" --prompt-ids "$prompt" --max-new-tokens 24 --print-ids 2>/dev/null)
check "without --ignore-eos output is a prefix of the greedy run, ending at eos or full" python3 -c "
got = '$out'.split(); want = '$want'.split()
assert got == want[:len(got)], (got, want)
assert len(got) == 24 or got[-1] == '2'"

# score: logits of every position vs the float64 reference.
"$lattice" score --model "$g" --prompt-ids "$prompt" --out "$tmp/logits.safetensors" 2>/dev/null
check "score writes logits within 1e-4 of the reference" python3 - "$tmp/logits.safetensors" "$g/expected.safetensors" <<'PY'
import json, math, struct, sys
def read(path, name):
    b = open(path, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    h = json.loads(b[8:8 + n])
    e = h[name]
    s, t = e['data_offsets']
    data = b[8 + n + s: 8 + n + t]
    return e['shape'], struct.unpack('<%df' % (len(data) // 4), data)
shape, got = read(sys.argv[1], 'logits')
rshape, ref = read(sys.argv[2], 'case1.logits')
assert shape == rshape, (shape, rshape)
num = sum((a - b) ** 2 for a, b in zip(got, ref)); den = sum(b * b for b in ref)
err = math.sqrt(num / den)
assert err < 1e-4, err
PY

# Multi-rank: same ids, printed once.
out=$("${mpirun[@]}" -np 2 "$lattice" generate --model "$g" --prompt-ids "$prompt" --max-new-tokens 24 --ignore-eos \
      --print-ids --tp 2 --threads 1 2>/dev/null)
check "mpirun -np 2 --tp 2 prints the same ids exactly once" test "$out" = "$want"
out=$("${mpirun[@]}" -np 2 "$lattice" generate --model "$g" --prompt-ids "$prompt" --max-new-tokens 24 --ignore-eos \
      --print-ids --pp 2 --threads 1 --batch 2 2>/dev/null)
check "mpirun -np 2 --pp 2 --batch 2 prints two identical greedy lines" test "$out" = "$(printf '%s\n%s' "$want" "$want")"

# Bad input: exit code 1 (not a signal), one error line on stderr (the last; INFO lines such as
# "loaded ..." may precede it) naming the culprit.
bad() {  # description, expected substring, args...
    local what=$1 needle=$2
    shift 2
    "$lattice" "$@" >"$tmp/o" 2>"$tmp/e"
    local rc=$?
    check "$what: exit code 1 (got $rc)" test $rc -eq 1
    check "$what: one error line" test "$(grep -c "error" "$tmp/e")" -eq 1
    check "$what: the error line is last and names '$needle'" bash -c "tail -n 1 '$tmp/e' | grep -q -- 'lattice: error: .*$needle'"
}
mkdir -p "$tmp/trunc"
cp "$shared/golden/tiny-llama2/config.json" "$tmp/trunc/"
head -c 100000 "$shared/golden/tiny-llama2/model.safetensors" >"$tmp/trunc/model.safetensors"
bad "missing model" "/nonexistent/model" generate --model /nonexistent/model --prompt-ids 1
bad "truncated safetensors" "model.safetensors" generate --model "$tmp/trunc" --prompt-ids 1
bad "token id >= vocab" "1024" generate --model "$g" --prompt-ids 1,1024
bad "prompt longer than max_position_embeddings" "longer than the model" \
    generate --model "$shared/golden/tiny-llama2" --prompt-ids "$(python3 -c "print(','.join(['5'] * 300))")"
bad "malformed prompt ids" "x7" generate --model "$g" --prompt-ids 1,x7
bad "layout that does not fit the world" "world size 1" generate --model "$g" --prompt-ids 1 --tp 2
bad "unknown preset" "llama-9" generate --random-weights --config llama-9 --prompt-ids 1

# A rank that stops answering (SIGSTOP): the other rank gives up after --comm-timeout, names it,
# and the whole job exits non-zero within seconds, leaving no process behind.
smol=${LATTICE_DEFAULT_MODEL:-$(cd "$(dirname "$0")/../.." && pwd)/models/SmolLM2-135M-Instruct.Q4_1.gguf}
if [ -f "$smol" ]; then
    start=$(date +%s)
    # $tmp in the command line tells this job's ranks from those of tests running beside it.
    mark="$tmp/hang-stats.json"
    "${mpirun[@]}" -np 2 "$lattice" generate --model "$smol" --prompt "Tell me a long story about the sea." \
        --max-new-tokens 2000 --ignore-eos --pp 2 --threads 1 --comm-timeout 3 --stats-json "$mark" \
        >"$tmp/hang.out" 2>"$tmp/hang" &
    job=$!
    victim=""
    for _ in $(seq 100); do  # find world rank 1 by its environment
        for p in $(pgrep -f -- "--stats-json $mark"); do
            tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && victim=$p
        done
        [ -n "$victim" ] && break
        sleep 0.1
    done
    for _ in $(seq 600); do  # both ranks loaded and decoding: tokens are streaming out (<= 60 s)
        [ -s "$tmp/hang.out" ] && break
        sleep 0.1
    done
    kill -STOP "$victim"
    stopped=$(date +%s)
    wait $job
    rc=$?
    took=$(( $(date +%s) - stopped ))
    kill -CONT "$victim" 2>/dev/null
    check "hung rank: job exits non-zero (rc $rc)" test $rc -ne 0
    check "hung rank: job ends within timeout + 10 s (took $took s)" test $took -le 13
    check "hung rank: the error names the silent rank" grep -q "timed out after 3.0 s.*no answer from rank 1" "$tmp/hang"
    for _ in $(seq 100); do  # the continued victim handles its pending termination (<= 10 s)
        [ -z "$(pgrep -f -- "--stats-json $mark" | xargs -r ps -o stat= -p | grep -v Z)" ] && break
        sleep 0.1
    done
    check "hung rank: no lattice process left" test -z "$(pgrep -f -- "--stats-json $mark" | xargs -r ps -o stat= -p | grep -v Z)"
else
    echo "FAIL: hung-rank test needs the default model ($smol): run scripts/setup.sh"
    fail=$((fail + 1))
fi

finish test_cli.sh
