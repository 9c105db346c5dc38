#!/usr/bin/env bash
# Sets up everything and runs the whole test suite, exactly as CI does (.ci/run calls this):
#   1. Release build (GCC; the CUDA backend is compiled too when nvcc exists: the only stage with nvcc)
#      + every test (unit, mpi, slow; CUDA tests are reported skipped without a GPU, counted, with the reason).
#   2. The sanitizer build: clang, AddressSanitizer + UndefinedBehaviorSanitizer at -O1 with line tables
#      (CPU only, no benchmarks), the libFuzzer targets in the same build; the same suite under it.
#   3. Each libFuzzer target for a bounded time (LATTICE_FUZZ_SECONDS, default 20), two at a time.
# Then the time report: each stage's time, the ten slowest tests, and the verdict of the budget in
# scripts/test_budget.conf (over budget fails the run; docs/testing.md says what the limits are and why).
# Usage: scripts/test.sh [--quick]   (--quick: step 1 only)
# Environment: LATTICE_JOBS (default nproc), CCACHE_DIR (default ~/.cache/lattice-ccache, kept across
# runs), LATTICE_TIME_BUDGET=warn (report the budget, never fail on it: a developer's busy laptop).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
case "$mode" in
    ""|--quick) ;;
    *) echo "usage: scripts/test.sh [--quick]" >&2; exit 2 ;;
esac
jobs=${LATTICE_JOBS:-$(nproc)}
record=$(mktemp)
trap 'rm -f "$record"' EXIT
stage_start=0
begin() { echo "== $1 =="; stage_start=$EPOCHREALTIME; }
end() {
    local s
    s=$(awk -v a="$stage_start" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}')
    printf 'stage\t%s\t%s\n' "$1" "$s" >> "$record"
    printf '== %s: %.0f s ==\n' "$1" "$s"
}

begin setup
scripts/setup.sh --bench   # --bench: matplotlib for the benchmarks_run_py plot test
end setup

export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/lattice-ccache}
# Paths relative to the checkout in ccache's hashes: a fresh clone in another folder (CI's) reuses the
# objects of an earlier clone's build, the sanitizer build's included.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# ccache's hits and misses over one build, appended to the record (the report tells a warm run by them).
ccache_mark() { ccache --print-stats 2>/dev/null | awk '$1 ~ /^(direct_cache_hit|preprocessed_cache_hit|cache_miss)$/ {s[$1]=$2} END {printf "%d %d\n", s["direct_cache_hit"] + s["preprocessed_cache_hit"], s["cache_miss"]}'; }
build() {  # build NAME DIR [ninja args]
    local name=$1 dir=$2 before after since
    shift 2
    since=0
    [ -f "$dir/.ninja_log" ] && since=$(wc -l < "$dir/.ninja_log")
    before=$(ccache_mark || echo "0 0")
    cmake --build "$dir" -j"$jobs" "$@"
    after=$(ccache_mark || echo "0 0")
    read -r h0 m0 <<< "$before"; read -r h1 m1 <<< "$after"
    printf 'ccache\t%s\t%d\t%d\n' "$name" $((h1 - h0)) $((m1 - m0)) >> "$record"
    echo "ccache: $((h1 - h0)) hits, $((m1 - m0)) misses"
    python3 scripts/test_times.py build-report "$dir" --since "$since" --top 5
}

# ctest with the skipped tests counted and their reasons shown (a skip is never a pass); each test's
# time goes to the record.
run_ctest() {
    local name=$1 dir=$2 log
    log=$(mktemp)
    local rc=0
    ctest --test-dir "$dir" --output-on-failure -j"$jobs" 2>&1 | tee "$log" || rc=$?
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
    python3 scripts/test_times.py ctest-record "$name" "$log" "$record"
    local skipped
    # (sed -n, not grep: a run without skips must not end the script under set -e/pipefail)
    skipped=$(sed -n -E 's/^\s+[0-9]+ - (.*) \(Skipped\)$/\1/p' "$log")
    echo "skipped: $(printf '%s' "$skipped" | grep -c . || true) test(s)"
    for t in $skipped; do
        reason=$(awk -v t="$t" '$0 ~ "^[0-9]+/[0-9]+ Testing: "t"$" {on=1} on && /^SKIP/ {print; exit}' \
                 "$dir/Testing/Temporary/LastTest.log")
        echo "  $t: ${reason:-SKIP (no reason printed)}"
    done
    rm -f "$log"
    return $rc
}

report() {
    python3 scripts/test_times.py report "$record" scripts/test_budget.conf --top 10
}

begin "release build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
build release build
end "release build"
begin "release tests"
run_ctest release build || { report || true; exit 1; }
end "release tests"

if [ "$mode" = "--quick" ]; then
    report
    exit 0
fi

# -O1 and line tables only: clang compiles this build ~3x faster than GCC's -O2 -g did (the sanitizers'
# checks cost code generation at every inlined call), and ASan's reports still name file:line.
begin "sanitizer build"
san_flags="-O1 -gline-tables-only -DNDEBUG"
cmake -S . -B build-san -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$san_flags" \
      -DCMAKE_C_FLAGS_RELWITHDEBINFO="$san_flags" -DLATTICE_SANITIZE=ON -DLATTICE_FUZZ=ON \
      -DLATTICE_FUZZ_SECONDS="${LATTICE_FUZZ_SECONDS:-20}" -DLATTICE_CUDA=OFF -DLATTICE_BUILD_BENCHMARKS=OFF
build sanitizer build-san
end "sanitizer build"
begin "sanitizer tests"
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
run_ctest sanitizer build-san || { report || true; exit 1; }
end "sanitizer tests"

begin "fuzzers"
cmake --build build-san --target fuzz_all -j"$jobs"
end "fuzzers"

report
echo "test.sh: all stages passed"
