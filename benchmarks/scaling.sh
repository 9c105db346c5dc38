#!/usr/bin/env bash
# Replaced by benchmarks/run.py (docs/benchmarks.md); kept as a wrapper running its old sweep. Usage: benchmarks/scaling.sh [BUILD_DIR] [OUT_DIR]
set -e; here=$(dirname "$0"); b=${1:-build}; o=${2:-bench-results}
python3 "$here/run.py" e2e --build "$b" --out "$o" --layouts 1x1,2x1,1x2 --batch 1,2 --prompts "${PROMPT:-64}" --max-new-tokens "${DECODE:-16}" --quant "${QUANT:-none}" --preset "${CONFIG:-tinyllama-1.1b}"
python3 "$here/run.py" allreduce --build "$b" --out "$o" --np 2,4
