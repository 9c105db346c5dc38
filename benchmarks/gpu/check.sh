#!/usr/bin/env bash
# GPU check for lattice (issues 13 and 34): on a bare machine with one NVIDIA GPU (nvcc, CMake, ninja, a
# host compiler, Python; nothing else of ours), from the working tree plus gpu-kit/ (made by
# benchmarks/gpu/prepare.sh, binaries optionally added by benchmarks/gpu/simulate.sh --bundle), within
# CHECK_BUDGET_S = 450 s. Each step runs on its own under a deadline: a failure is recorded, the next
# step still runs, and every result file is written as it is produced (a cut-off run keeps them).
#
# Steps and deadlines (seconds, each cut to what the budget has left; they sum to 450):
#   env        15  GPU (nvidia-smi -q: clocks, power cap, MIG, ECC; SM count and L2 via PyTorch), nvcc,
#                  CMake, compiler, the NCCL wheel (library version, and whether it ships include/)
#   bundle     10  gpu-kit/bin: executables built for sm_90 here (executables.tar.xz); unpacked and used
#                  when their sources match this tree and their libraries load (bundle.py verify), else
#                  the next two steps build them
#   configure  30  Release, this GPU's architecture, headers from gpu-kit/include (fmt header-only),
#                  NCCL header and library from the same wheel (gpu-kit's header only when the wheel
#                  has none), golden data from gpu-kit/shared
#   build     140  the CUDA tests, the GPU benchmarks and `lattice` (ninja -k 0)
#   tests      90  run_cuda_tests.py: each CUDA test binary under a 35 s timeout, 4 at a time; every
#                  FAIL / TIMEOUT binary rerun case by case with CUDA_LAUNCH_BLOCKING=1 CUBLASLT_LOG_LEVEL=2
#   sanitize   40  compute-sanitizer (where installed) on test_cuda_sanitize: memcheck on every case,
#                  racecheck and synccheck on its decode-attention cases
#   gemm       30  bench_gpu_gemm: INT8/FP16 GEMM TOPS (4096^3 first) vs the dense peak; gemm.json per row
#   attention  15  bench_gpu_attention: decode attention at 4k and 32k context vs the copy bandwidth
#   decode     50  bench_gpu_decode: TinyLlama shape, HBM-floor ratio by the slope between two layer
#                  counts and by events around the graph alone, per-kernel breakdown of one step; then
#                  a 70B-shaped stack (DECODE_LAYERS layers)
#   e2e        30  lattice generate --random-weights --config tinyllama-1.1b --quant w8a8 --device cuda
# With the bundle, configure and build do not run and the check ends ~170 s earlier.
#
# $OUT (default ./gpu-results) gets at most 8 files: summary.txt (the table), summary.json (every step,
# the environment, the test results and the benchmarks' JSON), gpu.txt (nvidia-smi -q, device
# properties), build.log, tests.log (every test's output, the case reruns, the sanitizer runs),
# bench.log, gemm.json and decode.json (both written by the benchmarks after every row).
# Exit status: 0 when no step FAILed or ran out of time (SKIPs allowed), 1 otherwise.
# Env: OUT, BUILD_DIR (build-gpu-check), JOBS (nproc), CUDA_HOME (/usr/local/cuda), LATTICE_KIT (gpu-kit),
#      LATTICE_NCCL_ROOT, CHECK_NCCL (auto|off), CHECK_CUDA_ARCH (when no GPU: 90), CHECK_BUDGET_S (450),
#      CHECK_TIME_SCALE (1: multiplies every deadline; the 2-core simulation uses more), CHECK_BUNDLE
#      (auto|off), CHECK_TEST_TIMEOUT (35), CHECK_TEST_JOBS (4), DECODE_LAYERS (8),
#      LATTICE_TEST_INJECT (fail:<test binary>,hang:<test binary>: the simulation's injected faults)
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
test_timeout=$(( ${CHECK_TEST_TIMEOUT:-35} * scale ))
e2e_preset=tinyllama-1.1b
t_start=$(date +%s)
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
export PATH="$cuda_home/bin:$PATH"
rm -f "$out"/{summary.txt,summary.json,gpu.txt,build.log,tests.log,bench.log,gemm.json,decode.json} "$work"/*.json \
    "$work/steps.tsv"
: >"$out/build.log"; : >"$out/tests.log"; : >"$out/bench.log"; : >"$work/steps.tsv"

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
# output to LOG; returns CMD's status (124: deadline).
run_logged() {
    local log=$1 secs=$2; shift 2
    echo "+ $*" >>"$log"
    timeout -k 5 "$secs" "$@" >>"$log" 2>&1
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
doc = {"check": "lattice benchmarks/gpu/check.sh v2", "gpu": {"name": gpu, "sm": int(cap)} if gpu else None,
       "environment": env_line, "device": load(os.path.join(work, "device.json")),
       "nccl": load(os.path.join(work, "nccl.json")), "elapsed_s": int(elapsed), "budget_s": int(budget),
       "steps": steps, "tests": load(os.path.join(work, "tests.json")),
       "sanitize": load(os.path.join(work, "sanitize.json")), "gemm": load(os.path.join(out, "gemm.json")),
       "attention": load(os.path.join(work, "attention.json")), "decode": load(os.path.join(out, "decode.json")),
       "e2e": load(os.path.join(work, "e2e.json"))}
tmp = os.path.join(out, "summary.json.tmp")
json.dump(doc, open(tmp, "w"), indent=2)
os.replace(tmp, os.path.join(out, "summary.json"))
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
gpu_name=""; gpu_cap=0; env_line=""; have_gpu=0; driver=""
step_begin env 15 0
q_fields=name,compute_cap,driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.draw,power.limit,power.max_limit,mig.mode.current,ecc.mode.current,memory.total,pstate,temperature.gpu
if command -v nvidia-smi >/dev/null 2>&1 &&
    q="$(timeout 10 nvidia-smi --query-gpu=$q_fields --format=csv,noheader 2>/dev/null | head -1)" && [[ -n "$q" ]]; then
    gpu_name="$(cut -d, -f1 <<<"$q" | xargs)"
    gpu_cap="$(cut -d, -f2 <<<"$q" | tr -d ' .')"
    driver="$(cut -d, -f3 <<<"$q" | xargs)"
    [[ "$gpu_cap" =~ ^[0-9]+$ ]] && have_gpu=1 || gpu_cap=0
    { echo "# nvidia-smi --query-gpu=$q_fields"; echo "$q"; echo; echo "# nvidia-smi -q"
      timeout 10 nvidia-smi -q 2>&1; } >"$out/gpu.txt"
fi
# SM count, L2, shared memory per SM through PyTorch (present on the GPU machine; optional).
if (( have_gpu )); then
    timeout 20 python3 - "$work/device.json" "$q_fields" "$q" <<'EOF' >>"$out/gpu.txt" 2>&1
import json, sys
path, fields, values = sys.argv[1], sys.argv[2].split(","), [v.strip() for v in sys.argv[3].split(",")]
doc = {"nvidia_smi": dict(zip(fields, values))}
try:
    import torch
    p = torch.cuda.get_device_properties(0)
    doc["properties"] = {"name": p.name, "sm_count": p.multi_processor_count,
                         "l2_bytes": getattr(p, "L2_cache_size", None), "memory_bytes": p.total_memory,
                         "torch": torch.__version__, "torch_cuda": torch.version.cuda}
except Exception as e:
    doc["properties"] = {"error": f"{e.__class__.__name__}: {e}"}
json.dump(doc, open(path, "w"), indent=2)
print("\n# device properties (PyTorch)\n" + json.dumps(doc["properties"], indent=2))
EOF
fi
arch="${CHECK_CUDA_ARCH:-90}"
(( have_gpu )) && arch="$gpu_cap"
nvcc_v="$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
cmake_v="$(cmake --version 2>/dev/null | head -1 | awk '{print $3}')"
cxx_v="$(c++ --version 2>/dev/null | head -1)"
nccl_root="${LATTICE_NCCL_ROOT:-}"
if [[ -z "$nccl_root" && "${CHECK_NCCL:-auto}" != off ]]; then
    nccl_root="$(timeout 10 python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)"
fi
[[ -n "$nccl_root" && -e "$nccl_root/lib/libnccl.so.2" ]] || nccl_root=""
# The wheel's library version (ncclGetVersion through ctypes) and its header's, when it ships one.
timeout 10 python3 - "$work/nccl.json" "$nccl_root" "$kit/nccl/include/nccl.h" <<'EOF' >/dev/null 2>&1
import ctypes, json, os, re, sys
path, root, kit_h = sys.argv[1:]
def header_version(h):
    try:
        t = open(h).read()
        return ".".join(re.search(rf"#define NCCL_{k} (\d+)", t).group(1) for k in ("MAJOR", "MINOR", "PATCH"))
    except Exception:
        return None
doc = {"wheel": root or None, "library": None, "wheel_header": None, "kit_header": header_version(kit_h)}
if root:
    v = ctypes.c_int()
    try:
        ctypes.CDLL(os.path.join(root, "lib", "libnccl.so.2")).ncclGetVersion(ctypes.byref(v))
        code = v.value
        doc["library"] = f"{code // 10000}.{code // 100 % 100}.{code % 100}" if code >= 10000 else str(code)
    except Exception as e:
        doc["library"] = f"not loadable: {e}"
    doc["wheel_header"] = header_version(os.path.join(root, "include", "nccl.h"))
json.dump(doc, open(path, "w"), indent=2)
EOF
nccl_note="$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
lib, wh, kh = d["library"], d["wheel_header"], d["kit_header"]
print("NCCL %s (header: %s)" % (lib, ("wheel " + wh) if wh else ("kit %s" % kh)) if d["wheel"] else "no NCCL wheel")' \
    "$work/nccl.json" 2>/dev/null || echo "NCCL ?")"
shared="$root/../shared"
[[ -d "$shared/golden" ]] || shared="$kit/shared"
export LATTICE_SHARED_DIR="$shared" LATTICE_SOURCE_DIR="$root"
# Carried binaries find the wheel's NCCL and the toolkit's cuBLASLt here (their RPATH is the build
# machine's); binaries built here have their own RPATH.
# PyTorch's cuBLAS and CUDA runtime wheels come after the toolkit, for a toolkit without them.
wheel_libs="$(timeout 10 python3 -c '
import importlib, os
for m in ("nvidia.cublas", "nvidia.cuda_runtime"):
    try:
        print(os.path.join(list(importlib.import_module(m).__path__)[0], "lib"))
    except Exception:
        pass' 2>/dev/null | paste -sd: -)"
export LD_LIBRARY_PATH="${nccl_root:+$nccl_root/lib:}$cuda_home/lib64:$cuda_home/lib${wheel_libs:+:$wheel_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
sanitizer="$(command -v compute-sanitizer || ls "$cuda_home"/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)"
env_line="$(nproc) cores, nvcc ${nvcc_v:-none}, cmake ${cmake_v:-none}, ${cxx_v:-no c++}, python3 $(python3 -c 'import platform; print(platform.python_version())' 2>/dev/null || echo none), $nccl_note, compute-sanitizer ${sanitizer:+yes}${sanitizer:-no}"
{ echo "GPU: ${gpu_name:-none} ${driver:+driver $driver} sm_$arch"; echo "$env_line"; echo "kit: $kit"
  echo "golden: $shared/golden"; echo "NCCL wheel: ${nccl_root:-none}"; echo "LD_LIBRARY_PATH: $LD_LIBRARY_PATH"
  echo "compute-sanitizer: ${sanitizer:-none}"; [[ -n "${LATTICE_TEST_INJECT:-}" ]] &&
  echo "LATTICE_TEST_INJECT=$LATTICE_TEST_INJECT (injected faults)"; } | tee -a "$out/build.log"
if [[ -z "$nvcc_v" || -z "$cmake_v" ]]; then
    step_end FAIL "no nvcc or cmake on PATH (CUDA_HOME?)"
else
    smi="$( (( have_gpu )) && python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
s, p = d["nvidia_smi"], d.get("properties", {})
print("SM %s/%s, power cap %s, MIG %s, ECC %s, %s SMs, L2 %d MiB" % (s.get("clocks.sm"), s.get("clocks.max.sm"),
      s.get("power.limit"), s.get("mig.mode.current"), s.get("ecc.mode.current"), p.get("sm_count", "?"),
      (p.get("l2_bytes") or 0) >> 20))' "$work/device.json" 2>/dev/null)"
    step_end PASS "${gpu_name:-no GPU (nvidia-smi absent or silent)}${smi:+ ($smi)}, build for sm_$arch, ${jobs} jobs"
fi

# ---- bundle: binaries built on the development machine, if they match this tree and load ----
bin_dir=""
if step_begin bundle 10 0; then
    if [[ "${CHECK_BUNDLE:-auto}" == off ]]; then
        step_end SKIP "CHECK_BUNDLE=off: building here"
    elif [[ ! -f "$kit/bin/sources.json" ]]; then
        step_end SKIP "no gpu-kit/bin (simulate.sh --bundle makes it): building here"
    elif ! grep -q "\"cuda_architectures\": \"$arch\"" "$kit/bin/sources.json"; then
        step_end SKIP "the bundle is not for sm_$arch: building here"
    else
        timeout -k 5 "$allowed" python3 "$here/bundle.py" verify "$kit" "$root" "$build/bundle-bin" >"$work/bundle.txt" 2>&1
        rc=$?
        note="$(tail -1 "$work/bundle.txt")"
        if [[ $rc -eq 0 ]]; then
            bin_dir="$build/bundle-bin"
            step_end PASS "$note"
        else
            echo "bundle not used: $note" >>"$out/build.log"
            step_end SKIP "not used ($note): building here"
        fi
    fi
fi
exe() {  # the path of executable $1: the bundle's, else the build's
    if [[ -n "$bin_dir" ]]; then [[ -x "$bin_dir/$1" ]] && echo "$bin_dir/$1"; return; fi
    find "$build" -name "$1" -type f -perm -u+x -print -quit 2>/dev/null
}

# ---- configure + build (not when the bundle is used) ----
configured=0
if [[ -n "$bin_dir" ]]; then
    : # the bundle's tests.json lists the tests; nothing to configure or build
elif step_begin configure 30 0; then
    args=(-S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLATTICE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch"
          -DLATTICE_SHARED_DIR="$shared")
    command -v ninja >/dev/null && args+=(-G Ninja)
    [[ -d "$kit/include" ]] && args+=(-DLATTICE_THIRD_PARTY="$kit")
    # NCCL's header beside its library (the wheel's include/); the kit's header only when the wheel has none.
    [[ -d "$kit/nccl/include" && ! -f "$nccl_root/include/nccl.h" ]] && args+=(-DLATTICE_NCCL_INCLUDE_DIR="$kit/nccl/include")
    [[ -n "$nccl_root" ]] && args+=(-DLATTICE_NCCL_ROOT="$nccl_root")
    [[ "${CHECK_NCCL:-auto}" == off ]] && args+=(-DLATTICE_NCCL=OFF)
    command -v nvcc >/dev/null && args+=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
    run_logged "$out/build.log" "$allowed" cmake "${args[@]}"
    rc=$?
    facts="$(sed -n 's/^-- lattice: //p' "$out/build.log" | sed -nE 's/^(MPI|CUDA backend|NCCL) (ON|OFF).*/\1 \2/p; s/^(fmt header-only).*/\1/p; s/^built without MPI: ([0-9]+ multi-rank tests not built).*/\1/p' | paste -sd ';' - | sed 's/;/; /g')"
    nccl_h="$(sed -n 's/^-- lattice: NCCL ON (nccl.h in \([^,]*\),.*/\1/p' "$out/build.log" | tail -1)"
    if [[ $rc -eq 0 ]]; then
        configured=1
        step_end PASS "$facts${nccl_h:+ (nccl.h: $nccl_h)}"
    else
        tail -30 "$out/build.log"
        step_end "$(status_of $rc)" "cmake exited $rc (build.log)"
    fi
fi
if [[ -z "$bin_dir" ]] && step_begin build 140 0; then
  if [[ $configured -eq 0 ]]; then
    step_end SKIP "configure did not pass"
  else
    # The executables of the CUDA tests (one binary may serve several ctest entries).
    mapfile -t cuda_tests < <(python3 "$here/bundle.py" targets "$build")
    targets=("${cuda_tests[@]}" bench_gpu_gemm bench_gpu_attention bench_gpu_decode lattice)
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
    for t in "${targets[@]}"; do [[ -n "$(exe "$t")" ]] || missing+=("$t"); done
    if [[ $rc -eq 0 ]]; then
        step_end PASS "${#targets[@]} targets for sm_$arch with $jobs jobs (${#cuda_tests[@]} CUDA test binaries), ${cpu_s:-?} CPU-s"
    else
        grep -E 'error|FAILED' "$out/build.log" | head -20
        step_end "$(status_of $rc)" "exit $rc; not built: ${missing[*]:-none} (build.log)"
    fi
  fi
fi

# ---- the CUDA tests: one process per binary, then the failed ones case by case ----
tests_listing=""
if [[ -n "$bin_dir" ]]; then
    tests_listing="$kit/bin/tests.json"
elif [[ $configured -eq 1 ]]; then
    tests_listing="$work/ctest-cuda.json"
    (cd "$build" && ctest -N -L cuda --show-only=json-v1 >"$tests_listing" 2>/dev/null) || tests_listing=""
fi
if step_begin tests 90 1; then
  if [[ -z "$tests_listing" ]]; then
    step_end SKIP "no test listing (configure did not pass)"
  else
    (( have_gpu )) || echo "(no GPU: every CUDA test binary exits 77, SKIP)"
    timeout -k 5 "$allowed" python3 "$here/run_cuda_tests.py" tests --tests "$tests_listing" ${bin_dir:+--bin-dir "$bin_dir"} \
        --json "$work/tests.json" --log "$out/tests.log" --deadline "$(( allowed - 5 ))" --timeout "$test_timeout" \
        --case-timeout "$(( test_timeout > 30 * scale ? 30 * scale : test_timeout ))" --jobs "${CHECK_TEST_JOBS:-4}"
    rc=$?
    read -r passed failed timed skipped notrun reason < <(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
print(d["passed"], d["failed"], d["timed_out"], d["skipped"], d["not_run"], (d["skip_reasons"] or ["-"])[0])' "$work/tests.json" 2>/dev/null || echo "0 0 0 0 0 -")
    bad="$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
out = []
for r in d["runs"]:
    if r["status"] in ("FAIL", "TIMEOUT"):
        cases = r.get("cases") or []
        badc = [c for c in cases if c["status"] in ("FAIL", "TIMEOUT")]
        out.append("%s %s" % (r["name"], r["status"]) + (" (%d/%d cases bad on rerun)" % (len(badc), len(cases)) if cases else ""))
print("; ".join(out))' "$work/tests.json" 2>/dev/null)"
    note="$passed passed, $failed failed, $timed timed out, $skipped skipped${bad:+: $bad}"
    (( notrun > 0 )) && note+=", $notrun not run"
    if (( failed > 0 || timed > 0 || notrun > 0 )); then step_end FAIL "$note (tests.log)"
    elif [[ $rc -ne 0 && $rc -ne 77 ]]; then step_end "$(status_of $rc)" "$note; runner exit $rc"
    elif (( passed == 0 && skipped > 0 && have_gpu )); then step_end FAIL "$note, yet nvidia-smi shows $gpu_name"
    elif (( passed == 0 )); then step_end SKIP "$note ($reason)"
    elif (( have_gpu == 0 )); then step_end FAIL "$note: CUDA tests passed without a GPU"
    else step_end PASS "$note"; fi
  fi
fi

# ---- compute-sanitizer on small shapes ----
if step_begin sanitize 40 1; then
    san_bin="$(exe test_cuda_sanitize)"
    if (( ! have_gpu )); then step_end SKIP "no CUDA device"
    elif [[ -z "$sanitizer" ]]; then step_end SKIP "compute-sanitizer is not installed"
    elif [[ -z "$san_bin" ]]; then step_end FAIL "test_cuda_sanitize was not built"
    else
        timeout -k 5 "$allowed" python3 "$here/run_cuda_tests.py" sanitize --sanitizer "$sanitizer" --bin "$san_bin" \
            --json "$work/sanitize.json" --log "$out/tests.log" --deadline "$(( allowed - 5 ))" \
            --timeout "$(( (allowed - 5) / 3 ))"
        rc=$?
        note="$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
print(", ".join("%s %s" % (r["name"], r["status"]) + (" (%s)" % r["summary"] if r.get("summary") else "") for r in d["runs"]))' "$work/sanitize.json" 2>/dev/null)"
        step_end "$( [[ $rc -eq 0 ]] && echo PASS || ( [[ $rc -eq 77 ]] && echo SKIP || echo FAIL ))" "${note:-runner exit $rc} (tests.log)"
    fi
fi

# ---- benchmarks ----
bench_note() {  # one line from a benchmark's JSON
    python3 - "$@" <<'EOF' 2>/dev/null
import json, sys
kind, path = sys.argv[1], sys.argv[2]
d = json.load(open(path))
if kind == "gemm":
    r = [x for x in d["rows"] if x["kernel"].startswith("int8")]
    head = [x for x in r if x["m"] == x["n"] == x["k"] == 4096]
    line = (f"int8 4096^3 {head[0]['tops']:.0f} TOPS = {head[0]['pct_peak']:.0f}% of {d['peaks']['int8_tops']:.0f}"
            if head else "no 4096^3 row")
    print(line + f"; {len(d['rows'])} rows")
elif kind == "attention":
    print(", ".join(f"ctx {x['ctx']} b{x['batch']} {x['pct_copy']:.0f}%" for x in d["rows"]) + " of the copy bandwidth")
elif kind == "decode":
    parts = []
    for sec in d.get("sections", []):
        p = []
        s1 = [x for x in sec.get("slope", []) if x["batch"] == 1]
        if s1:
            p.append(f"slope {s1[0]['pct_of_floor']:.0f}%")
        g1 = [x for x in sec.get("graph", []) if x["batch"] == 1]
        if g1:
            p.append(f"graph {g1[0]['pct_of_floor']:.0f}%")
        e1 = [x for x in sec.get("engine", []) if x["batch"] == 1]
        if e1:
            p.append(f"engine {e1[0]['pct_of_floor']:.0f}% ({e1[0]['tokens_per_s']:.0f} tok/s)")
        parts.append(f"{sec['shape']} b1: " + (", ".join(p) or "nothing measured"))
    print("; ".join(parts) + " of the floor" if parts else "no section")
elif kind == "e2e":
    print(f"{d['decode_tokens_per_s']:.0f} tok/s (load {d['load_seconds']:.0f} s)")
EOF
}
for b in gemm attention decode; do
    case $b in gemm) deadline=30 ;; attention) deadline=15 ;; decode) deadline=50 ;; esac
    step_begin "$b" "$deadline" 1 || continue
    bin="$(exe bench_gpu_$b)"
    if [[ -z "$bin" ]]; then step_end FAIL "bench_gpu_$b was not built"; continue; fi
    case $b in
        gemm) bargs=(--out "$out"); json="$out/gemm.json" ;;
        attention) bargs=(--out "$work"); json="$work/attention.json" ;;
        decode) bargs=(--out "$out" --layers70b "$layers" --deadline "$(( allowed - 3 ))"); json="$out/decode.json" ;;
    esac
    echo "=== bench_gpu_$b" >>"$out/bench.log"
    run_logged "$out/bench.log" "$allowed" "$bin" "${bargs[@]}"
    rc=$?
    note="$( [[ -f "$json" ]] && bench_note "$b" "$json")"
    if [[ $rc -eq 77 ]]; then
        note="$(grep SKIP "$out/bench.log" | tail -1 | sed 's/.*SKIP[A-Z]*: *//')"
        # A skip where nvidia-smi shows a GPU is a failure of the check, not a missing GPU.
        (( have_gpu )) && { rc=1; note="skipped (${note}), yet nvidia-smi shows $gpu_name"; }
    elif [[ $rc -ne 0 ]]; then
        note="exit $rc: $(tail -1 "$out/bench.log" | cut -c1-100) ${note}"
    fi
    sed -n "/=== bench_gpu_$b/,\$p" "$out/bench.log" | tail -24
    step_end "$(status_of $rc)" "$note"
done

# ---- end to end: lattice generate on the CUDA backend ----
if step_begin e2e 30 1; then
    lattice="$(exe lattice)"
    if [[ -z "$lattice" ]]; then
        step_end FAIL "the lattice executable was not built"
    else
        notes=(); worst=PASS
        for batch in 1 8; do
            per=$(( allowed - ($(date +%s) - step_t0) ))
            (( batch == 1 )) && per=$(( per / 2 ))
            (( per >= 5 )) || { notes+=("b$batch: out of time"); worst=TIMEOUT; break; }
            echo "=== e2e batch $batch" >>"$out/bench.log"
            run_logged "$out/bench.log" "$per" "$lattice" generate --random-weights --config "$e2e_preset" --quant w8a8 \
                --device cuda --prompt-ids 1,2,3,4,5,6,7,8 --max-new-tokens 64 --ignore-eos --batch "$batch" \
                --stats-json "$work/e2e_b$batch.json"
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
