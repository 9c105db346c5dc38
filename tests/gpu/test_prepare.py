#!/usr/bin/env python3
"""benchmarks/gpu/prepare.sh on a fresh machine: an empty wheel cache, and every way it can stop.

The nvidia-nccl-cu13 wheel is ~190 MiB, so the download is stubbed: LATTICE_KIT_PIP points at a fake
pip that writes a small wheel (a zip holding nvidia/nccl/include/nccl.h, as the real one does) into
the `-d` folder, or fails with a message. apt-get is a failing stub on PATH (registry unreachable), so
the headers come from the installed -dev packages (the fallback the script documents); the golden data
is a tiny stand-in folder. Cases:
  1. empty cache, pip works: exit 0, the script says it is downloading, the kit's nccl.h is the
     wheel's (MANIFEST says so), the wheel is cached, and a second run downloads nothing;
  2. empty cache, pip fails: exit 0 with the toolkit's nccl.h, pip's words on stderr, MANIFEST says so;
  3. no golden data: exit 1 and a message naming it; an uncreatable cache: exit 1 and a message;
     never a silent exit (every non-zero exit has a 'prepare.sh:' line on stderr).
SKIP (77) where the -dev packages it falls back to are not installed (dpkg), as on a non-Debian host.
Usage: test_prepare.py SOURCE_DIR"""
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile

SKIP = 77
PACKAGES = ("libfmt-dev", "nlohmann-json3-dev", "libcli11-dev", "doctest-dev")
FAKE_PIP = """#!/usr/bin/env python3
import os, sys, zipfile
args = sys.argv[1:]
if os.environ.get("FAKE_PIP_FAIL"):
    print("ERROR: Could not find a version that satisfies the requirement (stub: no network)", file=sys.stderr)
    sys.exit(1)
assert args[0] == "download", args
dest = args[args.index("-d") + 1]
spec = [a for a in args if a.startswith("nvidia-nccl-cu13==")][0]
version = spec.split("==")[1]
major, minor, patch = version.split(".")
with open(os.path.join(os.path.dirname(dest), "pip-calls"), "a") as f:
    f.write(" ".join(args) + "\\n")
with zipfile.ZipFile(os.path.join(dest, f"nvidia_nccl_cu13-{version}-py3-none-manylinux_2_18_x86_64.whl"), "w") as z:
    z.writestr("nvidia/nccl/include/nccl.h",
               f"#define NCCL_MAJOR {major}\\n#define NCCL_MINOR {minor}\\n#define NCCL_PATCH {patch}\\n/* from the wheel */\\n")
    z.writestr("nvidia/nccl/lib/libnccl.so.2", "not a library")
"""


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def write_exe(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def run(script, kit, env):
    p = subprocess.run(["bash", script, kit], env=env, capture_output=True, text=True, timeout=100)
    print(f"--- exit {p.returncode}\n{p.stdout}{p.stderr}", end="")
    return p


def main():
    src = os.path.abspath(sys.argv[1])
    missing = [p for p in PACKAGES if subprocess.run(["dpkg", "-s", p], capture_output=True).returncode != 0] \
        if shutil.which("dpkg") else list(PACKAGES)
    if missing:
        print(f"SKIP: the installed -dev packages prepare.sh falls back to are missing: {' '.join(missing)}")
        return SKIP
    script = os.path.join(src, "benchmarks/gpu/prepare.sh")
    with tempfile.TemporaryDirectory() as tmp:
        bin_dir = os.path.join(tmp, "bin")
        os.makedirs(bin_dir)
        write_exe(os.path.join(bin_dir, "apt-get"), "#!/bin/sh\necho 'E: stub: no registry' >&2\nexit 100\n")
        write_exe(os.path.join(tmp, "pip"), FAKE_PIP)
        toolkit = os.path.join(tmp, "cuda")
        os.makedirs(os.path.join(toolkit, "include"))
        with open(os.path.join(toolkit, "include", "nccl.h"), "w") as f:
            f.write("#define NCCL_MAJOR 2\n#define NCCL_MINOR 27\n#define NCCL_PATCH 3\n/* toolkit */\n")
        shared = os.path.join(tmp, "shared")
        os.makedirs(os.path.join(shared, "golden", "tiny"))
        with open(os.path.join(shared, "golden", "tiny", "expected.json"), "w") as f:
            f.write("{}\n")
        cache = os.path.join(tmp, "cache", "wheels")  # does not exist yet: a fresh machine
        kit = os.path.join(tmp, "gpu-kit")
        env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"], LATTICE_KIT_CACHE=cache,
                   LATTICE_KIT_PIP=os.path.join(tmp, "pip"), CUDA_HOME=toolkit, SHARED_DIR=shared,
                   NCCL_WHEEL_VERSION="2.28.9", HOME=tmp)
        env.pop("FAKE_PIP_FAIL", None)

        # 1. Empty cache, the download works.
        p = run(script, kit, env)
        if p.returncode != 0:
            fail(f"empty cache with a working pip: exit {p.returncode}")
        if "is not in" not in p.stdout or "downloading" not in p.stdout:
            fail("prepare.sh did not say it was downloading the wheel")
        header = open(os.path.join(kit, "nccl/include/nccl.h")).read()
        if "from the wheel" not in header:
            fail("the kit's nccl.h is not the wheel's")
        manifest = open(os.path.join(kit, "MANIFEST")).read()
        if "nvidia_nccl_cu13-2.28.9" not in manifest or "2.28.9" not in manifest:
            fail(f"MANIFEST does not name the wheel and its header version:\n{manifest}")
        for d in ("fmt", "nlohmann", "CLI", "doctest"):
            if not os.path.isdir(os.path.join(kit, "include", d)):
                fail(f"include/{d} missing from the kit")
        if not os.path.isfile(os.path.join(kit, "shared/golden/tiny/expected.json")):
            fail("the golden data was not copied")
        calls = open(os.path.join(tmp, "cache", "pip-calls")).read().splitlines()
        if len(calls) != 1:
            fail(f"pip called {len(calls)} times, not once")
        # ... and the second run takes the cached wheel.
        p = run(script, kit, env)
        if p.returncode != 0 or "downloading" in p.stdout:
            fail("the second run did not take the cached wheel")
        if len(open(os.path.join(tmp, "cache", "pip-calls")).read().splitlines()) != 1:
            fail("the second run called pip again")

        # 2. Empty cache, the download fails: the toolkit's header, and why.
        env2 = dict(env, LATTICE_KIT_CACHE=os.path.join(tmp, "cache2"), FAKE_PIP_FAIL="1")
        p = run(script, kit, env2)
        if p.returncode != 0:
            fail(f"a failed download should fall back to the toolkit's header, exit {p.returncode}")
        if "the download failed" not in p.stderr or "Could not find a version" not in p.stderr:
            fail("prepare.sh did not say why the download failed")
        if "toolkit" not in open(os.path.join(kit, "nccl/include/nccl.h")).read():
            fail("the kit's nccl.h is not the toolkit's")
        if "the toolkit's header" not in open(os.path.join(kit, "MANIFEST")).read():
            fail("MANIFEST does not say the header is the toolkit's")

        # 3. Where it cannot: non-zero, and a line saying why.
        for what, bad_env, words in (
                ("no golden data", dict(env, SHARED_DIR=os.path.join(tmp, "nowhere")), "no golden data"),
                ("an uncreatable cache", dict(env, LATTICE_KIT_CACHE="/proc/lattice-no-such/cache"), "cache")):
            p = run(script, kit, bad_env)
            if p.returncode == 0:
                fail(f"{what}: exit 0")
            said = [line for line in p.stderr.splitlines() if line.startswith("prepare.sh:")]
            if not said or not any(words in line for line in said):
                fail(f"{what}: no 'prepare.sh: ...{words}...' line on stderr (a silent exit)")
    print("PASS: prepare.sh on an empty cache (download stubbed), with a failed download, and where it cannot")
    return 0


if __name__ == "__main__":
    sys.exit(main())
