#!/usr/bin/env bash
# Fills gpu-kit/ (git-ignored, at the repository root) with everything benchmarks/gpu/check.sh needs
# on a bare GPU machine that gets only the working tree: nvcc, CMake, ninja, a host compiler and
# Python there, but no fmt, nlohmann-json, CLI11, doctest, MPI, NCCL headers or package registry,
# and no ../shared. Runs here, on the development machine; the device tool then carries the folder
# (carry ["gpu-kit"]). Fails when the kit reaches 50 MiB (the working tree may be 64 MiB in all).
#
#   gpu-kit/include/{fmt,nlohmann,CLI,doctest}  headers of the Debian -dev packages (apt-get download
#                                              + dpkg -x; the installed package's files if the
#                                              registry is unreachable); fmt is used header-only
#   gpu-kit/nccl/include/                      nccl.h (+ nccl_device*) of PyPI's nvidia-nccl-cu13 wheel
#                                              (NCCL_WHEEL_VERSION, default 2.28.9, the version of this
#                                              machine's toolkit NCCL that the simulation's stand-in wheel
#                                              library is), for a GPU machine whose wheel lacks include/;
#                                              check.sh prefers the header of the wheel installed there,
#                                              beside its library. The toolkit's nccl.h only when the
#                                              registry is unreachable (said in MANIFEST)
#   gpu-kit/shared/golden/                     copy of ../shared/golden (the golden checkpoints)
#   gpu-kit/MANIFEST                           what came from where, with versions
#   gpu-kit/bin/                               (only from simulate.sh --bundle: executables for sm_90)
# Usage: benchmarks/gpu/prepare.sh [KIT_DIR]   (env: SHARED_DIR, CUDA_HOME, NCCL_WHEEL_VERSION,
#        LATTICE_KIT_CACHE: where the downloaded wheel is kept, default ~/.cache/lattice-gpu-kit;
#        LATTICE_KIT_PIP: the pip command, default "python3 -m pip"; tests/gpu/test_prepare.py puts a stub
#        there that writes a small wheel, so the empty-cache path is tested without the ~190 MiB download)
# On a fresh machine the wheel is not cached: it is downloaded (said first, with the size to expect);
# when that fails the toolkit's nccl.h is used and MANIFEST says so. Every way this script can stop
# says why on stderr (die, or the ERR trap naming the line and command), never a bare exit status.
set -eEuo pipefail
trap 'echo "prepare.sh: line $LINENO: \"$BASH_COMMAND\" failed (exit $?)" >&2' ERR
shopt -s nullglob

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
kit="${1:-$root/gpu-kit}"
shared="${SHARED_DIR:-$root/../shared}"
cuda="${CUDA_HOME:-/usr/local/cuda}"
nccl_wheel_version="${NCCL_WHEEL_VERSION:-2.28.9}"
cache="${LATTICE_KIT_CACHE:-$HOME/.cache/lattice-gpu-kit}"
limit_mib=50
# Debian package -> the folder of /usr/include it provides.
packages=(libfmt-dev:fmt nlohmann-json3-dev:nlohmann libcli11-dev:CLI doctest-dev:doctest)

die() { echo "prepare.sh: $*" >&2; exit 1; }

rm -rf "$kit"
mkdir -p "$kit/include" "$kit/nccl/include" "$kit/shared"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
manifest="$kit/MANIFEST"
{
    echo "gpu-kit for lattice benchmarks/gpu/check.sh, made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
    echo "by benchmarks/gpu/prepare.sh at commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
} >"$manifest"

for entry in "${packages[@]}"; do
    pkg="${entry%%:*}"
    dir="${entry##*:}"
    how=""
    if (cd "$tmp" && apt-get download -q "$pkg" >/dev/null 2>&1); then
        debs=("$tmp"/"${pkg}"_*.deb)
        (( ${#debs[@]} )) || die "apt-get download $pkg succeeded but left no ${pkg}_*.deb"
        deb="${debs[0]}"
        dpkg -x "$deb" "$tmp/x-$pkg"
        [[ -d "$tmp/x-$pkg/usr/include/$dir" ]] || die "$deb has no usr/include/$dir"
        cp -a "$tmp/x-$pkg/usr/include/$dir" "$kit/include/"
        how="$(basename "$deb") (apt-get download + dpkg -x)"
    elif dpkg -s "$pkg" >/dev/null 2>&1 && [[ -d "/usr/include/$dir" ]]; then
        cp -a "/usr/include/$dir" "$kit/include/"
        how="$pkg $(dpkg-query -W -f='${Version}' "$pkg") (installed files; registry unreachable)"
    else
        die "cannot get $pkg: apt-get download failed and it is not installed"
    fi
    echo "include/$dir: $how" >>"$manifest"
    echo "  include/$dir <- $how"
done
[[ -f "$kit/include/fmt/format-inl.h" ]] || die "fmt headers lack format-inl.h (needed header-only)"

# NCCL header: from the nvidia-nccl-cu13 wheel (pip download, cached); the toolkit's if that fails.
# (Globs with nullglob, never `ls | head`: under pipefail an empty cache must not end the script.)
mkdir -p "$cache" || die "cannot create the wheel cache $cache (set LATTICE_KIT_CACHE)"
cached_wheel() {
    local w=("$cache"/nvidia_nccl_cu13-"$nccl_wheel_version"-*.whl)
    (( ${#w[@]} )) && echo "${w[0]}"
    return 0
}
whl="$(cached_wheel)"
if [[ -z "$whl" ]]; then
    read -r -a pip_cmd <<<"${LATTICE_KIT_PIP:-python3 -m pip}"
    echo "  nvidia-nccl-cu13 $nccl_wheel_version is not in $cache: downloading it (${pip_cmd[*]} download; ~190 MiB, once)"
    if ! "${pip_cmd[@]}" download -q --no-deps --only-binary=:all: --platform manylinux_2_18_x86_64 \
        --python-version 3.12 --implementation cp "nvidia-nccl-cu13==$nccl_wheel_version" -d "$cache" \
        >"$tmp/pip.log" 2>&1; then
        echo "  the download failed (the toolkit's nccl.h instead); pip said:" >&2
        tail -5 "$tmp/pip.log" | sed 's/^/    /' >&2
    fi
    whl="$(cached_wheel)"
    [[ -n "$whl" ]] || echo "  no nvidia_nccl_cu13-$nccl_wheel_version-*.whl in $cache after the download" >&2
fi
if [[ -n "$whl" ]] && python3 - "$whl" "$kit/nccl/include" <<'PY'
import os, sys, zipfile
whl, dst = sys.argv[1:]
prefix = "nvidia/nccl/include/"
n = 0
with zipfile.ZipFile(whl) as z:
    for info in z.infolist():
        if info.filename.startswith(prefix) and not info.is_dir():
            path = os.path.join(dst, info.filename[len(prefix):])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(z.read(info))
            n += 1
sys.exit(0 if n and os.path.exists(os.path.join(dst, "nccl.h")) else 1)
PY
then
    nccl_from="$(basename "$whl") (pip download; the header of that wheel)"
else
    nccl_h=""
    for d in "$cuda/include" /usr/include /usr/local/include; do
        [[ -f "$d/nccl.h" ]] && { nccl_h="$d"; break; }
    done
    [[ -n "$nccl_h" ]] || die "no nvidia-nccl-cu13 wheel and no nccl.h under $cuda/include, /usr/include or /usr/local/include"
    cp -a "$nccl_h/nccl.h" "$kit/nccl/include/"
    [[ -f "$nccl_h/nccl_device.h" ]] && cp -a "$nccl_h/nccl_device.h" "$kit/nccl/include/"
    [[ -d "$nccl_h/nccl_device" ]] && cp -a "$nccl_h/nccl_device" "$kit/nccl/include/"
    nccl_from="$(readlink -f "$nccl_h") (registry unreachable: the toolkit's header)"
fi
nccl_ver="$(awk '/define NCCL_(MAJOR|MINOR|PATCH) /{v=v (v?".":"") $3} END{print v}' "$kit/nccl/include/nccl.h")"
echo "nccl/include: nccl.h $nccl_ver from $nccl_from" >>"$manifest"
echo "  nccl/include <- nccl.h $nccl_ver from $nccl_from"

# Golden data (tests read LATTICE_SHARED_DIR/golden; check.sh points it here).
[[ -d "$shared/golden" ]] || die "no golden data at $shared/golden (set SHARED_DIR)"
cp -a "$shared/golden" "$kit/shared/"
chmod -R u+w "$kit/shared"
echo "shared/golden: copy of $(readlink -f "$shared/golden")" >>"$manifest"
echo "  shared/golden <- $shared/golden"

bytes="$(du -sb "$kit" | cut -f1)"
mib="$(awk -v b="$bytes" 'BEGIN{printf "%.1f", b / 1048576}')"
files="$(find "$kit" -type f | wc -l)"
echo "total: $bytes bytes ($mib MiB), $files files" >>"$manifest"
echo "gpu-kit: $kit: $mib MiB in $files files (limit ${limit_mib} MiB)"
if (( bytes >= limit_mib * 1048576 )); then
    die "the kit is $mib MiB, not under ${limit_mib} MiB"
fi
