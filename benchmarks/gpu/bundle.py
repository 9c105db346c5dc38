#!/usr/bin/env python3
"""The binary bundle of benchmarks/gpu/check.sh: executables built for sm_90 on the development machine
(in the simulated bare GPU machine, benchmarks/gpu/simulate.sh --bundle) and carried to the GPU machine
in gpu-kit/bin/, so that its device minutes go to tests and benchmarks instead of a build.

  pack BUILD_DIR KIT_DIR SOURCE_ROOT   packs the check's executables out of BUILD_DIR (symbols stripped
                                       when `strip` exists) into KIT_DIR/bin/executables.tar.xz (66 MiB
                                       of binaries sharing the runtime compress to ~4 MiB in one xz
                                       stream), beside the listing of the CUDA tests (tests.json, from
                                       CTestTestfile.cmake) and sources.json: the SHA-256 of every
                                       build input of SOURCE_ROOT (the files that decide what the
                                       binaries are), the architecture and the build's compiler.
  targets BUILD_DIR                    prints the executables of the CUDA tests (label cuda) from the
                                       build folder's CTestTestfile.cmake files, one per line: what
                                       check.sh builds (ctest's JSON names a test's command only once
                                       its executable exists).
  verify KIT_DIR SOURCE_ROOT DEST      exit 0 when the bundle matches the tree, its executables are
                                       unpacked into DEST (once per archive) and every one's shared
                                       libraries resolve (ldd, with LD_LIBRARY_PATH as given);
                                       otherwise exit 1 and one line saying why (the first changed,
                                       added or removed source; a library not found). check.sh then
                                       builds on the GPU machine instead.

Build inputs: every file under base/ kernels/ runtime/ parallel/ launch/ tests/ benchmarks/ whose name
ends in .cpp .h .hpp .cu .cuh .inc .cmake .in or is CMakeLists.txt, and the top CMakeLists.txt and
cmake/ folder. Standard library only.
"""
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

ROOTS = ("base", "kernels", "runtime", "parallel", "launch", "tests", "benchmarks", "cmake")
SUFFIXES = (".cpp", ".h", ".hpp", ".cu", ".cuh", ".inc", ".cmake", ".in")
EXECUTABLES = ("bench_gpu_gemm", "bench_gpu_decode", "bench_gpu_attention", "lattice")
ARCHIVE = "executables.tar.xz"


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


def ctest_listing(build, label="cuda"):
    """The tests carrying `label`, read from the build folder's CTestTestfile.cmake files, in the shape of
    `ctest --show-only=json-v1` ({"tests": [{"name", "command", "properties": [LABELS, ENVIRONMENT]}]}),
    which names a command only where its executable exists on this machine (not so for a build made
    in the simulated root and read from outside it)."""
    cmds, props = {}, {}
    for d, _, names in os.walk(build):
        if "CTestTestfile.cmake" not in names:
            continue
        for line in open(os.path.join(d, "CTestTestfile.cmake"), errors="replace"):
            m = re.match(r"add_test\(\[=\[(.+?)\]=\] (.*)\)\s*$", line)
            if m:
                cmds[m.group(1)] = [a.replace('\\"', '"') for a in re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(2))]
            m = re.match(r"set_tests_properties\(\[=\[(.+?)\]=\] PROPERTIES (.*)\)\s*$", line)
            if m:
                p = {}
                for key in ("LABELS", "ENVIRONMENT"):
                    v = re.search(key + r' "([^"]*)"', m.group(2))
                    p[key] = v.group(1).split(";") if v else []
                props[m.group(1)] = p
    tests = []
    for name, cmd in cmds.items():
        p = props.get(name, {"LABELS": [], "ENVIRONMENT": []})
        if label in p["LABELS"]:
            tests.append({"name": name, "command": cmd,
                          "properties": [{"name": k, "value": v} for k, v in p.items()]})
    return {"kind": "ctestInfo", "source": "bundle.py (CTestTestfile.cmake)", "tests": tests}


def cuda_test_executables(build, label="cuda"):
    """{test name: executable path} of the tests carrying `label`."""
    return {t["name"]: t["command"][0] for t in ctest_listing(build, label)["tests"] if t["command"]}


def pack(build, kit, root):
    out = os.path.join(kit, "bin")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    listing = ctest_listing(build)
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
    raw = 0
    with tempfile.TemporaryDirectory() as tmp:
        for n, p in sorted(found.items()):
            shutil.copy2(p, os.path.join(tmp, n))
            if strip:
                subprocess.run([strip, "--strip-unneeded", os.path.join(tmp, n)], check=False,
                               stderr=subprocess.DEVNULL)  # a script (the dry run's fakes) is not an ELF
            raw += os.path.getsize(os.path.join(tmp, n))
        # One xz stream with a 64 MiB dictionary: the binaries share most of their code (each links
        # the runtime), so together they compress ~16x, 66 MiB to 4.
        with tarfile.open(os.path.join(out, ARCHIVE), "w:xz", preset=9 | lzma.PRESET_EXTREME) as tar:
            for n in sorted(found):
                tar.add(os.path.join(tmp, n), arcname=n)
    with open(os.path.join(out, "tests.json"), "w") as f:
        json.dump(listing, f, indent=1)
    files = build_inputs(root)
    doc = {"cuda_architectures": cmake_cache(build, "CMAKE_CUDA_ARCHITECTURES"),
           "cxx": cmake_cache(build, "CMAKE_CXX_COMPILER"),
           "nvcc": cmake_cache(build, "CMAKE_CUDA_COMPILER"),
           "executables": sorted(found),
           "archive_sha256": digest(out, ARCHIVE),
           "sources": {rel: digest(root, rel) for rel in files}}
    with open(os.path.join(out, "sources.json"), "w") as f:
        json.dump(doc, f, indent=1)
    size = os.path.getsize(os.path.join(out, ARCHIVE))
    print(f"bundle: {len(found)} executables for sm_{doc['cuda_architectures']} ({raw / 1048576:.1f} MiB stripped, "
          f"{size / 1048576:.1f} MiB in {ARCHIVE}), {len(files)} sources hashed, in {out}")


def verify(kit, root, dest):
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
    if digest(out, ARCHIVE) != doc["archive_sha256"]:
        print(f"{ARCHIVE} does not match its sources.json (a partial copy?)")
        return 1
    stamp = os.path.join(dest, ".archive_sha256")
    if not (os.path.exists(stamp) and open(stamp).read() == doc["archive_sha256"]):
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest)
        with tarfile.open(os.path.join(out, ARCHIVE), "r:xz") as tar:
            for m in tar.getmembers():  # plain files with plain names only
                if not m.isfile() or "/" in m.name or m.name.startswith("."):
                    print(f"{ARCHIVE}: unexpected member {m.name!r}")
                    return 1
            try:
                tar.extractall(dest, filter="data")
            except TypeError:  # Python before 3.11.4 / 3.12: no extraction filters (members checked above)
                tar.extractall(dest)
        open(stamp, "w").write(doc["archive_sha256"])
    ldd = shutil.which("ldd")
    for n in doc["executables"]:
        p = os.path.join(dest, n)
        if not os.access(p, os.X_OK):
            print(f"{n} is missing or not executable")
            return 1
        if ldd:
            r = subprocess.run([ldd, p], capture_output=True, text=True)
            bad = [line.strip() for line in (r.stdout + r.stderr).split("\n") if "not found" in line]
            static = "not a dynamic executable" in r.stdout + r.stderr  # static, or a script (the dry run's fakes)
            if (r.returncode != 0 and not static) or bad:
                print(f"{n} does not load: {(bad or [r.stderr.strip()])[0]}")
                return 1
    print(f"{len(doc['executables'])} executables for sm_{doc['cuda_architectures']} match the tree "
          f"({len(want)} sources) and load{'' if ldd else ' (no ldd: not checked)'}")
    return 0


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "pack":
        pack(*sys.argv[2:])
        return 0
    if len(sys.argv) == 3 and sys.argv[1] == "targets":
        names = sorted({os.path.basename(p) for p in cuda_test_executables(sys.argv[2]).values()})
        print("\n".join(n for n in names if n not in ("mpiexec", "mpirun")))
        return 0
    if len(sys.argv) == 5 and sys.argv[1] == "verify":
        return verify(*sys.argv[2:])
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
