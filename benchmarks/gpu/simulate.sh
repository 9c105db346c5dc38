#!/usr/bin/env bash
# Proves benchmarks/gpu/check.sh on a simulated bare GPU machine, without a GPU: a minimal Debian
# root (debootstrap --variant=minbase) holding only a compiler, CMake, ninja and Python 3 (no fmt,
# nlohmann-json, CLI11, doctest, MPI or NCCL packages), with this machine's /usr/local/cuda bound
# in read-only and its NCCL files hidden (the GPU machine's toolkit has none), and a stand-in for
# PyTorch's nvidia-nccl wheel (site-packages/nvidia/nccl/lib/libnccl.so.2 only, no header). It
# copies what the device tool would send (tracked + untracked-not-ignored files of the working tree
# plus the carried gpu-kit/; never ../shared), runs check.sh there with no NVIDIA driver, and checks
# the outcome: configure and build pass, every GPU step reports SKIP (no GPU), nothing FAILs, and
# $OUT holds at most 8 plain files with names the device tool returns.
#
# --inject runs the check with LATTICE_TEST_INJECT=fail:test_cuda_sampling,hang:test_cuda_ops (the test
# main fails, or hangs until killed, in those two binaries) and a short per-test timeout, and checks
# instead that the tests step FAILs naming exactly those two (FAIL and TIMEOUT), that both were rerun
# case by case, that every other test binary still ran (SKIP: no GPU) and every later step still ran.
# --bundle, after a passing run, packs the root's executables (built for sm_90 in the bare root, the
# closest thing here to the GPU machine) into gpu-kit/bin (bundle.py pack), then runs the device's two
# calls, `check.sh 1` and `check.sh 2`, on a fresh copy to prove that they take them (the bundle step
# PASSes; nothing is configured or built) and says the bundle's size and each stage's wall time there.
# The first run is `check.sh all` (it builds: there is no bundle yet).
#
# The root is cached outside the repository (default /var/cache/lattice-gpu-sim/<suite>), so reruns
# start in seconds; --fresh rebuilds it. Needs root (debootstrap, chroot, mount namespaces).
# This machine has 2 cores, not the GPU machine's 16: deadlines are stretched by CHECK_TIME_SCALE
# (default 12 here) so the simulation shows function, not the 8-minute budget (see docs/gpu-check.md
# for the build-time estimate on 16 cores).
# Usage: benchmarks/gpu/simulate.sh [--suite bookworm] [--fresh] [--keep-build] [--results DIR] [--inject]
#        [--bundle]
#        --keep-build keeps the previous run's build-gpu-check/ (as a warm device machine does
#        between calls) for quick iteration; without it every run builds from nothing.
#        (runs benchmarks/gpu/prepare.sh first when gpu-kit/ is missing)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
suite=bookworm
fresh=0
keep_build=0
inject=0
bundle=0
results="$root/gpu-sim-results"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
cuda_host="$(readlink -f "${CUDA_HOME:-/usr/local/cuda}")"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --suite) suite="$2"; shift 2 ;;
        --fresh) fresh=1; shift ;;
        --keep-build) keep_build=1; shift ;;
        --results) results="$2"; shift 2 ;;
        --inject) inject=1; shift ;;
        --bundle) bundle=1; shift ;;
        *) echo "usage: $0 [--suite bookworm] [--fresh] [--keep-build] [--results DIR] [--inject] [--bundle]" >&2; exit 2 ;;
    esac
done
cache="${LATTICE_SIM_CACHE:-/var/cache/lattice-gpu-sim}/$suite"
sysroot="$cache/root"
t0=$(date +%s)
say() { printf '[simulate %4ss] %s\n' "$(( $(date +%s) - t0 ))" "$*"; }
die() { echo "simulate.sh: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap, chroot, mount)"

# 1. The bare root: a compiler, CMake, ninja, Python 3 and nothing else of ours.
if [[ $fresh -eq 1 || ! -f "$sysroot/.lattice-sim-ready" ]]; then
    command -v debootstrap >/dev/null || apt-get install -y debootstrap >/dev/null
    rm -rf "$sysroot"
    mkdir -p "$cache"
    say "debootstrap --variant=minbase $suite (+ g++ cmake ninja-build python3) into $sysroot"
    debootstrap --variant=minbase --include=g++,cmake,ninja-build,python3 "$suite" "$sysroot" "$mirror" \
        >"$cache/debootstrap.log" 2>&1 || { tail -20 "$cache/debootstrap.log"; die "debootstrap failed"; }
    touch "$sysroot/.lattice-sim-ready"
fi
for banned in fmt nlohmann CLI doctest mpi.h nccl.h; do
    [[ ! -e "$sysroot/usr/include/$banned" ]] || die "$sysroot has /usr/include/$banned: not a bare root"
done
say "root $sysroot: $(chroot "$sysroot" sh -c 'g++ --version | head -1; cmake --version | head -1; echo ninja $(ninja --version); python3 --version' | paste -sd ';' -)"

# 2. The stand-in for PyTorch's nvidia-nccl wheel, found through Python: this machine's libnccl.so.2
# and, as the real wheel has, include/ (the kit's header, from the PyPI wheel of the same version).
pyver="$(chroot "$sysroot" python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
[[ -d "$root/gpu-kit" ]] || { say "no gpu-kit/: running prepare.sh"; bash "$here/prepare.sh"; }
wheel="$sysroot/usr/local/lib/python$pyver/dist-packages/nvidia/nccl"
if [[ ! -f "$wheel/lib/libnccl.so.2" ]]; then
    mkdir -p "$wheel/lib"
    nccl_lib="$(readlink -f "$cuda_host/lib64/libnccl.so.2" 2>/dev/null || true)"
    [[ -f "$nccl_lib" ]] || nccl_lib="$(ldconfig -p | awk '/libnccl.so.2 /{print $NF; exit}')"
    [[ -f "$nccl_lib" ]] || die "no libnccl.so.2 on this machine to stand in for the wheel"
    ln "$nccl_lib" "$wheel/lib/libnccl.so.2" 2>/dev/null || cp "$nccl_lib" "$wheel/lib/libnccl.so.2"
fi
rm -rf "$wheel/include"
cp -a "$root/gpu-kit/nccl/include" "$wheel/include"

# 3. What the device tool sends: tracked + untracked-not-ignored files, plus the carried kit.
# copy_tree KEEP_BUILD: a fresh copy in $tree; KEEP_BUILD=1 keeps build-gpu-check/ (a warm machine).
tree="$sysroot/work/lattice"
copy_tree() {
    if [[ $1 -eq 0 ]]; then
        rm -rf "$sysroot/work/build-kept"
    elif [[ -d "$tree/build-gpu-check" ]]; then
        rm -rf "$sysroot/work/build-kept"
        mv "$tree/build-gpu-check" "$sysroot/work/build-kept"
    fi
    rm -rf "$tree"
    mkdir -p "$tree"
    (cd "$root" && git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
        [[ -e "$f" || -L "$f" ]] && printf '%s\0' "$f"; done | tar --null -T - -cf - | tar -xf - -C "$tree")
    cp -a "$root/gpu-kit" "$tree/gpu-kit"
    local sent
    sent=$(du -sb "$tree" | cut -f1)
    say "working tree + gpu-kit copied: $(awk -v b="$sent" 'BEGIN{printf "%.1f MiB", b/1048576}') (device tool limit 64 MiB)"
    (( sent < 64 * 1048576 )) || die "what would travel is over 64 MiB"
    [[ ! -e "$sysroot/work/shared" ]] || die "../shared must not exist in the simulated machine"
    [[ -d "$sysroot/work/build-kept" ]] && mv "$sysroot/work/build-kept" "$tree/build-gpu-check"
    return 0
}

# 4. Run check.sh in the root: private mount namespace (mounts vanish with it), CUDA bound in
# read-only with NCCL hidden by an overlay whiteout layer, no NVIDIA driver, a clean environment.
# run_check LOG [VAR=VALUE ...]: extra environment for check.sh; sets $rc.
mkdir -p "$cache/hide-nccl/include" "$cache/hide-nccl/lib" "$sysroot/usr/local/cuda-sim"
# (lib64 is a link to lib in this toolkit: whiteouts go into lib only, a lib64 folder would hide it.)
for f in include/nccl.h include/nccl_device.h include/nccl_device lib/libnccl.so lib/libnccl.so.2 lib/libnccl_static.a; do
    [[ -e "$cuda_host/$f" && ! -e "$cache/hide-nccl/$f" ]] && mknod "$cache/hide-nccl/$f" c 0 0
done
ln -sfn cuda-sim "$sysroot/usr/local/cuda"
export CHECK_TIME_SCALE="${CHECK_TIME_SCALE:-12}"
run_check() {  # run_check STAGE LOG [VAR=VALUE ...]
    local stage=$1 log=$2; shift 2
    rm -rf "$sysroot/out"
    mkdir -p "$sysroot/out"
    say "check.sh $stage in the root (no GPU, CHECK_TIME_SCALE=$CHECK_TIME_SCALE, JOBS=$(nproc)${*:+, $*})"
    local t_run; t_run=$(date +%s)
    set +e
    unshare --mount --propagation private bash -euo pipefail -c '
        sysroot=$1 cuda=$2 hide=$3; shift 3
        mount -t overlay overlay -o "ro,lowerdir=$hide:$cuda" "$sysroot/usr/local/cuda-sim" 2>/dev/null ||
            { echo "overlay not possible: plain read-only bind (NCCL of the toolkit visible)"; mount --bind -o ro "$cuda" "$sysroot/usr/local/cuda-sim"; }
        mount -t proc proc "$sysroot/proc"
        mount --rbind /dev "$sysroot/dev"
        mount -t tmpfs tmpfs "$sysroot/tmp"
        exec chroot "$sysroot" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 \
            OUT=/out CHECK_TIME_SCALE="$CHECK_TIME_SCALE" "$@" bash -c "cd /work/lattice && bash benchmarks/gpu/check.sh \$STAGE"
    ' _ "$sysroot" "$cuda_host" "$cache/hide-nccl" "$@" STAGE="$stage" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    set -e
    say "check.sh $stage exited $rc after $(( $(date +%s) - t_run )) s"
}

# 5. What came back, and whether it is what a machine without a GPU must show.
# verify MODE (plain | inject | bundle): copies $OUT to $results, prints the verdict, returns 0/1.
verify() {
    rm -rf "$results"
    mkdir -p "$results"
    cp -a "$sysroot/out/." "$results/"
    local nfiles bad_names ok=1
    nfiles=$(find "$results" -type f | wc -l)
    bad_names=$(find "$results" -mindepth 1 | sed "s|^$results/||" | grep -Ev '^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)?$' || true)
    say "\$OUT: $nfiles files: $(cd "$results" && find . -type f | sed 's|^\./||' | sort | paste -sd ' ' -)"
    (( nfiles <= 8 )) || { echo "FAIL: $nfiles files in \$OUT (at most 8)"; ok=0; }
    [[ -z "$bad_names" ]] || { echo "FAIL: names the device tool would not return: $bad_names"; ok=0; }
    python3 - "$results/summary.json" "$1" <<'PY' || ok=0
import json, sys
doc = json.load(open(sys.argv[1]))
mode = sys.argv[2]
steps = {s["name"]: s for s in doc["steps"]}
bad = []
order = {"1": ["env", "bundle", "tests", "sanitize", "gpu-after"],
         "2": ["env", "bundle", "gemm", "attention", "decode", "e2e", "gpu-after"]}.get(
    str(doc.get("stage")), ["env", "bundle", "configure", "build", "tests", "sanitize", "gemm", "attention", "decode",
                            "e2e", "gpu-after"])
bundle_used = steps.get("bundle", {}).get("status") == "PASS"
if mode == "bundle" and not bundle_used:
    bad.append(f"bundle is {steps.get('bundle', {}).get('status')}, not PASS: {steps.get('bundle', {}).get('note')}")
if bundle_used:  # the carried executables: nothing configured or built
    order = [n for n in order if n not in ("configure", "build")]
    for name in ("configure", "build"):
        if name in steps:
            bad.append(f"{name} ran although the bundle was used")
else:
    for name in ("configure", "build"):
        if steps.get(name, {}).get("status") != "PASS":
            bad.append(f"{name} is {steps.get(name, {}).get('status')}, not PASS")
for name in order:
    if name not in steps:
        bad.append(f"step {name} did not run")
tests = doc.get("tests") or {}
runs = {r["name"]: r for r in tests.get("runs", [])}
if not runs and "tests" in order:
    bad.append("no test binary ran")
for s in doc["steps"]:
    if mode == "inject" and s["name"] in ("tests", "diagnose"):
        continue
    if s["status"] in ("FAIL", "TIMEOUT"):
        bad.append(f"{s['name']} {s['status']}: {s.get('note', '')}")
    if s.get("needs_gpu") and s["status"] != "SKIP":
        bad.append(f"{s['name']} needs a GPU but is {s['status']}, not SKIP")
if mode == "inject":
    want = {"test_cuda_sampling": "FAIL", "test_cuda_ops": "TIMEOUT"}
    if steps.get("tests", {}).get("status") != "FAIL":
        bad.append(f"tests is {steps.get('tests', {}).get('status')}, not FAIL")
    for name, status in want.items():
        r = runs.get(name)
        if not r or r["status"] != status:
            bad.append(f"{name} is {r and r['status']}, not {status}")
        elif (r.get("diagnosis") or {}).get("rerun", {}).get("status") != status or \
                r["diagnosis"]["seed"] != r["seed"]:
            bad.append(f"{name} was not rerun alone with its seed {r.get('seed')} ({r.get('diagnosis')})")
    others = [r for n, r in runs.items() if n not in want]
    if not others or any(r["status"] != "SKIP" for r in others):
        bad.append("the other test binaries did not all run (SKIP): " + ", ".join(f"{n} {r['status']}" for n, r in runs.items()))
    print("injected: " + "; ".join(f"{n} {runs[n]['status']} (seed {runs[n].get('seed')}), rerun with it: " +
          str(((runs[n].get("diagnosis") or {}).get("rerun") or {}).get("status")) for n in want if n in runs))
if doc.get("gpu"):
    bad.append(f"a GPU was seen: {doc['gpu']}")
for b in bad:
    print("FAIL:", b)
print(f"simulation verdict ({mode}):", "PASS" if not bad else "FAIL")
sys.exit(1 if bad else 0)
PY
    [[ $ok -eq 1 ]]
}

copy_tree "$keep_build"
if [[ $inject -eq 1 ]]; then
    run_check all "$cache/check-run.log" LATTICE_TEST_INJECT=fail:test_cuda_sampling,hang:test_cuda_ops CHECK_TEST_TIMEOUT=3
    cp "$cache/check-run.log" "$results.log"
    verify inject || die "the injected run did not show what it should (check.sh rc $rc)"
    [[ $rc -eq 1 ]] || die "check.sh exited $rc with an injected failure, not 1"
else
    run_check all "$cache/check-run.log"
    cp "$cache/check-run.log" "$results.log"
    verify plain && [[ $rc -eq 0 ]] || die "the simulated run did not pass (check.sh rc $rc)"
fi
say "results in $results, check.sh's output in $results.log"
if [[ $bundle -eq 1 ]]; then
    python3 "$here/bundle.py" pack "$tree/build-gpu-check" "$root/gpu-kit" "$tree"  # the sources that were built
    copy_tree 1  # the build folder stays for later --keep-build runs; with the bundle check.sh builds nothing
    for st in 1 2; do  # the device's two calls
        t_st=$(date +%s)
        run_check "$st" "$cache/check-stage$st.log"
        cp "$cache/check-stage$st.log" "$results-stage$st.log"
        verify bundle && [[ $rc -eq 0 ]] || die "stage $st with the bundle did not pass (check.sh rc $rc)"
        say "stage $st took $(( $(date +%s) - t_st )) s here (no GPU: every GPU step SKIPs)"
    done
    say "bundle: $(du -sh "$root/gpu-kit/bin" | cut -f1) in $root/gpu-kit/bin, gpu-kit/ $(du -sh "$root/gpu-kit" | cut -f1) in all; both stages took it (logs: $results-stage1.log, $results-stage2.log)"
fi
