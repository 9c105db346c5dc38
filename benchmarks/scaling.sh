#!/usr/bin/env bash
# Multi-rank scaling on CPU ranks: decode and prefill tokens/s of a random-weight model at
# (tp, pp) = (1,1), (2,1), (1,2) with one thread per rank (and pp=2 with 2 sequences in flight),
# then the MPI all-reduce sweep (4 KB .. 64 MB). Parallel efficiency = speedup over (1,1) / ranks.
# Usage: benchmarks/scaling.sh [BUILD_DIR] [OUT_DIR]   (defaults: build, bench-results)
# Env: CONFIG (default tinyllama-1.1b), PROMPT (64), DECODE (16), QUANT (none).
set -euo pipefail
build=${1:-build}
out=${2:-bench-results}
mkdir -p "$out"
config=${CONFIG:-tinyllama-1.1b}
prompt_len=${PROMPT:-64}
decode=${DECODE:-16}
quant=${QUANT:-none}
ids=$(python3 -c "print(','.join(str((i*7919+13)%32000) for i in range($prompt_len)))")
mpirun=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" -eq 0 ] && mpirun+=(--allow-run-as-root)

run() {  # tp pp batch
    local tp=$1 pp=$2 batch=$3 np=$(( $1 * $2 ))
    local json="$out/scaling_tp${tp}_pp${pp}_b${batch}.json"
    "${mpirun[@]}" -np "$np" "$build/launch/lattice" generate --random-weights --config "$config" \
        --prompt-ids "$ids" --max-new-tokens "$decode" --ignore-eos --threads 1 --tp "$tp" --pp "$pp" \
        --batch "$batch" --quant "$quant" --max-seq $(( prompt_len + decode + 8 )) --stats-json "$json" >/dev/null
    echo "$json"
}

files=()
for layout in "1 1 1" "2 1 1" "1 2 1" "1 2 2"; do
    files+=("$(run $layout)")
done
python3 - "$out/scaling.json" "${files[@]}" <<'PY'
import json, sys
out, files = sys.argv[1], sys.argv[2:]
rows = [json.load(open(f)) for f in files]
base = rows[0]
print("| tp | pp | seqs | ranks | prefill tok/s | decode tok/s | decode speedup | efficiency | idle rank0 |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    sp = r["decode_tokens_per_s"] / base["decode_tokens_per_s"]
    r["decode_speedup"] = sp
    r["parallel_efficiency"] = sp / r["ranks"]
    print(f'| {r["tp"]} | {r["pp"]} | {r["sequences"]} | {r["ranks"]} | {r["prefill_tokens_per_s"]:.1f} | '
          f'{r["decode_tokens_per_s"]:.2f} | {sp:.2f} | {r["parallel_efficiency"]:.2f} | {r["bubble_rank0"]:.2f} |')
json.dump(rows, open(out, "w"), indent=2)
PY
for np in 2 4; do
    "${mpirun[@]}" -np $np "$build/benchmarks/bench_allreduce" --json "$out/allreduce_np$np.json" | tail -20
done
