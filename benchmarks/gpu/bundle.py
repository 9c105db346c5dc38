#!/usr/bin/env python3
"""The binary bundle of benchmarks/gpu/check.sh: executables built for sm_90 on the development machine
(in the simulated bare GPU machine, benchmarks/gpu/simulate.sh --bundle) and carried to the GPU machine
in gpu-kit/bin/, so that its device minutes go to tests and benchmarks instead of a build.

  pack BUILD_DIR KIT_DIR SOURCE_ROOT   copies the check's executables out of BUILD_DIR into KIT_DIR/bin
                                       (symbols stripped when `strip` exists), the CTest listing of the
                                       CUDA tests (tests.json) and sources.json: the SHA-256 of every
                                       build input of SOURCE_ROOT (the files that decide what the
                                       binaries are), the architecture and the build's compiler.
  targets BUILD_DIR                    prints the executables of the CUDA tests (label cuda) from the
                                       build folder's CTestTestfile.cmake files, one per line: what
                                       check.sh builds (ctest's JSON names a test's command only once
                                       its executable exists).
  verify KIT_DIR SOURCE_ROOT           exit 0 when the bundle matches the tree and every executable's
                                       shared libraries resolve (ldd, with LD_LIBRARY_PATH as given);
                                       otherwise exit 1 and one line saying why (the first changed,
                                       added or removed source; a library not found). check.sh then
                                       builds on the GPU machine instead.

Build inputs: every file under base/ kernels/ runtime/ parallel/ launch/ tests/ benchmarks/ whose name
ends in .cpp .h .hpp .cu .cuh .inc .cmake .in or is CMakeLists.txt, and the top CMakeLists.txt and
cmake/ folder. Standard library only.
"""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

ROOTS = ("base", "kernels", "runtime", "parallel", "launch", "tests", "benchmarks", "cmake")
SUFFIXES = (".cpp", ".h", ".hpp", ".cu", ".cuh", ".inc", ".cmake", ".in")
EXECUTABLES = ("bench_gpu_gemm", "bench_gpu_decode", "bench_gpu_attention", "lattice")


def build_inputs(root):
    files = ["CMakeLists.txt"] if os.path.isfile(os.path.join(root, "CMakeLists.txt")) else []
    for top in ROOTS:
        for d, dirs, names in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(x for x in dirs if not x.startswith("."))
            for n in sorted(names):
                if n == "CMakeLists.txt" or n.endswith(SUFFIXES):
                    files.append(os.path.relpath(os.path.join(d, n), root))
    return sorted(files)


def digest(root, rel):
    h = hashlib.sha256()
    with open(os.path.join(root, rel), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cmake_cache(build, key):
    try:
        for line in open(os.path.join(build, "CMakeCache.txt")):
            if line.startswith(key + ":"):
                return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return ""


def cuda_test_executables(build, label="cuda"):
    """{test name: executable path} of the tests carrying `label`, read from CTestTestfile.cmake."""
    exes, labels = {}, {}
    for d, _, names in os.walk(build):
        if "CTestTestfile.cmake" not in names:
            continue
        for line in open(os.path.join(d, "CTestTestfile.cmake"), errors="replace"):
            m = re.match(r'add_test\(\[=\[(.+?)\]=\] "([^"]+)"', line)
            if m:
                exes[m.group(1)] = m.group(2)
            m = re.match(r'set_tests_properties\(\[=\[(.+?)\]=\] PROPERTIES .*LABELS "([^"]*)"', line)
            if m:
                labels[m.group(1)] = m.group(2).split(";")
    return {n: p for n, p in exes.items() if label in labels.get(n, [])}


def pack(build, kit, root):
    out = os.path.join(kit, "bin")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    listing = subprocess.run(["ctest", "-N", "-L", "cuda", "--show-only=json-v1"], cwd=build, check=True,
                             capture_output=True, text=True).stdout
    tests = json.loads(listing)
    unbuilt = [t["name"] for t in tests.get("tests", []) if not t.get("command")]
    if unbuilt:
        sys.exit(f"bundle.py pack: tests without a built executable in {build}: {' '.join(unbuilt)}")
    wanted = {os.path.basename(p) for p in cuda_test_executables(build).values()} | set(EXECUTABLES)
    found = {}
    for d, _, names in os.walk(build):
        for n in names:
            p = os.path.join(d, n)
            if n in wanted and os.access(p, os.X_OK) and os.path.isfile(p) and n not in found:
                found[n] = p
    missing = sorted(wanted - set(found) - {"mpiexec", "mpirun"})
    if missing:
        sys.exit(f"bundle.py pack: not built in {build}: {' '.join(missing)}")
    strip = shutil.which("strip")
    for n, p in sorted(found.items()):
        shutil.copy2(p, os.path.join(out, n))
        if strip:
            subprocess.run([strip, "--strip-unneeded", os.path.join(out, n)], check=False)
    with open(os.path.join(out, "tests.json"), "w") as f:
        f.write(listing)
    files = build_inputs(root)
    doc = {"cuda_architectures": cmake_cache(build, "CMAKE_CUDA_ARCHITECTURES"),
           "cxx": cmake_cache(build, "CMAKE_CXX_COMPILER"),
           "nvcc": cmake_cache(build, "CMAKE_CUDA_COMPILER"),
           "executables": sorted(found),
           "sources": {rel: digest(root, rel) for rel in files}}
    with open(os.path.join(out, "sources.json"), "w") as f:
        json.dump(doc, f, indent=1)
    size = sum(os.path.getsize(os.path.join(out, n)) for n in os.listdir(out))
    print(f"bundle: {len(found)} executables for sm_{doc['cuda_architectures']}, {len(files)} sources hashed, "
          f"{size / 1048576:.1f} MiB in {out}")


def verify(kit, root):
    out = os.path.join(kit, "bin")
    try:
        doc = json.load(open(os.path.join(out, "sources.json")))
    except (OSError, ValueError) as e:
        print(f"no bundle ({e.__class__.__name__})")
        return 1
    have = set(build_inputs(root))
    want = doc["sources"]
    for rel in sorted(have | set(want)):
        if rel not in want:
            print(f"stale: {rel} is new since the bundle was built")
            return 1
        if rel not in have:
            print(f"stale: {rel} was removed since the bundle was built")
            return 1
        if digest(root, rel) != want[rel]:
            print(f"stale: {rel} changed since the bundle was built")
            return 1
    ldd = shutil.which("ldd")
    for n in doc["executables"]:
        p = os.path.join(out, n)
        if not os.access(p, os.X_OK):
            print(f"{n} is missing or not executable")
            return 1
        if ldd:
            r = subprocess.run([ldd, p], capture_output=True, text=True)
            bad = [line.strip() for line in (r.stdout + r.stderr).split("\n") if "not found" in line]
            if r.returncode != 0 or bad:
                print(f"{n} does not load: {(bad or [r.stderr.strip()])[0]}")
                return 1
    print(f"{len(doc['executables'])} executables for sm_{doc['cuda_architectures']} match the tree "
          f"({len(want)} sources) and load")
    return 0


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "pack":
        pack(*sys.argv[2:])
        return 0
    if len(sys.argv) == 3 and sys.argv[1] == "targets":
        names = sorted({os.path.basename(p) for p in cuda_test_executables(sys.argv[2]).values()})
        print("\n".join(n for n in names if n not in ("mpiexec", "mpirun")))
        return 0
    if len(sys.argv) == 4 and sys.argv[1] == "verify":
        return verify(*sys.argv[2:])
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
