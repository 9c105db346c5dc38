#!/usr/bin/env bash
# lattice generate on CPU ranks through launch/lattice-mpirun: for every layout (TP x PP) the
# greedy tokens of tiny-llama2 equal the golden float64 continuation (expected.json) for two
# prompts; the wrapper adds --tp/--pp itself.
set -uo pipefail
src=${LATTICE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
shared=${LATTICE_SHARED_DIR:-$src/../shared}
bin=${LATTICE_BIN:?set LATTICE_BIN to the lattice executable}
W="$src/launch/lattice-mpirun"
model="$shared/golden/tiny-llama2"
n=24
fails=0
for layout in "2 1" "1 2" "2 2"; do
    read -r tp pp <<< "$layout"
    for case in 0 1; do
        prompt=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['cases'][$case]['prompt_ids'])))" "$model/expected.json")
        want=$(python3 -c "import json,sys; print(' '.join(map(str, json.load(open(sys.argv[1]))['cases'][$case]['greedy_ids'][:$n])))" "$model/expected.json")
        out=$(timeout 60 "$W" --tp "$tp" --pp "$pp" --cpu --oversubscribe -- "$bin" generate --model "$model" \
              --prompt-ids "$prompt" --max-new-tokens $n --temperature 0 --ignore-eos --print-ids --comm-timeout 20 2>/tmp/launch-gen-err.$$)
        rc=$?
        if [ $rc -ne 0 ] || ! grep -qxF -- "$want" <<< "$out"; then
            echo "FAIL: tp $tp pp $pp case $case: rc $rc"; echo "  want: $want"; echo "  got:  $out"; tail -n 5 /tmp/launch-gen-err.$$
            fails=$((fails + 1))
        else
            echo "tp $tp pp $pp case $case: $n golden tokens"
        fi
    done
done
rm -f /tmp/launch-gen-err.$$
[ $fails -eq 0 ]
