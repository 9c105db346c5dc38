#!/usr/bin/env python3
"""The time accounting of scripts/test.sh: where a run's minutes went, and whether they fit the budget.

  test_times.py build-report BUILD_DIR [--since LINE] [--top N]
      the slowest steps of a ninja build (BUILD_DIR/.ninja_log from line LINE on: the steps of the
      build that test.sh just ran), and the seconds per kind of step (nvcc, C++ compile, link, other)
  test_times.py ctest-record STAGE CTEST_LOG RECORD
      appends "STAGE<TAB>test<TAB>seconds<TAB>status" for each test of a ctest run's output
  test_times.py --self-test
      the budget's verdicts on made-up runs (a ctest test)
  test_times.py report RECORD BUDGET [--top N]
      the stage times and the N slowest tests of the run, then the budget's verdict: exit 1 when
      a stage, the whole run or one test is over its limit (LATTICE_TIME_BUDGET=warn: report only)

RECORD lines are "stage<TAB>NAME<TAB>seconds" (written by test.sh around each stage),
"test<TAB>STAGE<TAB>NAME<TAB>seconds<TAB>status" and "ccache<TAB>BUILD<TAB>hits<TAB>misses". BUDGET is
"key = seconds" lines (scripts/test_budget.conf; BUDGET_KEYS below says what each key limits). Written here (not a library) because it is 150 lines of parsing ninja's and
ctest's own log formats."""
import os
import re
import sys


def ninja_steps(build_dir, since=0):
    """(seconds, output) of each step in .ninja_log from line `since` (format v5: start end mtime out hash)."""
    path = os.path.join(build_dir, ".ninja_log")
    if not os.path.exists(path):
        return []
    newest = {}
    with open(path) as f:
        for i, line in enumerate(f):
            if i < since or line.startswith("#"):
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 4:
                continue
            start, end, out = int(parts[0]), int(parts[1]), parts[3]
            newest[out] = (end - start) / 1000.0  # later lines of the log are later runs
    return [(s, o) for o, s in newest.items()]


def step_kind(out):
    if out.endswith(".cu.o"):
        return "nvcc"
    if out.endswith(".gch") or out.endswith(".pch"):
        return "pch"
    if out.endswith(".o"):
        return "compile"
    if out.endswith(".a") or "/" in out and "." not in os.path.basename(out) or out.endswith(".so"):
        return "link"
    return "other"


def build_report(build_dir, top, since):
    steps = ninja_steps(build_dir, since)
    if not steps:
        print(f"build {build_dir}: nothing was rebuilt")
        return 0
    kinds = {}
    for s, o in steps:
        k = step_kind(o)
        n, t = kinds.get(k, (0, 0.0))
        kinds[k] = (n + 1, t + s)
    total = sum(s for s, _ in steps)
    print(f"build {build_dir}: {len(steps)} steps, {total:.0f} s of step time (on all cores together)")
    print("  by kind: " + ", ".join(f"{k} {n} steps {t:.0f} s" for k, (n, t) in sorted(kinds.items(), key=lambda x: -x[1][1])))
    print(f"  slowest {top} steps:")
    for s, o in sorted(steps, reverse=True)[:top]:
        print(f"    {s:7.1f} s  {o}")
    return 0


# ctest's result lines: " 12/62 Test #13: launch_chat .......................   Passed   19.09 sec"
_CTEST_LINE = re.compile(r"^\s*\d+/\d+\s+Test\s+#\d+:\s+(\S+)\s+\.*\**\s*(.+?)\s+([0-9.]+)\s+sec\s*$")


def ctest_record(stage, log, record):
    n = 0
    with open(log, errors="replace") as f, open(record, "a") as out:
        for line in f:
            m = _CTEST_LINE.match(line)
            if not m:
                continue
            name, status, secs = m.group(1), m.group(2).strip().strip("*").strip(), float(m.group(3))
            out.write(f"test\t{stage}\t{name}\t{secs:.2f}\t{status}\n")
            n += 1
    return n


def read_budget(path):
    budget = {}
    with open(path) as f:
        for i, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            m = re.match(r"^([a-z_]+)\s*=\s*([0-9]+)$", line)
            if not m or m.group(1) not in BUDGET_KEYS:
                raise SystemExit(f"{path}:{i}: expected one of {', '.join(BUDGET_KEYS)} = seconds, got {line!r}")
            budget[m.group(1)] = int(m.group(2))
    return budget


# What each key of the budget file limits.
BUDGET_KEYS = {
    "whole_run": "every stage together",
    "warm_whole_run": "every stage together, when every build took >= 90% of its objects from ccache",
    "warm_per_miss": "added to warm_whole_run for each object a warm run's builds compiled (ccache misses)",
    "release": "the Release build and its tests (what --quick runs)",
    "per_test": "any one test in any stage",
}


def warm_limit(budget, misses):
    """A warm run's limit: warm_whole_run, plus warm_per_miss for each object its builds compiled (a commit that
    touches a widely included header recompiles tens of objects in both builds while the run still counts as
    warm), never above whole_run (a cold run's own limit)."""
    limit = budget["warm_whole_run"] + budget.get("warm_per_miss", 0) * misses
    return min(limit, budget["whole_run"]) if "whole_run" in budget else limit


def fmt_s(s):
    return f"{s:.0f} s ({s / 60:.1f} min)"


def report(record, budget_path, top):
    stages, tests, caches = [], [], []
    with open(record) as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            if p[0] == "stage" and len(p) == 3:
                stages.append((p[1], float(p[2])))
            elif p[0] == "test" and len(p) == 5:
                tests.append((float(p[3]), p[1], p[2], p[4]))
            elif p[0] == "ccache" and len(p) == 4:
                caches.append((p[1], int(p[2]), int(p[3])))
    total = sum(s for _, s in stages)
    release = sum(s for n, s in stages if n.startswith("release"))
    warm = bool(caches) and all(h + m == 0 or h >= 0.9 * (h + m) for _, h, m in caches)
    print("== time report ==")
    print("stages:")
    for name, s in stages:
        print(f"  {name:<20} {fmt_s(s)}")
    print(f"  {'whole run':<20} {fmt_s(total)}")
    print("ccache: " + ", ".join(f"{n} {h} hits / {m} misses" for n, h, m in caches)
          + (" (a warm run)" if warm else " (a cold run)"))
    print(f"slowest {top} tests (of {len(tests)}):")
    for s, stage, name, status in sorted(tests, reverse=True)[:top]:
        print(f"  {s:7.1f} s  {name} [{stage}] {status}")

    budget = read_budget(budget_path)
    over = []
    if "whole_run" in budget and total > budget["whole_run"]:
        over.append(f"the whole run took {fmt_s(total)}, budget {budget['whole_run']} s")
    if warm and "warm_whole_run" in budget:
        misses = sum(m for _, _, m in caches)
        limit = warm_limit(budget, misses)
        if total > limit:
            over.append(f"the whole run (warm ccache, {misses} objects compiled) took {fmt_s(total)}, budget {limit} s")
    if "release" in budget and release > budget["release"]:
        over.append(f"the Release stages took {fmt_s(release)}, budget {budget['release']} s")
    if "per_test" in budget:
        for s, stage, name, _ in tests:
            if s > budget["per_test"]:
                over.append(f"test {name} [{stage}] took {s:.0f} s, budget {budget['per_test']} s per test")
    name = os.path.relpath(budget_path)
    if not over:
        print(f"time budget ({name}): within every limit")
        return 0
    for o in over:
        print(f"time budget exceeded: {o}")
    if os.environ.get("LATTICE_TIME_BUDGET", "") == "warn":
        print("(LATTICE_TIME_BUDGET=warn: reported, not failed)")
        return 0
    print(f"test.sh: over the time budget of {name}: make the test or the build cheaper (docs/testing.md says "
          "how), or raise the budget in the same commit and say why")
    return 1


def self_test():
    """The budget's verdicts on made-up runs, each of which a wrong rule would judge the other way."""
    import contextlib
    import io
    import tempfile
    conf = "whole_run = 1800\nwarm_whole_run = 840\nwarm_per_miss = 5\nrelease = 900\nper_test = 120\n"
    # (stages, ccache (hits, misses) per build, slowest test, expected exit)
    cases = [
        # CI 2026-12-07: 22 + 20 objects compiled cost ~170 s of build: warm, within 840 + 42 * 5
        ([16, 96, 294, 127, 257, 70], [(242, 22), (252, 20)], 36.2, 0),
        ([16, 15, 450, 41, 330, 70], [(264, 0), (272, 0)], 36.2, 1),    # nothing compiled: 922 s > 840
        ([16, 96, 400, 127, 350, 70], [(242, 22), (252, 20)], 36.2, 1),  # 1059 s > 1050
        ([30, 700, 500, 300, 300, 70], [(0, 264), (0, 272)], 36.2, 1),   # cold, 1900 s > 1800
        ([30, 400, 400, 300, 300, 70], [(0, 264), (0, 272)], 36.2, 0),   # cold, 1500 s
        ([16, 15, 300, 41, 250, 70], [(264, 0), (272, 0)], 121.0, 1),   # one test over 120 s
    ]
    names = ["setup", "release build", "release tests", "sanitizer build", "sanitizer tests", "fuzzers"]
    failed = 0
    os.environ.pop("LATTICE_TIME_BUDGET", None)  # a verdict, not a warning
    with tempfile.TemporaryDirectory() as d:
        budget = os.path.join(d, "budget.conf")
        with open(budget, "w") as f:
            f.write(conf)
        for i, (stages, caches, slowest, want) in enumerate(cases):
            record = os.path.join(d, f"record{i}")
            with open(record, "w") as f:
                f.writelines(f"stage\t{n}\t{s}\n" for n, s in zip(names, stages))
                f.writelines(f"ccache\t{b}\t{h}\t{m}\n" for b, (h, m) in zip(["release", "sanitizer"], caches))
                f.write(f"test\trelease\tslowest\t{slowest}\tPassed\n")
            with contextlib.redirect_stdout(io.StringIO()):
                got = report(record, budget, 3)
            if got != want:
                print(f"self-test case {i}: exit {got}, expected {want}")
                failed += 1
    print("self-test: " + ("passed" if not failed else f"{failed} failed"))
    return 1 if failed else 0


def main(argv):
    top = 10
    if "--top" in argv:
        i = argv.index("--top")
        top = int(argv[i + 1])
        del argv[i:i + 2]
    since = 0
    if "--since" in argv:
        i = argv.index("--since")
        since = int(argv[i + 1])
        del argv[i:i + 2]
    if len(argv) == 2 and argv[0] == "build-report":
        return build_report(argv[1], top, since)
    if len(argv) == 4 and argv[0] == "ctest-record":
        ctest_record(argv[1], argv[2], argv[3])
        return 0
    if argv == ["--self-test"]:
        return self_test()
    if len(argv) == 3 and argv[0] == "report":
        return report(argv[1], argv[2], top)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
