#!/usr/bin/env python3
"""The shell commands of README.md and of every page under docs/ (subfolders included) run as written.

Every line of every ```sh block is a command (a trailing backslash joins the next line). Each runs
with bash, in order, in one temporary folder that stands in for the repository root: its entries
link to the checkout's (models/, launch/, README.md ...), build/launch/lattice to the build's
executable, and a
folder holding a `lattice` link leads PATH. Nothing else in the command is changed. Each command
has a hang guard (a timeout) and must exit 0.

A command that cannot run here carries the reason in the document itself, in its trailing comment:
`(needs: REASON)`, e.g. `(needs: GPUs)`, `(needs: a Slurm cluster)`, `(needs: a 70B checkpoint)`.
It is reported as skipped with that reason, never dropped silently; so is a block of a document
that is not a command list (```text). A line without the marker that fails is a failure.

Usage: test_docs_commands.py LATTICE_BIN SOURCE_DIR
Exit 0 all runnable commands passed, 1 a failure, 77 (skip) without the built-in model.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

TIMEOUT_S = 120  # hang guard per command
MODEL = "models/SmolLM2-135M-Instruct.Q4_1.gguf"


def commands(path):
    """[(line number, command, needs-reason or None)] of the ```sh blocks of a markdown file."""
    out = []
    in_sh = False
    pending, start = "", 0
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            s = line.rstrip("\n")
            if s.startswith("```"):
                in_sh = s.strip() == "```sh"
                continue
            if not in_sh:
                continue
            if not pending:
                start = n
            if s.endswith("\\"):
                pending += s[:-1] + " "
                continue
            cmd = (pending + s).strip()
            pending = ""
            if not cmd or cmd.startswith("#"):
                continue
            m = re.search(r"\(needs: ([^)]+)\)", cmd)
            out.append((start, cmd, m.group(1) if m else None))
    return out


def doc_pages(docs_dir):
    """Every .md file under docs_dir, subfolders included, in a stable order (path order)."""
    pages = []
    for d, dirs, files in os.walk(docs_dir):
        dirs.sort()
        pages += [os.path.join(d, f) for f in files if f.endswith(".md")]
    return sorted(pages)


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    lattice, src = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    if not os.path.exists(os.path.join(src, MODEL)) and not os.environ.get("LATTICE_DEFAULT_MODEL"):
        print(f"SKIP: the built-in model {MODEL} is not there (scripts/setup.sh fetches it)")
        return 77
    docs = [os.path.join(src, "README.md")] + doc_pages(os.path.join(src, "docs"))
    root = tempfile.mkdtemp(prefix="lattice-docs-")
    try:
        for d in os.listdir(src):  # the checkout's files and folders, read-only by convention
            if d not in ("build", ".git") and not d.startswith("build"):
                os.symlink(os.path.join(src, d), os.path.join(root, d))
        os.makedirs(os.path.join(root, "build", "launch"))
        os.symlink(lattice, os.path.join(root, "build", "launch", "lattice"))
        bindir = os.path.join(root, ".bin")
        os.makedirs(bindir)
        os.symlink(lattice, os.path.join(bindir, "lattice"))
        env = dict(os.environ)
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
        env["LATTICE_BIN"] = lattice
        env.pop("OMPI_MCA_rmaps_base_oversubscribe", None)  # the commands must say --oversubscribe themselves
        if os.geteuid() == 0:  # mpirun refuses root without these (a property of this machine, not the docs)
            env["OMPI_ALLOW_RUN_AS_ROOT"] = env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        passed, skipped, failed = 0, [], []
        t_all = time.monotonic()
        for doc in docs:
            rel = os.path.relpath(doc, src)
            for line, cmd, needs in commands(doc):
                where = f"{rel}:{line}"
                if needs:
                    skipped.append((where, cmd, needs))
                    print(f"SKIP {where}: {cmd}\n     needs: {needs}")
                    continue
                t0 = time.monotonic()
                try:
                    p = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=root, env=env, capture_output=True,
                                       text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
                    rc, err, out = p.returncode, p.stderr, p.stdout
                except subprocess.TimeoutExpired as e:
                    rc, err, out = "timeout", (e.stderr or b"").decode(errors="replace"), ""
                dt = time.monotonic() - t0
                if rc == 0:
                    passed += 1
                    print(f"ok   {where} ({dt:.1f} s): {cmd}")
                else:
                    failed.append(where)
                    print(f"FAIL {where} (rc {rc}, {dt:.1f} s): {cmd}")
                    for l in (out.strip().splitlines()[-5:] + err.strip().splitlines()[-10:]):
                        print(f"     | {l}")
        print(f"docs commands of {len(docs)} pages: {passed} ran, {len(skipped)} skipped (marked), {len(failed)} failed, "
              f"{time.monotonic() - t_all:.0f} s")
        if not passed and not failed:
            print("FAIL: no command found to run (are the ```sh blocks gone?)")
            return 1
        return 1 if failed else 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
