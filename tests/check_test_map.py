#!/usr/bin/env python3
"""Keeps the behaviour -> test maps of docs/ honest. A map is any markdown table of a page under docs/
whose header row's second column is "CTest test" (docs/testing.md, "Where each behaviour is tested").
In every row of a map, each CTest name of the second column (separated by ";" or ",") must be a
registered test (an add_test NAME, a lattice_test, a call of a CMake function that registers its first
argument such as hosts_test(), or a name a foreach builds from its items, found in a tests/
CMakeLists.txt), and each "quoted" piece of the third column must occur in some file under tests/ (a
Case name, a check message, a TEST_CASE title, with the "..." shorthand for a cut: each side of it must
occur). Rows whose second column is "lead" are skipped.
Usage: check_test_map.py REPO_ROOT   (exit 0: every reference found; 1: the missing ones listed, or no map)
       check_test_map.py --self-test (the check itself catches an unknown test and a quote found nowhere)"""
import os
import re
import sys
import tempfile


def read_tests(root):
    """(text of every file under tests/, text of every tests/ CMakeLists.txt)."""
    corpus, cmake = [], []
    for d, _, files in os.walk(os.path.join(root, "tests")):
        for f in files:
            text = open(os.path.join(d, f), encoding="utf-8", errors="replace").read()
            corpus.append(text)
            if f == "CMakeLists.txt":
                cmake.append(text)
    return "\n".join(corpus), "\n".join(cmake)


def wrappers(cmake):
    """Names of the CMake functions that register a test named by their first parameter
    (`function(hosts_test name ...)` whose body has `NAME ${name}`)."""
    out = []
    for m in re.finditer(r"function\((\w+)\s+(\w+)[^)]*\)(.*?)endfunction", cmake, re.S):
        if re.search(r"NAME\s+\$\{" + re.escape(m.group(2)) + r"\}[\s)]", m.group(3)):
            out.append(m.group(1))
    return out


def registered_names(cmake):
    """Every test name the CMake text builds: NAME x, set(_name x) and calls of a wrapper (wrappers()),
    literal or inside a foreach over a list of items, each ${...} of the name then replaced by every item
    (and the item with - as _, the string(REPLACE "-" "_") idiom)."""
    calls = "|".join(re.escape(w) + r"\(\s*" for w in wrappers(cmake))
    pattern = r"(?:NAME\s+|set\(_name\s+" + ("|" + calls if calls else "") + r")([\w${}-]+)[\s)]"
    loops = [(m.start(), m.end(), m.group(2).split()) for m in re.finditer(r"foreach\((\w+)\s+([^)]*)\)", cmake)
             if "IN" not in m.group(2).split()]
    names = set()
    for m in re.finditer(pattern, cmake):
        name = m.group(1)
        if "${" not in name:
            names.add(name)
            continue
        before = [lp for lp in loops if lp[1] <= m.start() and "endforeach" not in cmake[lp[1]:m.start()]]
        for item in before[-1][2] if before else []:
            for v in {item, item.replace("-", "_")}:
                names.add(re.sub(r"\$\{\w+\}", v, name))
    return names


def registered(name, cmake):
    if name in registered_names(cmake):
        return True
    # foreach-built names: launch_batch_${_part} with kill / drain / format in the loop or beside it
    m = re.match(r"(.*?_)([a-z0-9]+)$", name)
    return bool(m and re.search(re.escape(m.group(1)) + r"\$\{_part\}", cmake) and m.group(2) in cmake)


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def map_rows(path):
    """(line number, cells) of every body row of every map table in a markdown file."""
    rows, in_map, in_code = [], False, False
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("|"):
            in_map = False
            continue
        if line.startswith("|---") or line.startswith("| ---"):
            continue
        c = cells(line)
        if len(c) >= 3 and c[1] == "CTest test":
            in_map = True  # a header row opens a map
            continue
        if in_map:
            rows.append((n, c))
    return rows


def check(root):
    """(problems, rows checked)."""
    corpus, cmake = read_tests(root)
    problems, checked = [], 0
    docs = os.path.join(root, "docs")
    for d, _, files in sorted(os.walk(docs)):
        for f in sorted(files):
            if not f.endswith(".md"):
                continue
            path = os.path.join(d, f)
            rel = os.path.relpath(path, root)
            for n, c in map_rows(path):
                if len(c) < 3 or c[1] == "lead":
                    continue
                checked += 1
                where = f"{rel}:{n} ({c[0]})"
                for name in (x.strip() for x in re.split(r"[;,]\s*", c[1])):
                    if name and not registered(name, cmake):
                        problems.append(f"{where}: test {name} is not registered")
                for quoted in re.findall(r'"([^"]+)"', c[2]):
                    for part in (p.strip() for p in quoted.split("...")):
                        if part and part not in corpus:
                            problems.append(f"{where}: \"{part}\" occurs in no file under tests/")
    return problems, checked


def main(root):
    problems, checked = check(root)
    if not checked:
        problems.append("no map found: no table under docs/ has \"CTest test\" as its second column")
    for p in problems:
        print("MISSING:", p)
    print(f"check_test_map: {checked} row(s) checked, {len(problems)} missing reference(s)")
    return 1 if problems else 0


def self_test():
    def write(root, rel, text):
        full = os.path.join(root, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(text)

    failures = []
    with tempfile.TemporaryDirectory() as root:
        write(root, "tests/CMakeLists.txt", "add_test(NAME test_alpha COMMAND x)\n")
        write(root, "tests/t.cpp", 'TEST_CASE("alpha holds its bound") {}\n')
        good = ("# t\n\n| item | CTest test | where |\n|---|---|---|\n"
                "| a | test_alpha | \"alpha holds ... bound\" |\n| b | lead | \"anything\" |\n\n"
                "| not | a map | \"ignored\" |\n|---|---|---|\n| x | y | \"z\" |\n")
        write(root, "docs/testing.md", good)
        problems, checked = check(root)
        if problems or checked != 1:
            failures.append(f"a correct map: {problems}, {checked} row(s) checked (want none, 1)")
        write(root, "docs/sub/more.md", "| item | CTest test | where |\n|---|---|---|\n"
                                         "| c | test_beta | \"a quote found nowhere\" |\n")
        problems, _ = check(root)
        if not any("test test_beta is not registered" in p for p in problems):
            failures.append("an unregistered test was not reported")
        if not any("a quote found nowhere" in p for p in problems):
            failures.append("a quote found nowhere was not reported")
        # a wrapper function's calls and a foreach's names (a hyphenated item as the loop's _ name)
        write(root, "tests/sub/CMakeLists.txt",
              "function(my_test name script)\n    add_test(NAME ${name} COMMAND bash ${script})\nendfunction()\n"
              "my_test(test_gamma g.sh)\nforeach(_mode one two-three)\n    string(REPLACE \"-\" \"_\" _n ${_mode})\n"
              "    my_test(test_delta_${_n} d.sh ${_mode})\nendforeach()\nmy_test(test_late_${_n} x.sh)\n")
        write(root, "docs/sub/more.md", "| item | CTest test | where |\n|---|---|---|\n"
                                         "| c | test_gamma, test_delta_one; test_delta_two_three | \"alpha holds\" |\n")
        problems, _ = check(root)
        if problems:
            failures.append(f"a wrapper's call or a foreach-built name not recognised: {problems}")
        write(root, "docs/sub/more.md", "| item | CTest test | where |\n|---|---|---|\n"
                                         "| c | test_delta_four; test_late_one | \"alpha holds\" |\n")
        problems, _ = check(root)
        if len(problems) != 2:  # four is not an item; _n outside the loop names nothing
            failures.append(f"names outside a foreach's items were taken: {problems}")
    for f in failures:
        print("SELF-TEST FAILED:", f)
    print("check_test_map self-test:", "failed" if failures else "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
