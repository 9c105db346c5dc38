#!/usr/bin/env python3
"""docs/design.md's map of folders matches the tree, both ways: every folder the map names exists, and
every folder holding sources (.cpp, .h, .cu, .cuh) under the code's top folders is named.

The map is the first fenced block under the heading "## Layers and folders". A line of it declares a
folder when it starts (after its indentation) with `name/` followed by two spaces or the line's end;
the folder's parent is the nearest declaration above it that is indented less. Other lines are the
declarations' descriptions and are ignored. tests/ mirrors the tree: a folder tests/X is named when X
(or tests/X itself) is declared, so a new test folder needs no line of its own.

Usage: check_design_map.py [REPO_ROOT]   (exit 0: the map and the tree agree; 1: the differences listed)
       check_design_map.py --self-test     (the check itself catches a missing and an unnamed folder)
"""
import os
import re
import sys
import tempfile

CODE_TOPS = ["base", "kernels", "parallel", "runtime", "launch", "benchmarks", "tests"]
SOURCE_EXTS = (".cpp", ".h", ".cu", ".cuh")
DECL = re.compile(r"^( *)([A-Za-z0-9_.-]+)/(?:  |$)")


def map_block(design_text):
    """The lines of the fenced block under '## Layers and folders', or None."""
    lines = design_text.splitlines()
    heading = next((i for i, l in enumerate(lines) if l.startswith("## Layers and folders")), None)
    if heading is None:
        return None
    block, inside = [], False
    for line in lines[heading + 1:]:
        if line.startswith("## "):
            break
        if line.startswith("```"):
            if inside:
                return block
            inside = True
            continue
        if inside:
            block.append(line)
    return None


def declared_folders(block):
    """Folder paths ('runtime/engine') the map declares, in order."""
    stack, out = [], []  # stack of (indent, path)
    for line in block:
        m = DECL.match(line)
        if not m:
            continue
        indent, name = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (stack[-1][1] + "/" if stack else "") + name
        stack.append((indent, path))
        out.append(path)
    return out


def source_folders(root):
    """Folders (relative, '/'-separated) under CODE_TOPS that directly hold a source file."""
    out = set()
    for top in CODE_TOPS:
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = [x for x in dirs if not x.startswith(".")]
            if any(f.endswith(SOURCE_EXTS) for f in files):
                out.add(os.path.relpath(d, root).replace(os.sep, "/"))
    return out


def check(root):
    """List of problems (empty: the map and the tree agree)."""
    path = os.path.join(root, "docs", "design.md")
    block = map_block(open(path, encoding="utf-8").read())
    if block is None:
        return [f"{path}: no fenced map block under '## Layers and folders'"]
    declared = declared_folders(block)
    if not declared:
        return [f"{path}: the map declares no folder"]
    problems = [f"docs/design.md names {d}/, which does not exist" for d in declared
                if not os.path.isdir(os.path.join(root, d))]
    named = set(declared)
    for folder in sorted(source_folders(root)):
        if folder in named:
            continue
        if folder.startswith("tests/") and folder[len("tests/"):] in named:
            continue  # tests/X mirrors X
        problems.append(f"{folder}/ holds sources but docs/design.md's map does not name it")
    return problems


def main(root):
    problems = check(root)
    for p in problems:
        print("MAP:", p)
    print(f"check_design_map: {len(problems)} difference(s) between docs/design.md's map and the tree")
    return 1 if problems else 0


def self_test():
    def write(root, rel, text=""):
        full = os.path.join(root, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(text)

    design = ("# d\n\n## Layers and folders\n\n```\nruntime/     the engine\n  engine/    the loop;\n"
              "             cpu/ in prose is no declaration\n  model/     the forward\n"
              "kernels/     compute\n  cpu/       SIMD\ntests/       mirrors the tree\n  fuzz/\n```\n\n## Next\n")
    failures = []
    with tempfile.TemporaryDirectory() as root:
        write(root, "docs/design.md", design)
        for rel in ["runtime/engine/a.cpp", "runtime/model/b.h", "kernels/cpu/c.cpp", "tests/runtime/engine/t.cpp",
                    "tests/fuzz/f.cpp", "tests/t.cpp"]:
            write(root, rel)
        if declared_folders(map_block(design)) != ["runtime", "runtime/engine", "runtime/model", "kernels",
                                                   "kernels/cpu", "tests", "tests/fuzz"]:
            failures.append(f"declarations parsed wrong: {declared_folders(map_block(design))}")
        if check(root):
            failures.append(f"a matching tree reported: {check(root)}")
        write(root, "kernels/cuda/k.cu")  # a source folder the map does not name
        if not any("kernels/cuda/" in p for p in check(root)):
            failures.append("an unnamed source folder was not reported")
        os.remove(os.path.join(root, "kernels/cuda/k.cu"))
        os.rename(os.path.join(root, "runtime/model"), os.path.join(root, "runtime/gone"))
        if not any("runtime/model/, which does not exist" in p for p in check(root)):
            failures.append("a named folder that is missing was not reported")
        write(root, "tests/runtime/gone/t.cpp")  # mirrors no named folder
        if not any("tests/runtime/gone/" in p for p in check(root)):
            failures.append("a test folder mirroring no named folder was not reported")
    for f in failures:
        print("SELF-TEST FAILED:", f)
    print("check_design_map self-test:", "failed" if failures else "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
