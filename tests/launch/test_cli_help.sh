#!/usr/bin/env bash
# The command line as users of llama.cpp and vLLM expect it:
#  - every option of every subcommand's --help states its default (a flag's is "off"), and the
#    subcommands end with examples;
#  - -m/--model and -t/--threads; info, tokenize and score default to the built-in model;
#  - `lattice info` states the memory a rank needs: the KV cache per sequence is exact for the
#    built-in SmolLM2-135M (30 layers x K and V x 3 KV heads x 64 x f32 per position, split over
#    tp), and the weights estimate is within 10% of what a load reports;
#  - load progress: none with --quiet, and none on a fast load without a terminal.
set -uo pipefail
src=${LATTICE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
bin=${LATTICE_BIN:?LATTICE_BIN must name the lattice executable}
source "$src/tests/launch/check_lib.sh"

subs="generate score info tokenize doctor calibrate layout batch serve convert verify"
for s in $subs; do
    "$bin" "$s" --help >"$tmp/h" 2>&1 || { echo "FAILED: lattice $s --help exits non-zero"; fail=$((fail + 1)); continue; }
    # Option lines: "  -x, --name TYPE [default] ..." / "  --name TYPE ...". A typed option must show
    # [default] (a required one says REQUIRED); flags (also those CLI11 annotates "Excludes:"/"Needs:")
    # and --help itself are exempt.
    bad=$(awk '/^Options:/ {o = 1; next} /^[A-Z][a-z]+:/ {o = 0} o && /^  +-/' "$tmp/h" |
          grep -v -- '--help' | grep -E -- '^ +(-[a-zA-Z], ?)?--[a-z0-9-]+(,--[a-z0-9-]+)* [A-Z]' |
          grep -vE -- '^ +(-[a-zA-Z], ?)?--[a-z0-9-]+(,--[a-z0-9-]+)* (Excludes|Needs):' |
          grep -vE -e '[^ ]=[^ ]' -e 'REQUIRED' || true)
    check "lattice $s --help: every option states its default${bad:+ (not: $bad)}" [ -z "$bad" ]
done
for s in info tokenize score calibrate layout batch serve convert verify doctor; do
    check "lattice $s --help ends with examples" grep -q "^Examples:" <("$bin" "$s" --help)
done
check "flags show no value" bash -c "! '$bin' info --help | grep -qE -- '--(help|quant-head)='"
check "-m is --model" grep -qE -- "-m, ?--model" <("$bin" generate --help)
check "-t is --threads" grep -qE -- "-t, ?--threads" <("$bin" generate --help)

if [ ! -e "$src/models/SmolLM2-135M-Instruct.Q4_1.gguf" ] && [ -z "${LATTICE_DEFAULT_MODEL:-}" ]; then
    echo "the built-in model is missing (scripts/setup.sh fetches it)"; fail=$((fail + 1)); finish cli_help; exit 1
fi
cd "$src" || exit 1
"$bin" info >"$tmp/info" 2>&1
check "info defaults to the built-in model" grep -q "SmolLM2-135M-Instruct.Q4_1.gguf" "$tmp/info"
check "tokenize defaults to the built-in model" [ "$("$bin" tokenize --text "Hello world")" = "19556 905" ]
"$bin" score --prompt-ids 1,2,3 --out "$tmp/l.safetensors" -t 1 -q >/dev/null 2>&1
check "score defaults to the built-in model" test -s "$tmp/l.safetensors"

# KV: 30 layers * 2 * 2048 positions * 3 KV heads * 64 * 4 bytes = 94371840 B = 0.08789 GiB (tp 1),
# one KV head per rank at tp 3: 0.02930 GiB.
"$bin" info --context 2048 >"$tmp/m1" 2>&1
check "info: KV cache for 2048 positions, tp 1" grep -q "KV cache 0.088 GiB per sequence of 2048 positions" "$tmp/m1"
"$bin" info --context 2048 --tp 3 --pp 2 >"$tmp/m3" 2>&1
check "info: KV cache for 2048 positions, tp 3 x pp 2" \
    grep -q "KV cache 0.015 GiB per sequence of 2048 positions" "$tmp/m3"  # 15 layers on a stage, 1 KV head
"$bin" info --context 2048 --dtype bf16 >"$tmp/mb" 2>&1
check "info --dtype bf16: the KV cache bf16 under auto, half of f32's" \
    grep -q "cpu bf16, context 2048.*KV cache 0.044 GiB per sequence of 2048 positions (bf16)" "$tmp/mb"
"$bin" info --dtype f16 >"$tmp/mf" 2>&1; rc=$?
check "info --dtype f16 on the CPU: refused (exit 1), naming the flag" bash -c "[ $rc = 1 ] && grep -q -- '--dtype f16' '$tmp/mf'"
"$bin" info --tp 2 >"$tmp/m2" 2>&1; rc=$?
check "info --tp 2: refused (exit 1), naming the heads" bash -c "[ $rc = 1 ] && grep -q 'heads' '$tmp/m2'"
w_info=$(sed -n 's/.* = weights \([0-9.]*\) GiB.*/\1/p' "$tmp/m1")
"$bin" generate --prompt-ids 1 --max-new-tokens 1 -t 1 >"$tmp/g" 2>&1
w_load=$(sed -n 's/.*(\([0-9.]*\) MiB of weights on this rank.*/\1/p' "$tmp/g")
check "info's weights ($w_info GiB) within 10% of the load's ($w_load MiB)" \
    python3 -c "import sys; a = float('$w_info') * 1024; b = float('$w_load'); sys.exit(0 if abs(a - b) <= 0.1 * b else 1)"
check "no progress lines on a fast load without a terminal" bash -c "! grep -q 'loading:' '$tmp/g' || grep 'loading:' '$tmp/g' | grep -q '^\[r0'"
"$bin" generate --prompt-ids 1 --max-new-tokens 1 -t 1 --quiet >"$tmp/gq" 2>&1
check "--quiet: no INFO lines" bash -c "! grep -q '^\[r0/1' '$tmp/gq'"

finish cli_help
