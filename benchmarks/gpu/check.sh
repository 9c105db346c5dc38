#!/usr/bin/env bash
# GPU check for lattice (issue 13): on a bare machine with one NVIDIA GPU (nvcc, CMake, ninja, a host
# compiler, Python; nothing else of ours), from the working tree plus gpu-kit/ (made by
# benchmarks/gpu/prepare.sh), in under 8 minutes. Each step runs on its own under a deadline: a
# failure is recorded and the next step still runs. Results are written as they come.
#
# Steps (status PASS, FAIL, SKIP or TIMEOUT; GPU steps report SKIP with the reason where no GPU is):
#   env        GPU (nvidia-smi: name, compute capability), nvcc, CMake, compiler, the NCCL wheel
#   configure  Release, CUDA for this GPU's architecture only, headers from gpu-kit/include (fmt
#              header-only), golden data from gpu-kit/shared when ../shared is absent, NCCL from
#              PyTorch's nvidia-nccl wheel when present (header from gpu-kit/nccl), MPI if found
#   build      only the CUDA tests (ctest -L cuda), bench_gpu_gemm, bench_gpu_decode and `lattice`
#   ctest      ctest -L cuda: every CUDA op against its CPU op, CudaBackend vs CpuBackend, golden models
#   gemm       bench_gpu_gemm: INT8 (and FP16) GEMM TOPS at m = 1/16/256/4096 vs the dense peak
#   decode     bench_gpu_decode: Llama-2-70B shape W8A8 decode at batch 1/8/32 vs the HBM floor, the
#              floor from a device-to-device copy measured in the same run; DECODE_LAYERS (default
#              8) of the 80 layers: the host fabricates the random weights on one thread (~5 s per
#              70B layer), and the floor ratio is per byte streamed (7 GB per step at 8 layers)
#   e2e        lattice generate --random-weights --config tinyllama-1.1b --quant w8a8 --device cuda,
#              batch 1 and 8 (the product path end to end)
# $OUT (default ./gpu-results) gets at most 6 files: summary.txt (the table below), summary.json
# (every step, the test counts and every benchmark's JSON), build.log (configure + build),
# ctest.log, bench.log (benchmarks and the end-to-end run), decode.json (written after each batch
# size by the benchmark itself). The summary table is the last thing printed.
# Exit status: 0 when no step FAILed or ran out of time (SKIPs allowed), 1 otherwise.
# Env: OUT, BUILD_DIR (build-gpu-check), JOBS (nproc), CUDA_HOME (/usr/local/cuda), LATTICE_KIT
#      (gpu-kit), LATTICE_NCCL_ROOT, CHECK_NCCL (auto|off), CHECK_CUDA_ARCH (when no GPU: 90),
#      CHECK_BUDGET_S (450: total), CHECK_TIME_SCALE (1: multiplies every deadline; the simulation
#      on 2 cores uses more), DECODE_LAYERS (8)
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${OUT:-$root/gpu-results}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
build="${BUILD_DIR:-$root/build-gpu-check}"
work="$build/check-work"
mkdir -p "$work"
kit="${LATTICE_KIT:-$root/gpu-kit}"
jobs="${JOBS:-$(nproc)}"
scale="${CHECK_TIME_SCALE:-1}"
budget=$(( ${CHECK_BUDGET_S:-450} * scale ))
layers="${DECODE_LAYERS:-8}"
e2e_preset=tinyllama-1.1b
t_start=$(date +%s)
export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
rm -f "$out"/{summary.txt,summary.json,build.log,ctest.log,bench.log,decode.json} "$work"/*.json "$work/steps.tsv"
: >"$out/build.log"; : >"$out/ctest.log"; : >"$out/bench.log"

elapsed() { echo $(( $(date +%s) - t_start )); }
say() { printf '\n==> %s  [%ss]\n' "$*" "$(elapsed)"; }

# ---- step bookkeeping: steps.tsv (name, status, seconds, deadline, needs_gpu, note) -> summary ----
step_name=""; step_t0=0; step_deadline=0; step_gpu=0
# step_begin NAME DEADLINE_S NEEDS_GPU: sets $allowed (the deadline cut to what the budget has left);
# returns 1 (and records SKIP) when under 10 s would be left.
step_begin() {
    step_name=$1; step_gpu=$3; step_t0=$(date +%s)
    local left=$(( budget - $(elapsed) - 5 ))
    allowed=$(( $2 * scale < left ? $2 * scale : left ))
    step_deadline=$allowed
    if (( allowed < 10 )); then
        step_end SKIP "out of time: ${left}s of the ${budget}s budget left"
        return 1
    fi
    say "$step_name (deadline ${allowed}s)"
    return 0
}
step_end() {  # step_end STATUS NOTE
    local secs=$(( $(date +%s) - step_t0 ))
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$step_name" "$1" "$secs" "$step_deadline" "$step_gpu" "${2//$'\t'/ }" >>"$work/steps.tsv"
    printf -- '--- %s: %s (%ss) %s\n' "$step_name" "$1" "$secs" "$2"
    write_summary >/dev/null
}
# run_logged LOG SECONDS CMD...: runs CMD under a deadline (the whole process group), appending its
# output to LOG and showing it; returns CMD's status (124: deadline).
run_logged() {
    local log=$1 secs=$2; shift 2
    echo "+ $*" >>"$log"
    timeout -k 10 "$secs" "$@" >>"$log" 2>&1
}
status_of() {  # status_of RC -> PASS / SKIP (77) / TIMEOUT (124, 137) / FAIL
    case "$1" in 0) echo PASS ;; 77) echo SKIP ;; 124 | 137) echo TIMEOUT ;; *) echo FAIL ;; esac
}

write_summary() {
    python3 - "$work" "$out" "$budget" "$(elapsed)" "$gpu_name" "$gpu_cap" "$env_line" <<'EOF' 2>/dev/null || write_summary_txt_only
import json, os, sys
work, out, budget, elapsed, gpu, cap, env_line = sys.argv[1:]
steps = []
for line in open(os.path.join(work, "steps.tsv")):
    name, status, secs, deadline, needs_gpu, note = line.rstrip("\n").split("\t")
    steps.append({"name": name, "status": status, "seconds": int(secs), "deadline_s": int(deadline),
                  "needs_gpu": needs_gpu == "1", "note": note})
def load(path):
    try:
        return json.load(open(path))
    except Exception:
        return None
doc = {"check": "lattice benchmarks/gpu/check.sh", "gpu": {"name": gpu, "sm": int(cap)} if gpu else None,
       "environment": env_line, "elapsed_s": int(elapsed), "budget_s": int(budget), "steps": steps,
       "ctest": load(os.path.join(work, "ctest.json")), "gemm": load(os.path.join(work, "gemm.json")),
       "decode": load(os.path.join(out, "decode.json")), "e2e": load(os.path.join(work, "e2e.json"))}
json.dump(doc, open(os.path.join(out, "summary.json"), "w"), indent=2)
lines = [f"lattice GPU check: {gpu + ' (sm_' + cap + ')' if gpu else 'NO GPU on this machine (GPU steps SKIP)'}",
         f"  {env_line}", f"  {elapsed} s of the {budget} s budget",
         f"{'step':<10} {'status':<8} {'seconds':>7}  note"]
for s in steps:
    lines.append(f"{s['name']:<10} {s['status']:<8} {s['seconds']:>7}  {s['note']}")
bad = [s["name"] for s in steps if s["status"] in ("FAIL", "TIMEOUT")]
lines.append("result: " + ("FAILED: " + ", ".join(bad) if bad else "no step failed") +
             (f"; skipped: {', '.join(s['name'] for s in steps if s['status'] == 'SKIP')}"
              if any(s["status"] == "SKIP" for s in steps) else ""))
open(os.path.join(out, "summary.txt"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
}
write_summary_txt_only() {  # no python3: the table from the TSV alone
    { echo "lattice GPU check: ${gpu_name:-no GPU}"; echo "  $env_line"
      printf '%-10s %-8s %7s  %s\n' step status seconds note
      awk -F'\t' '{printf "%-10s %-8s %7s  %s\n", $1, $2, $3, $6}' "$work/steps.tsv"; } | tee "$out/summary.txt"
}

# ---- env ----
gpu_name=""; gpu_cap=0; env_line=""; have_gpu=0
step_begin env 30 0
if command -v nvidia-smi >/dev/null 2>&1 && q="$(timeout 20 nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>/dev/null | head -1)" && [[ -n "$q" ]]; then
    gpu_name="$(cut -d, -f1 <<<"$q" | xargs)"
    gpu_cap="$(cut -d, -f2 <<<"$q" | tr -d ' .')"
    driver="$(cut -d, -f3 <<<"$q" | xargs)"
    [[ "$gpu_cap" =~ ^[0-9]+$ ]] && have_gpu=1 || gpu_cap=0
fi
arch="${CHECK_CUDA_ARCH:-90}"
(( have_gpu )) && arch="$gpu_cap"
nvcc_v="$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
cmake_v="$(cmake --version 2>/dev/null | head -1 | awk '{print $3}')"
cxx_v="$(c++ --version 2>/dev/null | head -1)"
nccl_root="${LATTICE_NCCL_ROOT:-}"
if [[ -z "$nccl_root" && "${CHECK_NCCL:-auto}" != off ]]; then
    nccl_root="$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)"
fi
[[ -n "$nccl_root" && -e "$nccl_root/lib/libnccl.so.2" ]] || nccl_root=""
shared="$root/../shared"
[[ -d "$shared/golden" ]] || shared="$kit/shared"
env_line="$(nproc) cores, nvcc ${nvcc_v:-none}, cmake ${cmake_v:-none}, ${cxx_v:-no c++}, python3 $(python3 -c 'import platform; print(platform.python_version())' 2>/dev/null || echo none)"
{ echo "GPU: ${gpu_name:-none} ${driver:+driver $driver} sm_$arch"; echo "$env_line"; echo "kit: $kit"; echo "golden: $shared/golden"
  echo "NCCL wheel: ${nccl_root:-none}"; } | tee -a "$out/build.log"
if [[ -z "$nvcc_v" || -z "$cmake_v" ]]; then
    step_end FAIL "no nvcc or cmake on PATH (CUDA_HOME?)"
else
    step_end PASS "${gpu_name:-no GPU (nvidia-smi absent or silent)}, build for sm_$arch, ${jobs} jobs"
fi

# ---- configure ----
configured=0
if step_begin configure 60 0; then
    args=(-S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLATTICE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch"
          -DLATTICE_SHARED_DIR="$shared")
    command -v ninja >/dev/null && args+=(-G Ninja)
    [[ -d "$kit/include" ]] && args+=(-DLATTICE_THIRD_PARTY="$kit")
    [[ -d "$kit/nccl/include" ]] && args+=(-DLATTICE_NCCL_INCLUDE_DIR="$kit/nccl/include")
    [[ -n "$nccl_root" ]] && args+=(-DLATTICE_NCCL_ROOT="$nccl_root")
    [[ "${CHECK_NCCL:-auto}" == off ]] && args+=(-DLATTICE_NCCL=OFF)
    command -v nvcc >/dev/null && args+=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
    run_logged "$out/build.log" "$allowed" cmake "${args[@]}"
    rc=$?
    # "MPI OFF; CUDA backend ON; NCCL ON; fmt header-only; 19 multi-rank tests not built"
    facts="$(sed -n 's/^-- lattice: //p' "$out/build.log" | sed -nE 's/^(MPI|CUDA backend|NCCL) (ON|OFF).*/\1 \2/p; s/^(fmt header-only).*/\1/p; s/^built without MPI: ([0-9]+ multi-rank tests not built).*/\1/p' | paste -sd ';' - | sed 's/;/; /g')"
    if [[ $rc -eq 0 ]]; then
        configured=1
        step_end PASS "$facts"
    else
        tail -30 "$out/build.log"
        step_end "$(status_of $rc)" "cmake exited $rc (build.log)"
    fi
fi

# ---- build: the CUDA tests, the GPU benchmarks, the CLI ----
if step_begin build 270 0; then
  if [[ $configured -eq 0 ]]; then
    step_end SKIP "configure did not pass"
  else
    mapfile -t cuda_tests < <(cd "$build" && ctest -N -L cuda 2>/dev/null | sed -n 's/^ *Test *#[0-9]*: *\([^ ]*\).*/\1/p')
    targets=("${cuda_tests[@]}" bench_gpu_gemm bench_gpu_decode lattice)
    keep_going=()
    [[ -f "$build/build.ninja" ]] && keep_going=(-- -k 0)
    echo "targets: ${targets[*]}" | tee -a "$out/build.log"
    # CPU seconds of the whole build (every compiler is a waited-for descendant): with the wall time
    # it tells how the build scales on another machine's cores.
    TIMEFORMAT='%U %S'
    { time run_logged "$out/build.log" "$allowed" cmake --build "$build" -j "$jobs" --target "${targets[@]}" "${keep_going[@]}"; } 2>"$work/build.time"
    rc=$?
    cpu_s="$(awk '{printf "%.0f", $1 + $2}' "$work/build.time" 2>/dev/null)"
    missing=()
    for t in "${targets[@]}"; do [[ -n "$(find "$build" -name "$t" -type f -perm -u+x -print -quit)" ]] || missing+=("$t"); done
    if [[ $rc -eq 0 ]]; then
        step_end PASS "${#targets[@]} targets for sm_$arch with $jobs jobs (${#cuda_tests[@]} CUDA tests), ${cpu_s:-?} CPU-s"
    else
        grep -E 'error|FAILED' "$out/build.log" | head -20
        step_end "$(status_of $rc)" "exit $rc; not built: ${missing[*]:-none} (build.log)"
    fi
  fi
fi
exe() { find "$build" -name "$1" -type f -perm -u+x -print -quit 2>/dev/null; }

# ---- ctest -L cuda ----
if step_begin ctest 100 1; then
  if [[ $configured -eq 0 ]]; then
    step_end SKIP "configure did not pass"
  else
    (cd "$build" && timeout -k 10 "$allowed" ctest -L cuda -V --timeout 120 >"$out/ctest.log" 2>&1)
    rc=$?
    python3 - "$out/ctest.log" "$work/ctest.json" <<'EOF'
import json, re, sys
text = open(sys.argv[1], errors="replace").read()
res = {}
for m in re.finditer(r"Test +#\d+: +(\S+) +\.+\s*(\*\*\*)?(Passed|Skipped|Failed|Not Run|Timeout|Exception|\w+)", text):
    res[m.group(1)] = m.group(3)
skips = sorted(set(re.findall(r"SKIP: ([^\n]+)", text)))
doc = {"passed": sum(v == "Passed" for v in res.values()), "skipped": sum(v == "Skipped" for v in res.values()),
       "failed": sum(v not in ("Passed", "Skipped") for v in res.values()), "tests": res, "skip_reasons": skips}
json.dump(doc, open(sys.argv[2], "w"), indent=2)
EOF
    read -r passed skipped failed reason < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["passed"], d["skipped"], d["failed"], (d["skip_reasons"] or ["-"])[0])' "$work/ctest.json" 2>/dev/null || echo "0 0 0 -")
    grep -E '^ *[0-9]+/[0-9]+ Test|tests passed|did not run|Skipped' "$out/ctest.log" | sed 's/^/  /'
    note="$passed passed, $failed failed, $skipped skipped"
    (( skipped > 0 )) && note+=" ($reason)"
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then step_end TIMEOUT "$note"
    elif (( failed > 0 || (rc != 0 && skipped == 0) )); then step_end FAIL "$note (ctest.log)"
    elif (( passed == 0 && skipped > 0 && have_gpu )); then step_end FAIL "$note, yet nvidia-smi shows $gpu_name"
    elif (( passed == 0 && skipped > 0 )); then step_end SKIP "$note"
    elif (( have_gpu == 0 && passed > 0 )); then step_end FAIL "$note: CUDA tests passed without a GPU"
    else step_end PASS "$note"; fi
  fi
fi

# ---- benchmarks ----
bench_note() {  # one line from a benchmark's JSON
    python3 - "$@" <<'EOF' 2>/dev/null
import json, sys
kind, path = sys.argv[1], sys.argv[2]
d = json.load(open(path))
if kind == "gemm":
    r = [x for x in d["rows"] if x["kernel"].startswith("int8") and x["n"] == 28672]
    print("int8 TOPS m=" + "/".join(str(x["m"]) for x in r) + ": " + "/".join(f"{x['tops']:.0f}" for x in r) +
          f" of {d['peaks']['int8_tops']:.0f} peak (n=28672 k=8192)")
elif kind == "decode":
    print(f"{d['layers']} layers: " + ", ".join(f"b{x['batch']} {x['pct_of_floor']:.0f}%" for x in d["rows"]) +
          f" of the copy floor ({d.get('hbm_copy_gbs', 0):.0f} GB/s); b1 {d['rows'][0]['tokens_per_s']:.1f} tok/s")
elif kind == "e2e":
    print(f"{d['decode_tokens_per_s']:.0f} tok/s (load {d['load_seconds']:.0f} s)")
EOF
}
for b in gemm decode; do
    case $b in gemm) deadline=45 ;; decode) deadline=120 ;; esac
    step_begin "$b" "$deadline" 1 || continue
    bin="$(exe bench_gpu_$b)"
    if [[ -z "$bin" ]]; then step_end FAIL "bench_gpu_$b was not built"; continue; fi
    bargs=(--out "$work")
    [[ $b == decode ]] && bargs=(--out "$out" --layers "$layers")
    echo "=== bench_gpu_$b" >>"$out/bench.log"
    run_logged "$out/bench.log" "$allowed" "$bin" "${bargs[@]}"
    rc=$?
    json="$work/gemm.json"; [[ $b == decode ]] && json="$out/decode.json"
    note="$( [[ -f "$json" ]] && bench_note "$b" "$json")"
    if [[ $rc -eq 77 ]]; then
        note="$(grep SKIP "$out/bench.log" | tail -1 | sed 's/.*SKIP[A-Z]*: *//')"
        # A skip where nvidia-smi shows a GPU is a failure of the check, not a missing GPU.
        (( have_gpu )) && { rc=1; note="skipped (${note}), yet nvidia-smi shows $gpu_name"; }
    elif [[ $rc -ne 0 ]]; then
        note="exit $rc: $(tail -1 "$out/bench.log" | cut -c1-100) ${note}"
    fi
    sed -n "/=== bench_gpu_$b/,\$p" "$out/bench.log" | tail -20
    step_end "$(status_of $rc)" "$note"
done

# ---- end to end: lattice generate on the CUDA backend ----
if step_begin e2e 60 1; then
    lattice="$(exe lattice)"
    if [[ -z "$lattice" ]]; then
        step_end FAIL "the lattice executable was not built"
    else
        notes=(); worst=PASS
        batches=(1 8)
        # The request engine may rename --batch; then batch 1 alone, said in the note.
        if ! "$lattice" generate --help 2>/dev/null | grep -q -- '--batch'; then batches=(1); notes+=("(no --batch option)"); fi
        for batch in "${batches[@]}"; do
            per=$(( allowed - ($(date +%s) - step_t0) ))
            (( batch == 1 )) && per=$(( per / 2 ))
            (( per >= 5 )) || { notes+=("b$batch: out of time"); worst=TIMEOUT; break; }
            echo "=== e2e batch $batch" >>"$out/bench.log"
            run_logged "$out/bench.log" "$per" "$lattice" generate --random-weights --config "$e2e_preset" --quant w8a8 \
                --device cuda --prompt-ids 1,2,3,4,5,6,7,8 --max-new-tokens 64 --ignore-eos \
                $( (( ${#batches[@]} > 1 )) && echo --batch "$batch") --stats-json "$work/e2e_b$batch.json"
            rc=$?
            if [[ $rc -eq 0 && -f "$work/e2e_b$batch.json" ]]; then
                notes+=("b$batch $(bench_note e2e "$work/e2e_b$batch.json")")
            elif (( have_gpu == 0 )); then
                notes=("no GPU: lattice said: $(grep -m1 'error' "$out/bench.log" | sed 's/^lattice: error: //' | cut -c1-90)")
                worst=SKIP; [[ $rc -eq 0 ]] && worst=FAIL
                break
            else
                notes+=("b$batch exit $rc: $(tail -1 "$out/bench.log" | cut -c1-80)")
                worst="$(status_of $rc)"
            fi
        done
        python3 - "$work" <<'EOF' 2>/dev/null
import glob, json, os, sys
runs = {os.path.basename(p)[5:-5]: json.load(open(p)) for p in sorted(glob.glob(os.path.join(sys.argv[1], "e2e_b*.json")))}
json.dump({"preset": "tinyllama-1.1b", "quant": "w8a8", "device": "cuda", "runs": runs}, open(os.path.join(sys.argv[1], "e2e.json"), "w"), indent=2)
EOF
        tail -6 "$out/bench.log"
        step_end "$worst" "$e2e_preset w8a8: ${notes[*]}"
    fi
fi

# ---- the table, last ----
echo
write_summary || true
grep -qE $'\t(FAIL|TIMEOUT)\t' "$work/steps.tsv" && exit 1
exit 0
