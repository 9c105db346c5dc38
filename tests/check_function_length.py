#!/usr/bin/env python3
"""launch/ is parsing and formatting (docs/design.md): no function there is longer than 80 lines, so a
front that starts to do the lower layers' work shows here. runtime/engine/ is held to the same bound, and
to files of at most ~500 lines (--file-max), so its parts (EngineCore, RankExecutor, ModelRunner,
KvCacheManager, Scheduler) stay small enough to read one at a time. A function is a brace block opened at
namespace or class scope by a line that closes a parameter list (`) {`, `) const {`, an initializer
list's last `{}`...); its length counts from that line to its closing brace. Lambdas and blocks inside
a function count toward it. Comments and strings are blanked before braces are counted.

Usage: check_function_length.py [REPO_ROOT] [--max N] [--dir launch] [--file-max N]   (exit 0: clean; 1: listed)
       check_function_length.py --self-test   (a long function is caught, short ones are not)
"""
import os
import re
import sys

SIGNATURE = re.compile(r"\)\s*(const)?\s*(noexcept)?\s*(override)?\s*(->\s*[\w:<>,\s*&]+)?\s*\{\s*$")
CTOR = re.compile(r"^\s*[\w:~]+\(.*\)\s*:\s*\w.*\{\s*$")  # A::A(...) : x_{1}, y_(2) {
NOT_FUNCTION = re.compile(r"^\s*(if|for|while|switch|catch|else|do|namespace|struct|class|enum|union)\b")


def blank(text):
    """Comments, strings and character literals to spaces (newlines kept), so braces in them are not counted."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + (m.group(1) if m else "") + '"', i)
            j = n if end < 0 else end + len(m.group(1) if m else "") + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(" " * (min(j, n - 1) - i + 1))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def long_functions(text, limit):
    """(first line, length) of each function longer than `limit` lines."""
    found = []
    depth, start, start_depth = 0, None, None
    for no, line in enumerate(blank(text).splitlines(), 1):
        for k, ch in enumerate(line):
            if ch == "{":
                opens = SIGNATURE.search(line[: k + 1]) or (k == line.rstrip().rfind("{") and CTOR.match(line))
                if start is None and opens and not NOT_FUNCTION.match(line):
                    start, start_depth = no, depth
                depth += 1
            elif ch == "}":
                depth -= 1
                if start is not None and depth == start_depth:
                    if no - start + 1 > limit:
                        found.append((start, no - start + 1))
                    start = None
    return found


def main(root, limit, folder, file_limit=None):
    bad = []
    for dirpath, _, files in os.walk(os.path.join(root, folder)):
        for name in sorted(files):
            if name.endswith((".cpp", ".h")):
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                for line, length in long_functions(text, limit):
                    bad.append(f"{os.path.relpath(path, root)}:{line}: a function of {length} lines (at most {limit})")
                lines = text.count("\n")
                if file_limit is not None and lines > file_limit:
                    bad.append(f"{os.path.relpath(path, root)}: a file of {lines} lines (at most {file_limit})")
    for b in bad:
        print(b)
    files = f", files over {file_limit} lines" if file_limit is not None else ""
    print(f"check_function_length: {len(bad)} function(s){files} in {folder}/ over {limit} lines")
    return 1 if bad else 0


def self_test():
    short = "int f(int a) {\n    return a;\n}\n"
    body = "".join(f"    x += {i}; // }} in a comment\n" for i in range(90))
    long = 'void g() {\n    const char* s = "{";\n' + body + "    auto l = [&] {\n        return 1;\n    };\n}\n"
    ctor = "struct A {\n    A() : x_{1} {\n" + body + "    }\n    int x_;\n};\n"
    ok = long_functions(short, 80) == [] and [n for _, n in long_functions(long, 80)] == [96]
    ok = ok and [n for _, n in long_functions(ctor, 80)] == [92]
    ok = ok and long_functions("namespace n {\nstruct S {\n    int a;\n};\n}\n", 1) == []
    import io
    import tempfile
    from contextlib import redirect_stdout
    with tempfile.TemporaryDirectory() as root:  # --file-max: a file over the bound is listed, one at it is not
        os.makedirs(os.path.join(root, "d"))
        for name, lines in (("long.cpp", 501), ("ok.cpp", 500)):
            with open(os.path.join(root, "d", name), "w") as f:
                f.write("int x;\n" * lines)
        with redirect_stdout(io.StringIO()) as out:
            status = main(root, 80, "d", 500)
        ok = ok and status == 1 and "long.cpp" in out.getvalue() and "ok.cpp" not in out.getvalue()
    print("self-test", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--self-test" in args:
        sys.exit(self_test())
    limit = int(args[args.index("--max") + 1]) if "--max" in args else 80
    folder = args[args.index("--dir") + 1] if "--dir" in args else "launch"
    file_limit = int(args[args.index("--file-max") + 1]) if "--file-max" in args else None
    options = ("--max", "--dir", "--file-max")
    rest = [a for i, a in enumerate(args) if not a.startswith("--") and (i == 0 or args[i - 1] not in options)]
    root = rest[0] if rest else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    sys.exit(main(root, limit, folder, file_limit))
