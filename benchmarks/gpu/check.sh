#!/usr/bin/env bash
# GPU check for lattice (issue 6): on a machine with one NVIDIA GPU and CUDA, from a clean checkout,
# in under 8 minutes:
#   1. configure + build for this GPU's architecture only (nvidia-smi compute_cap), CUDA targets only;
#   2. run the CUDA tests (ctest -L cuda): every CUDA op against its CPU op, the backend against
#      CpuBackend, CUDA-graph replay (the NCCL test needs 2 GPUs and reports a skip on one);
#   3. run the GPU benchmarks: INT8 and FP16 GEMM TOPS at m = 1, 16, 256, 4096 on 8192x8192 and
#      28672x8192 (+ the m <= 8 GEMVs), ratio to the GPU's dense peak; decode tokens/s at batch
#      1, 8, 32 for the Llama-2-70B shape with random W8A8 weights at TP=1 and the ratio to the
#      HBM-bandwidth floor (bench_gpu_decode: the 80-layer step on the CudaBackend ops, one CUDA graph);
#   4. the end-to-end `lattice generate --random-weights` decode, only when the CLI can select the
#      CUDA backend (otherwise a visible note says why it was skipped).
# Tables go to stdout, JSON to $OUT (or ./gpu-results): gemm.json, decode.json, ctest.log, summary.json.
# Usage: benchmarks/gpu/check.sh [--quick]   (env: OUT, BUILD_DIR, JOBS, CUDA_HOME)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${OUT:-$PWD/gpu-results}"
build="${BUILD_DIR:-$root/build-gpu-check}"
jobs="${JOBS:-$(nproc)}"
quick=""
[[ "${1:-}" == "--quick" ]] && quick="--quick"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
t_start=$(date +%s)
say() { printf '\n==> %s  [%ss]\n' "$*" "$(( $(date +%s) - t_start ))"; }

export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
command -v nvidia-smi >/dev/null || { echo "check.sh: nvidia-smi not found: no NVIDIA driver on this machine" >&2; exit 2; }
command -v nvcc >/dev/null || { echo "check.sh: nvcc not found (set CUDA_HOME)" >&2; exit 2; }
gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')"
[[ "$cap" =~ ^[0-9]+$ ]] || { echo "check.sh: could not read compute capability (got '$cap')" >&2; exit 2; }
echo "GPU: $gpu_name (sm_$cap), nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), jobs $jobs"

say "configure ($build, CMAKE_CUDA_ARCHITECTURES=$cap)"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DLATTICE_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="$cap" >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }

say "build CUDA targets"
targets=(lattice_kernels_cuda test_cuda_ops test_cuda_gemm test_cuda_backend test_cuda_golden test_nccl_comm bench_gpu_gemm bench_gpu_decode)
cmake --build "$build" -j "$jobs" --target "${targets[@]}" >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
have_cli=0
if cmake --build "$build" -j "$jobs" --target lattice >>"$out/build.log" 2>&1; then have_cli=1; else
    echo "NOTE: the lattice executable did not build (see $out/build.log); end-to-end decode will be skipped"; fi

say "ctest -L cuda"
tests_ok=1
(cd "$build" && ctest -L cuda --output-on-failure -j 1) 2>&1 | tee "$out/ctest.log" || tests_ok=0
grep -q "SKIPPED: no CUDA device" "$out/ctest.log" && grep -c "SKIPPED" "$out/ctest.log" | xargs echo "skip messages:"

say "GEMM benchmark"
"$build/benchmarks/gpu/bench_gpu_gemm" --out "$out" $quick

say "decode benchmark (llama-2-70b shape, w8a8, TP=1, CudaBackend ops, CUDA graph)"
"$build/benchmarks/gpu/bench_gpu_decode" --out "$out" $quick

say "end-to-end decode (lattice generate --random-weights --config llama-2-7b --device cuda)"
e2e="skipped"
lattice="$build/launch/lattice"
[[ -x "$lattice" ]] || lattice="$(find "$build" -maxdepth 3 -type f -name lattice -perm -u+x | head -1)"
if [[ $have_cli -eq 0 || -z "$lattice" ]]; then
    echo "NOTE: end-to-end decode skipped: no lattice executable"
else
    help="$("$lattice" generate --help 2>&1 || true)"
    if ! grep -q -- "--random-weights" <<<"$help"; then
        echo "NOTE: end-to-end decode skipped: 'lattice generate --help' does not list --random-weights yet"
    elif ! grep -q -- "--device" <<<"$help"; then
        echo "NOTE: end-to-end decode skipped: 'lattice generate' cannot select the CUDA backend (no --device);"
        echo "      bench_gpu_decode above measures the same 80-layer W8A8 step on the CudaBackend"
    else
        batch_flag=""
        grep -q -- "--batch" <<<"$help" && batch_flag="--batch"
        e2e="ran"
        for b in 1 8 32; do
            if [[ -z "$batch_flag" && $b -gt 1 ]]; then echo "NOTE: no --batch option: batch $b skipped"; continue; fi
            # llama-2-7b: the host fabricates random weights, so the 70B shape would not fit the time
            # budget here; bench_gpu_decode above covers the 70B step.
            args=(generate --random-weights --config llama-2-7b --quant w8a8 --device cuda --tp 1
                  --prompt-ids "1,2,3,4,5,6,7,8" --max-new-tokens 64 --ignore-eos --stats-json "$out/e2e_b$b.json")
            [[ -n "$batch_flag" ]] && args+=("$batch_flag" "$b")
            echo "+ lattice ${args[*]}"
            timeout 300 "$lattice" "${args[@]}" >"$out/e2e_b$b.log" 2>&1 || { echo "e2e batch $b failed:"; tail -5 "$out/e2e_b$b.log"; e2e="failed"; }
            [[ -f "$out/e2e_b$b.json" ]] && cat "$out/e2e_b$b.json"
        done
    fi
fi

elapsed=$(( $(date +%s) - t_start ))
python3 - "$out" "$gpu_name" "$cap" "$tests_ok" "$e2e" "$elapsed" <<'EOF' || true
import json, os, sys
out, gpu, cap, tests_ok, e2e, elapsed = sys.argv[1:]
doc = {"gpu": gpu, "sm": int(cap), "ctest_cuda_passed": tests_ok == "1", "e2e": e2e, "elapsed_s": int(elapsed)}
for name in ("gemm", "decode"):
    p = os.path.join(out, name + ".json")
    if os.path.exists(p):
        doc[name] = json.load(open(p))
json.dump(doc, open(os.path.join(out, "summary.json"), "w"), indent=2)
if "decode" in doc:
    print("\ndecode (llama-2-70b, w8a8, TP=1):")
    for r in doc["decode"]["rows"]:
        print(f"  batch {r['batch']:>2}: {r['tokens_per_s']:9.1f} tokens/s, {r['pct_of_floor']:5.1f}% of the HBM floor"
              f" (goal >= 85%)")
EOF
say "done in ${elapsed}s (limit 480 s); results in $out"
[[ $tests_ok -eq 1 ]] || { echo "CUDA tests FAILED"; exit 1; }
