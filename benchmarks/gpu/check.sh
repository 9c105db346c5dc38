#!/usr/bin/env bash
# GPU check for lattice, in two stages that each fit one device call, on a bare machine with one NVIDIA
# GPU (nvcc, CMake, ninja, a host compiler, Python; nothing else of ours), from the working tree plus
# gpu-kit/ (benchmarks/gpu/prepare.sh; the executables from benchmarks/gpu/simulate.sh --bundle).
#
#   check.sh 1    correctness, <= 240 s, from the bundle only (no configure, no compile):
#     env        10  nvidia-smi --query-gpu (clocks, power cap, MIG, ECC), PyTorch's SM count, tools, NCCL
#     bundle     15  gpu-kit/bin: used when its sources match this tree and its libraries load
#     tests     130  every CUDA ctest entry (oracles included) as its own process, 4 at a time, 60 s each,
#                    each with its LATTICE_TEST_SEED; verdict, seed, failing cases, first CUDA error
#     diagnose   60  each failure: rerun alone with the same seed under CUDA_LAUNCH_BLOCKING=1, then
#                    compute-sanitizer memcheck of that binary alone, an equal share each
#     sanitize   90  memcheck per case of test_cuda_sanitize, racecheck + synccheck on its decode case
#                    (whatever the budget leaves; a run cut short is INCOMPLETE, not a failure)
#     gpu-after  10  nvidia-smi -q after the tests (throttling, ECC, retired pages), always reserved
#   check.sh 2    performance, <= 300 s, from the bundle; each benchmark under its own deadline, keeping
#                 every row it wrote:
#     env 10, bundle 15, gemm 60 (INT8/FP16 4096^3 first), attention 30, decode 110 (TinyLlama and 70B
#     layer shapes: the HBM floor by slope, graph and engine), e2e 40 (lattice generate), gpu-after 10
#   check.sh all  both, <= 540 s, and builds on the machine (configure 30, build 140) when there is no
#                 usable bundle (a machine without one, or a tree changed after the bundle was made)
# Every step's deadline is cut to what the stage's budget has left (gpu-after's share held back);
# summary.txt / summary.json are rewritten (atomically) when a step starts and when it ends, so a stage
# killed at any point leaves a readable summary naming the step it was in. Stage 2 does not depend on
# stage 1: after a failed stage 1 it still runs in the same lend.
#
# $OUT (default gpu-results/stage<N>) gets: summary.txt, summary.json, gpu.txt (nvidia-smi before and
# after), tests.log (stage 1: every test's output, the reruns, the sanitizer runs) or bench.log,
# gemm.json, decode.json (stage 2), build.log (only when it built). Exit: 0 when no step FAILed or ran
# out of time (SKIP allowed), 1 otherwise, 2 on a bad argument.
# Env: OUT, BUILD_DIR (build-gpu-check), JOBS (nproc), CUDA_HOME (/usr/local/cuda), LATTICE_KIT (gpu-kit),
#      LATTICE_NCCL_ROOT, CHECK_NCCL (auto|off), CHECK_CUDA_ARCH (90, when no GPU), CHECK_BUDGET_S (the
#      stage's), CHECK_TIME_SCALE (1; may be fractional: multiplies every deadline and timeout, the
#      dry run uses 0.05), CHECK_BUNDLE (auto|off), CHECK_TEST_TIMEOUT (60), CHECK_TEST_JOBS (4),
#      CHECK_SEED (one LATTICE_TEST_SEED for every test: reproduces a run), CHECK_ONLY (ctest names,
#      comma-separated: stage 1 runs only those), DECODE_LAYERS (8),
#      LATTICE_TEST_INJECT (fail:<binary>,hang:<binary>: tests/doctest_main.cpp's injected faults).
set -uo pipefail

stage="${1:-all}"
case "$stage" in
    1 | 2 | all | reap) ;;
    *) echo "usage: check.sh 1|2|all|reap (stage 1: tests, stage 2: benchmarks, all: both, building if needed;" \
            "reap: only kill what a killed earlier run left running)" >&2
       exit 2 ;;
esac
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="${BUILD_DIR:-$root/build-gpu-check}"
# A stage killed from outside (the device tool's timeout) leaves its tests' process groups behind (each
# runs in a session of its own): a hung one would hold the GPU into the next call on a warm machine.
# The runner keeps their ids in check-work-*/*.pids; every start kills what is listed there.
reap() {
    local f pid n=0
    for f in "$build"/check-work-*/*.pids; do
        [[ -f $f ]] || continue
        while read -r pid; do
            [[ $pid =~ ^[0-9]+$ ]] && kill -KILL -- "-$pid" 2>/dev/null && n=$(( n + 1 ))
        done <"$f"
        rm -f "$f"
    done
    (( n == 0 )) || echo "check.sh: killed $n process group(s) left by an earlier, killed run"
}
reap
[[ "$stage" == reap ]] && exit 0
out="${OUT:-$root/gpu-results/stage$stage}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
work="$build/check-work-$stage"
kit="${LATTICE_KIT:-$root/gpu-kit}"
jobs="${JOBS:-$(nproc)}"
scale="${CHECK_TIME_SCALE:-1}"
report() { python3 "$here/check_report.py" "$@" 2>/dev/null; }
case "$stage" in 1) budget_s=240 ;; 2) budget_s=300 ;; *) budget_s=540 ;; esac
budget_s="${CHECK_BUDGET_S:-$budget_s}"
now_ms() { date +%s%3N; }
t0_ms=$(now_ms)
# ms S: S seconds of the H200 timetable in this run's milliseconds (CHECK_TIME_SCALE applied).
ms() { awk -v s="$1" -v k="$scale" 'BEGIN { printf "%d", s * k * 1000 }'; }
sec() { awk -v m="$1" 'BEGIN { printf "%.1f", m / 1000 }'; }
elapsed_ms() { echo $(( $(now_ms) - t0_ms )); }
budget_ms=$(ms "$budget_s")
# Held back from every other step: gpu-after's deadline and a margin (scaled), plus 1.5 s of real time
# for the bookkeeping after a step's command (its notes, the summary: Python starts; not scaled).
reserve_ms=$(( $(ms 12) + 1500 ))
# Per step: the deadline of its command is its share less this real-time allowance for its bookkeeping,
# and a runner's own deadline is less again (it must write its JSON before the step's timeout kills it).
overhead_ms=800
runner_margin_ms=$(( $(ms 2) + 500 ))
test_timeout="$(sec "$(ms "${CHECK_TEST_TIMEOUT:-60}")")"
mkdir -p "$work"
rm -f "$out"/{summary.txt,summary.json,gpu.txt,build.log,tests.log,bench.log,gemm.json,decode.json} "$work"/*.json \
    "$work/steps.tsv" "$work/current"
: >"$work/steps.tsv"
printf 'lattice GPU check, stage %s: starting\n' "$stage" >"$out/summary.txt.tmp" && mv "$out/summary.txt.tmp" "$out/summary.txt"
gpu_name=""; gpu_cap=0; env_line=""; have_gpu=0
jstr() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "${s//$'\t'/ }"; }
write_meta() {  # in the shell: no Python start per call
    printf '{"stage": %s, "budget_s": %s, "time_scale": %s, "t0": %s, "gpu": %s, "sm": %s, "environment": %s}\n' \
        "$(jstr "$stage")" "$(sec "$budget_ms")" "$scale" "$(awk -v m="$t0_ms" 'BEGIN { printf "%.3f", m / 1000 }')" \
        "$( [[ -n $gpu_name ]] && jstr "$gpu_name" || echo null)" "${gpu_cap:-0}" "$(jstr "$env_line")" \
        >"$work/meta.json.tmp" && mv "$work/meta.json.tmp" "$work/meta.json"
}
write_summary() { report summary "$work" "$out" >/dev/null || true; }
write_meta; write_summary

say() { printf '\n==> %s  [%ss]\n' "$*" "$(sec "$(elapsed_ms)")"; }
# ---- steps: steps.tsv (name, status, seconds, deadline, needs_gpu, note) and current -> summary ----
step_name=""; step_t0=0; step_gpu=0; allowed=0; allowed_ms=0
# step_begin NAME DEADLINE_S NEEDS_GPU: sets $allowed (seconds: the deadline cut to what the budget has
# left after the reserve); returns 1 (recording SKIP) when under 3 s (scaled) would be left.
step_begin() {
    step_name=$1; step_gpu=$3; step_t0=$(now_ms)
    local hold=$reserve_ms
    [[ $step_name == gpu-after ]] && hold=0
    local left=$(( budget_ms - $(elapsed_ms) - hold ))
    local want; want=$(ms "$2")
    allowed_ms=$(( want < left ? want : left ))
    # (never more than half of it: a short step keeps something)
    [[ $step_name == gpu-after ]] ||
        allowed_ms=$(( allowed_ms > 2 * overhead_ms ? allowed_ms - overhead_ms : allowed_ms / 2 ))
    allowed="$(sec "$allowed_ms")"
    if (( allowed_ms < $(ms 3) )); then
        step_end SKIP "out of time: $(sec "$left") s of the stage's $(sec "$budget_ms") s left"
        return 1
    fi
    printf '%s\t%s\t%s\n' "$step_name" "$(awk -v m="$step_t0" 'BEGIN { printf "%.3f", m / 1000 }')" "$allowed" \
        >"$work/current"
    write_summary
    say "$step_name (deadline ${allowed}s)"
    return 0
}
step_end() {  # step_end STATUS NOTE
    local secs; secs="$(sec $(( $(now_ms) - step_t0 )))"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$step_name" "$1" "$secs" "$allowed" "$step_gpu" "${2//$'\t'/ }" >>"$work/steps.tsv"
    rm -f "$work/current"
    printf -- '--- %s: %s (%ss) %s\n' "$step_name" "$1" "$secs" "$2"
    write_summary
}
# Commands run under `timeout --foreground`: in this script's process group, so that a kill of the group
# (the device tool's timeout) reaches them; the tests' own process groups are reaped as above.
run_logged() {  # run_logged LOG SECONDS CMD...: CMD under a deadline, output appended to LOG; CMD's status
    local log=$1 secs=$2; shift 2
    echo "+ $*" >>"$log"
    timeout --foreground -k 2 "$secs" "$@" >>"$log" 2>&1
}
status_of() {  # status_of RC -> PASS / SKIP (77) / TIMEOUT (124, 137) / FAIL
    case "$1" in 0) echo PASS ;; 77) echo SKIP ;; 124 | 137) echo TIMEOUT ;; *) echo FAIL ;; esac
}
has_step() { case " $steps " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
case "$stage" in
    1) steps="env bundle tests diagnose sanitize gpu-after" ;;
    2) steps="env bundle gemm attention decode e2e gpu-after" ;;
    *) steps="env bundle configure build tests diagnose sanitize gemm attention decode e2e gpu-after" ;;
esac

source "$here/check_env.sh"  # the env step: sets gpu_name gpu_cap have_gpu arch env_line sanitizer shared

# ---- bundle: the executables built for this tree elsewhere, if they match it and load ----
bin_dir=""
if step_begin bundle 15 0; then
    if [[ "${CHECK_BUNDLE:-auto}" == off ]]; then
        step_end SKIP "CHECK_BUNDLE=off"
    elif [[ ! -f "$kit/bin/sources.json" ]]; then
        step_end SKIP "no gpu-kit/bin (benchmarks/gpu/simulate.sh --bundle makes it)"
    elif ! grep -q "\"cuda_architectures\": \"$arch\"" "$kit/bin/sources.json"; then
        step_end SKIP "the bundle is not for sm_$arch"
    else
        timeout --foreground -k 2 "$allowed" python3 "$here/bundle.py" verify "$kit" "$root" "$build/bundle-bin" >"$work/bundle.txt" 2>&1
        rc=$?
        note="$(tail -1 "$work/bundle.txt")"
        if [[ $rc -eq 0 ]]; then bin_dir="$build/bundle-bin"; step_end PASS "$note"
        else step_end SKIP "not used: $note"; fi
    fi
fi
if [[ -z "$bin_dir" && "$stage" != all ]]; then
    # Stages 1 and 2 never build (a build does not fit their budget): say so in every later step.
    no_bundle="no usable bundle (see the bundle step): stage $stage does not build; run prepare.sh and simulate.sh --bundle after the last commit, or check.sh all"
fi
exe() {  # the path of executable $1: the bundle's, else the build's
    if [[ -n "$bin_dir" ]]; then [[ -x "$bin_dir/$1" ]] && echo "$bin_dir/$1"; return; fi
    find "$build" -name "$1" -type f -perm -u+x -print -quit 2>/dev/null
}

tests_listing=""
[[ -n "$bin_dir" ]] && tests_listing="$kit/bin/tests.json"
has_step build && [[ -z "$bin_dir" ]] && source "$here/check_build.sh"  # configure + build: sets tests_listing

# ---- stage 1: the CUDA tests, the diagnosis of each failure, the sanitizer on small shapes ----
runner=(python3 "$here/run_cuda_tests.py" --pid-file "$work/runner.pids")
[[ -n "${CHECK_SEED:-}" ]] && runner+=(--seed "$CHECK_SEED")
if has_step tests && step_begin tests 130 1; then
    if [[ -z "$tests_listing" ]]; then
        step_end FAIL "${no_bundle:-no test listing (configure did not pass)}"
    else
        (( have_gpu )) || echo "(no GPU: every CUDA test binary exits 77, SKIP)"
        timeout --foreground -k 2 "$allowed" "${runner[@]}" tests --tests "$tests_listing" ${bin_dir:+--bin-dir "$bin_dir"} \
            --json "$work/tests.json" --log "$out/tests.log" --deadline "$(sec $(( allowed_ms - runner_margin_ms )))" \
            --timeout "$test_timeout" --jobs "${CHECK_TEST_JOBS:-4}" ${CHECK_ONLY:+--only "$CHECK_ONLY"}
        rc=$?
        note="$(report note tests "$work/tests.json")"
        read -r passed failed timed skipped notrun < <(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
print(d["passed"], d["failed"], d["timed_out"], d["skipped"], d["not_run"])' "$work/tests.json" 2>/dev/null || echo "0 0 0 0 0")
        if (( failed > 0 || timed > 0 || notrun > 0 )); then step_end FAIL "$note"
        elif [[ $rc -ne 0 && $rc -ne 77 ]]; then step_end "$(status_of $rc)" "$note; runner exit $rc"
        elif (( passed == 0 && skipped > 0 && have_gpu )); then step_end FAIL "$note, yet nvidia-smi shows $gpu_name"
        elif (( passed == 0 )); then step_end SKIP "$note"
        elif (( have_gpu == 0 )); then step_end FAIL "$note: CUDA tests passed without a GPU"
        else step_end PASS "$note"; fi
    fi
fi
if has_step diagnose && [[ -f "$work/tests.json" ]] &&
    python3 -c 'import json,sys; sys.exit(0 if any(r["status"] in ("FAIL","TIMEOUT") and r.get("cmd") for r in json.load(open(sys.argv[1]))["runs"]) else 1)' \
        "$work/tests.json" 2>/dev/null && step_begin diagnose 60 1; then
    timeout --foreground -k 2 "$allowed" "${runner[@]}" diagnose --from-json "$work/tests.json" --sanitizer "$sanitizer" \
        --json "$work/diagnose.json" --log "$out/tests.log" --deadline "$(sec $(( allowed_ms - runner_margin_ms )))" \
        --timeout "$test_timeout" --min-share "$(sec "$(ms 10)")"
    rc=$?
    note="$(report note diagnose "$work/diagnose.json")"
    # The failures are the tests step's; this step fails only when it could not diagnose them.
    if [[ $rc -eq 0 ]]; then step_end PASS "$note"; else step_end "$(status_of $rc)" "${note:-runner exit $rc}"; fi
fi
if has_step sanitize && step_begin sanitize 90 1; then
    san_bin="$(exe test_cuda_sanitize)"
    if (( ! have_gpu )); then step_end SKIP "no CUDA device"
    elif [[ -z "$sanitizer" ]]; then step_end SKIP "compute-sanitizer is not installed"
    elif [[ -z "$san_bin" ]]; then step_end FAIL "${no_bundle:-test_cuda_sanitize was not built}"
    else
        timeout --foreground -k 2 "$allowed" "${runner[@]}" sanitize --sanitizer "$sanitizer" --bin "$san_bin" \
            --json "$work/sanitize.json" --log "$out/tests.log" --deadline "$(sec $(( allowed_ms - runner_margin_ms )))" \
            --timeout "$(sec "$(ms 30)")" --min-share "$(sec "$(ms 10)")"
        rc=$?
        note="$(report note sanitize "$work/sanitize.json")"
        case $rc in 0) st=PASS ;; 77) st=SKIP ;; 124 | 137) st=PASS; note+=" (cut at the deadline)" ;; *) st=FAIL ;; esac
        step_end "$st" "${note:-runner exit $rc} (tests.log)"
    fi
fi

# ---- stage 2: the benchmarks, each under its own deadline, keeping every row written ----
for b in gemm attention decode; do
    has_step "$b" || continue
    case $b in gemm) deadline=60 ;; attention) deadline=30 ;; decode) deadline=110 ;; esac
    step_begin "$b" "$deadline" 1 || continue
    bin="$(exe bench_gpu_$b)"
    if [[ -z "$bin" ]]; then step_end FAIL "${no_bundle:-bench_gpu_$b was not built}"; continue; fi
    # The benchmark stops itself a little before the step's deadline, writing what it measured.
    own="$(sec $(( allowed_ms - $(ms 4) )))"
    case $b in
        gemm) bargs=(--out "$out" --deadline "$own"); json="$out/gemm.json" ;;
        attention) bargs=(--out "$work"); json="$work/attention.json" ;;
        decode) bargs=(--out "$out" --layers70b "${DECODE_LAYERS:-8}" --deadline "$own"); json="$out/decode.json" ;;
    esac
    echo "=== bench_gpu_$b" >>"$out/bench.log"
    run_logged "$out/bench.log" "$allowed" "$bin" "${bargs[@]}"
    rc=$?
    note="$(report note "$b" "$json")"
    if [[ $rc -eq 77 ]]; then
        note="$(grep SKIP "$out/bench.log" | tail -1 | sed 's/.*SKIP[A-Z]*: *//')"
        (( have_gpu )) && { rc=1; note="skipped (${note}), yet nvidia-smi shows $gpu_name"; }
    elif [[ $rc -ne 0 ]]; then
        note="exit $rc: $(tail -1 "$out/bench.log" | cut -c1-100); kept: ${note:-nothing}"
    fi
    sed -n "/=== bench_gpu_$b/,\$p" "$out/bench.log" | tail -24
    step_end "$(status_of $rc)" "$note"
done
has_step e2e && source "$here/check_e2e.sh"

# ---- nvidia-smi -q after the stage's GPU work (held back from every other step's deadline) ----
if step_begin gpu-after 10 0; then
    if (( have_gpu )); then
        { echo; echo "# nvidia-smi -q after stage $stage ($(sec "$(elapsed_ms)") s in)"
          timeout --foreground "$allowed" nvidia-smi -q 2>&1; } >>"$out/gpu.txt"
        throttle="$(grep -A12 -i 'Clocks Event Reasons\|Clocks Throttle Reasons' "$out/gpu.txt" | grep -i ': Active' |
            sed 's/ *: Active//; s/^ *//' | sort -u | paste -sd, -)"
        step_end PASS "nvidia-smi -q in gpu.txt${throttle:+; clock reasons active: $throttle}"
    else
        step_end SKIP "no GPU"
    fi
fi
echo
cat "$out/summary.txt"
grep -qE $'\t(FAIL|TIMEOUT)\t' "$work/steps.tsv" && exit 1
exit 0
