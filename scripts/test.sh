#!/usr/bin/env bash
# Sets up everything and runs the whole test suite, exactly as CI does (.ci/run calls this):
#   1. Release build (CPU backend; the CUDA backend is compiled too when nvcc exists) + every test
#      (unit, mpi, slow; CUDA tests are reported skipped without a GPU, counted, with the reason).
#   2. The same suite under AddressSanitizer + UndefinedBehaviorSanitizer (CPU build only).
#   3. Each libFuzzer target for a bounded time (LATTICE_FUZZ_SECONDS, default 20).
# Usage: scripts/test.sh [--quick]   (--quick: step 1 only)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --bench   # --bench: matplotlib for the benchmarks_run_py plot test
jobs=${LATTICE_JOBS:-$(nproc)}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/lattice-ccache}
# Paths relative to the checkout in ccache's hashes: a fresh clone in another folder (CI's) reuses the
# objects of an earlier clone's build, the -g ones of the sanitizer build included.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# ctest with the skipped tests counted and their reasons shown (a skip is never a pass).
run_ctest() {
    local dir=$1 log
    log=$(mktemp)
    local rc=0
    ctest --test-dir "$dir" --output-on-failure -j"$jobs" 2>&1 | tee "$log" || rc=$?
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
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

echo "== build (Release) =="
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs"
echo "== tests (Release) =="
run_ctest build

[ "${1:-}" = "--quick" ] && exit 0

echo "== build (ASan + UBSan, CPU only) =="
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLATTICE_SANITIZE=ON -DLATTICE_CUDA=OFF \
      -DLATTICE_BUILD_BENCHMARKS=OFF
cmake --build build-asan -j"$jobs"
echo "== tests (ASan + UBSan) =="
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
run_ctest build-asan

echo "== fuzzers (${LATTICE_FUZZ_SECONDS:-20} s each) =="
cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DLATTICE_FUZZ=ON \
      -DLATTICE_CUDA=OFF -DLATTICE_BUILD_BENCHMARKS=OFF -DLATTICE_FUZZ_SECONDS="${LATTICE_FUZZ_SECONDS:-20}"
cmake --build build-fuzz --target fuzz_all -j"$jobs"
echo "test.sh: all stages passed"
