#!/usr/bin/env python3
"""LATTICE_TEST_SEED, as every CUDA test obeys it (tests/kernels/cuda/cuda_test_util.h), checked on the CPU
through tests/gpu/seed_probe (the same header, no CUDA call):
  - the binary prints LATTICE_TEST_SEED=<base> before its first case and "[case] <name>" per case;
  - with LATTICE_TEST_SEED set, it prints that base and every case draws the same seeds run after run,
    and the same when the case runs alone (--test-case=..., as benchmarks/gpu/run_cuda_tests.py reruns a
    failure) as within the whole binary; a different base gives different seeds;
  - unset, the base is fresh each run (two runs differ) and is the one printed;
  - an unparsable value stops the binary (exit 2) instead of silently drawing fresh data.
Usage: test_seed.py PROBE"""
import os
import re
import subprocess
import sys


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def run(probe, seed, *args):
    env = dict(os.environ)
    env.pop("LATTICE_TEST_SEED", None)
    if seed is not None:
        env["LATTICE_TEST_SEED"] = seed
    p = subprocess.run([probe, *args], env=env, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def seeds(text):
    return dict(re.findall(r"MESSAGE: seed (first|second|sub x|sub y) ([0-9 ]+)", text))


def main():
    probe = sys.argv[1]
    rc, a = run(probe, "42")
    if rc != 0 or "LATTICE_TEST_SEED=42" not in a:
        fail(f"with LATTICE_TEST_SEED=42: exit {rc}, no echo:\n{a}")
    for case in ("seed probe: first", "seed probe: second, with a comma", "seed probe: subcases"):
        if f"[case] {case}" not in a:
            fail(f"no '[case] {case}' line:\n{a}")
    sa = seeds(a)
    if len(sa) != 4:
        fail(f"expected 4 seed lines, got {sa}")
    _, b = run(probe, "42")
    if seeds(b) != sa:
        fail(f"the same base drew other seeds: {sa} vs {seeds(b)}")
    _, c = run(probe, "0x2a", "--test-case=seed probe: second? with a comma")
    if seeds(c) != {"second": sa["second"]}:
        fail(f"the case alone (hex base) drew {seeds(c)}, not {sa['second']}")
    _, d = run(probe, "42", "--test-case=seed probe: subcases", "--subcase=y")
    if seeds(d) != {"sub y": sa["sub y"]}:
        fail(f"the subcase alone drew {seeds(d)}")
    _, e = run(probe, "43")
    if any(seeds(e)[k] == sa[k] for k in sa):
        fail(f"base 43 drew a seed of base 42: {seeds(e)}")
    _, f1 = run(probe, None)
    _, f2 = run(probe, None)
    m1, m2 = re.search(r"LATTICE_TEST_SEED=(\d+)", f1), re.search(r"LATTICE_TEST_SEED=(\d+)", f2)
    if not m1 or not m2 or m1.group(1) == m2.group(1) or seeds(f1) == seeds(f2):
        fail("unset, two runs printed the same base or drew the same seeds")
    _, g = run(probe, m1.group(1))
    if seeds(g) != seeds(f1):
        fail("the printed base of a run did not reproduce its seeds")
    rc, h = run(probe, "4x2")
    if rc != 2 or "not a number" not in h:
        fail(f"LATTICE_TEST_SEED=4x2: exit {rc}: {h}")
    print("PASS: LATTICE_TEST_SEED printed, obeyed, reproducible case by case; fresh when unset")
    return 0


if __name__ == "__main__":
    sys.exit(main())
