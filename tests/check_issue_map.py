#!/usr/bin/env python3
"""Keeps the issue -> test maps of docs/testing.md honest: in every table row under a heading that
starts "Issue ", each CTest name of the second column must be a registered test (an add_test NAME, or
a lattice_test / foreach-built name found in a tests/ CMakeLists.txt), and each "quoted" piece of the
third column must occur in some file under tests/ (a Case name, a check message, a TEST_CASE title,
with the "..." shorthand for a cut: each side of it must occur). Rows marked "lead" are skipped.
Usage: check_issue_map.py REPO_ROOT   (exit 0: every reference found; 1: the missing ones listed)"""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "."
tests_dir = os.path.join(root, "tests")
corpus, cmake = [], []
for d, _, files in os.walk(tests_dir):
    for f in files:
        text = open(os.path.join(d, f), encoding="utf-8", errors="replace").read()
        corpus.append(text)
        if f == "CMakeLists.txt":
            cmake.append(text)
corpus, cmake = "\n".join(corpus), "\n".join(cmake)


def registered(name):
    if re.search(r"(NAME|set\(_name)\s+" + re.escape(name) + r"[\s)]", cmake):
        return True
    # foreach-built names: launch_batch_${_part} with kill / drain / format in the loop or beside it
    m = re.match(r"(.*?_)([a-z0-9]+)$", name)
    return bool(m and re.search(re.escape(m.group(1)) + r"\$\{_part\}", cmake) and m.group(2) in cmake)


missing = []
in_issue = False
for line in open(os.path.join(root, "docs", "testing.md"), encoding="utf-8"):
    if line.startswith("#"):
        in_issue = line.lstrip("#").strip().startswith("Issue ")
        continue
    if not in_issue or not line.startswith("|") or line.startswith("|---"):
        continue
    cols = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cols) < 3 or cols[1] in ("CTest test", "lead"):
        continue
    for name in re.split(r"[;,]\s*", cols[1]):
        name = name.strip()
        if name and not registered(name):
            missing.append(f"{cols[0]}: test {name} is not registered")
    for quoted in re.findall(r'"([^"]+)"', cols[2]):
        for part in (p.strip() for p in quoted.split("...")):
            if part and part not in corpus:
                missing.append(f"{cols[0]}: \"{part}\" occurs in no file under tests/")
for m in missing:
    print("MISSING:", m)
print(f"check_issue_map: {len(missing)} missing reference(s)")
sys.exit(1 if missing else 0)
