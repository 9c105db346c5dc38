#!/usr/bin/env python3
"""`lattice generate` input and output as scripts drive it, on the built-in default model (found by
the executable's own default-model resolution: no --model):
  - the prompt from stdin (implicit when piped, and `--prompt -`) and from --prompt-file gives the
    same prompt and output ids as --prompt (one trailing newline dropped); bad prompt files (missing,
    a folder, a FIFO, not UTF-8, empty) give exit 1 and one line naming the file;
  - the seed: without --seed a random one is printed (`seed: N`, and in --stats-json); two runs at
    temperature 1 get different seeds, --seed N repeats a run's text exactly; under mpirun with two
    pipeline stages (the last stage samples) the printed seed reproduces on one rank;
  - --json: one object per sequence with typed fields, --logprobs, --batch N; text mode with
    --batch N separates sequences by `--- sequence I ---` lines;
  - finish_reason: length, stop (a --stop string: the text ends before it, as the server's do),
    finish_reason length with a tiny --max-seq (the context full, said on stderr);
  - the repetition penalty changes greedy output; --help states defaults and ends with examples.
Usage: test_generate_io.py LATTICE_BINARY SOURCE_DIR [io|seeds|finish]   (exit 0 pass, 77 skip, 1 fail)
The optional part runs a third: io (prompt sources, bad prompt files, --json, --help), seeds, or finish
(finish reasons, penalties); CTest runs the three as separate tests, side by side."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

lattice, source = os.path.abspath(sys.argv[1]), sys.argv[2]
PART = sys.argv[3] if len(sys.argv) > 3 else "all"


def part(name):
    return PART in ("all", name)
model = os.path.join(source, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
if not os.environ.get("LATTICE_DEFAULT_MODEL") and not os.path.exists(model):
    print(f"SKIP: the default model {model} is missing (scripts/setup.sh fetches it)")
    sys.exit(77)

fails = []
HANG_GUARD = 600  # seconds: only against a hang, never for ordering


def check(ok, what):
    print(("ok: " if ok else "FAILED: ") + what)
    if not ok:
        fails.append(what)


def run(args, stdin=subprocess.DEVNULL, input=None, prefix=()):
    p = subprocess.run(list(prefix) + [lattice, "generate", "--threads", "2"] + args, stdin=None if input else stdin,
                       input=input, capture_output=True, timeout=HANG_GUARD, cwd=tmp)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def jsons(out):
    return [json.loads(line) for line in out.splitlines() if line.strip()]


tmp = tempfile.mkdtemp()
try:
    prompt = "The three primary colors are"
    if part("io"):
        # ---- prompt sources: the same prompt ids and output ----
        rc, out, err = run(["-p", prompt, "-n", "8", "--json"])
        check(rc == 0, f"--prompt runs (rc {rc}: {err[-300:]})")
        ref = jsons(out)[0] if rc == 0 else {}
        ref_key = (ref.get("usage", {}).get("prompt_tokens"), ref.get("token_ids"))
        check(ref_key[0] and ref_key[0] > 3 and len(ref_key[1] or []) == 8, f"reference has a prompt and 8 tokens: {ref}")
        with open(os.path.join(tmp, "p.txt"), "w") as f:
            f.write(prompt + "\n")
        for name, args, inp in [("piped stdin, no prompt option", ["-n", "8", "--json"], (prompt + "\n").encode()),
                                ("--prompt - (stdin)", ["--prompt", "-", "-n", "8", "--json"], prompt.encode()),
                                ("--prompt-file", ["--prompt-file", "p.txt", "-n", "8", "--json"], None)]:
            rc, out, err = run(args, input=inp)
            got = jsons(out)[0] if rc == 0 else {}
            check(rc == 0 and (got["usage"]["prompt_tokens"], got["token_ids"]) == ref_key,
                  f"{name} gives the ids of --prompt (rc {rc}, {got}, {err[-200:]})")
        rc, out, _ = run(["-p", "Numbers are", "-n", "8", "--json"])
        check(rc == 0 and jsons(out)[0]["token_ids"] != ref_key[1], "another prompt gives other ids (the check has power)")

        # ---- bad prompt files: exit 1, one line naming the file ----
        os.mkdir(os.path.join(tmp, "folder"))
        os.mkfifo(os.path.join(tmp, "fifo"))
        with open(os.path.join(tmp, "latin1.txt"), "wb") as f:
            f.write(b"caf\xe9 au lait")
        open(os.path.join(tmp, "empty.txt"), "w").close()
        for name, path, why in [("missing", "nope.txt", "no such file"), ("folder", "folder", "directory"),
                                ("FIFO", "fifo", "FIFO"), ("not UTF-8", "latin1.txt", "not UTF-8"),
                                ("empty", "empty.txt", "empty")]:
            rc, out, err = run(["--prompt-file", path, "-n", "2"])
            lines = [l for l in err.splitlines() if l.strip()]
            check(rc == 1 and len(lines) == 1 and path in lines[0] and why in lines[0],
                  f"--prompt-file {name}: exit 1, one line naming it and why (rc {rc}: {err.strip()[:300]})")
        rc, out, err = run(["-n", "2"])  # no prompt at all, stdin not redirected (/dev/null)
        check(rc == 1 and "no prompt" in err, f"no prompt and nothing piped: a clear error (rc {rc}: {err.strip()})")
        rc, out, err = run(["-p", "x", "--prompt-file", "p.txt"])
        check(rc == 1 and "one prompt" in err, f"two prompt sources are refused (rc {rc}: {err.strip()})")

    if part("seeds"):
        # ---- seeds ----
        seed_re = re.compile(r"^seed: (\d+)$", re.M)

        def sampled(extra):
            rc, out, err = run(["-p", "Once upon a time", "-n", "24", "--temperature", "1"] + extra)
            m = seed_re.search(err)
            return rc, out, (int(m.group(1)) if m else None), err

        rc1, out1, s1, err1 = sampled(["--stats-json", "stats.json"])
        rc2, out2, s2, _ = sampled([])
        check(rc1 == 0 and rc2 == 0 and s1 is not None and s2 is not None, f"the seed is printed on stderr ({err1[-300:]})")
        check(s1 != s2, f"two runs without --seed get different seeds ({s1}, {s2})")
        stats = json.load(open(os.path.join(tmp, "stats.json"))) if rc1 == 0 else {}
        check(stats.get("seed") == s1, f"--stats-json holds the seed ({stats.get('seed')} vs {s1})")
        rc3, out3, s3, _ = sampled(["--seed", str(s1)])
        check(rc3 == 0 and s3 == s1 and out3 == out1 and out1.strip(), "--seed N repeats the run's text exactly")
        check(out1 != out2 or s1 == s2, "different seeds sampled different text (24 tokens at temperature 1)")
        mpirun = shutil.which("mpirun")
        if mpirun:
            pre = [mpirun, "--oversubscribe", "--bind-to", "none", "-np", "2"] + (["--allow-run-as-root"] if os.getuid() == 0 else [])
            rc, out, err = run(["-p", "Once upon a time", "-n", "24", "--temperature", "1", "--pp", "2"],
                               prefix=pre)
            seeds = seed_re.findall(err)
            check(rc == 0 and len(seeds) == 1, f"mpirun -np 2 --pp 2: one seed printed (rank 0) (rc {rc}: {err[-400:]})")
            if seeds:
                rc, one, _, _ = sampled(["--seed", seeds[0]])
                check(rc == 0 and one == out, "the multi-rank run's printed seed reproduces its text on one rank "
                                              "(the sampler rank used rank 0's seed)")
        else:
            print("note: no mpirun; the multi-rank seed check is not run")

    if part("io"):
        # ---- --json fields and types ----
        rc, out, err = run(["-p", prompt, "-n", "6", "--json", "--logprobs", "--batch", "2", "--temperature", "1",
                            "--seed", "5"])
        objs = jsons(out) if rc == 0 else []
        check(rc == 0 and len(objs) == 2, f"--json --batch 2: two objects (rc {rc}: {err[-300:]})")
        for i, o in enumerate(objs):
            ok = (o.get("index") == i and isinstance(o.get("text"), str) and isinstance(o.get("token_ids"), list)
                  and all(isinstance(t, int) for t in o["token_ids"]) and o.get("finish_reason") in ("stop", "length")
                  and isinstance(o.get("usage"), dict) and o["usage"].get("prompt_tokens") == ref_key[0]
                  and o["usage"].get("completion_tokens") == len(o["token_ids"]) and o.get("seed") == 5 + i
                  and isinstance(o.get("logprobs"), list) and len(o["logprobs"]) == len(o["token_ids"])
                  and all(isinstance(x, float) and x <= 0 for x in o["logprobs"]))
            check(ok, f"--json object {i} has typed fields: {o}")
        rc, out, _ = run(["-p", prompt, "-n", "6", "--json"])
        check(rc == 0 and "logprobs" not in jsons(out)[0], "no logprobs unless asked for")
        rc, out, err = run(["-p", prompt, "-n", "4", "--logprobs"])
        check(rc == 2 and "--json" in err, f"--logprobs without --json is a command-line error (rc {rc}: {err.strip()})")
        rc, out, err = run(["-p", prompt, "-n", "6", "--batch", "3", "--temperature", "1"])
        heads = re.findall(r"^--- sequence (\d+) ---$", out, re.M)
        check(rc == 0 and heads == ["0", "1", "2"], f"text --batch 3: `--- sequence I ---` headers ({heads}; {out!r})")

    if part("finish"):
        # ---- finish reasons ----
        rc, out, _ = run(["-p", prompt, "-n", "24", "--json", "--ignore-eos"])
        full = jsons(out)[0]
        check(full["finish_reason"] == "length" and len(full["token_ids"]) == 24, "finish_reason length at -n")
        words = re.findall(r"[A-Za-z]{4,}", full["text"])
        stop = words[len(words) // 2] if words else None
        check(stop is not None, f"the greedy text has a word to stop at: {full['text']!r}")
        if stop:
            rc, out, err = run(["-p", prompt, "-n", "24", "--json", "--ignore-eos", "--stop", stop, "--stop", "#@!"])
            o = jsons(out)[0] if rc == 0 else {}
            want = full["text"][:full["text"].find(stop)]
            check(o.get("finish_reason") == "stop" and o.get("text") == want and len(o["token_ids"]) < 24,
                  f"--stop {stop!r}: the text ends before it, finish_reason stop ({o}, want {want!r})")
            rc, out, err = run(["-p", prompt, "-n", "24", "--ignore-eos", "--stop", stop])
            check(rc == 0 and out == want + "\n", f"--stop in text mode prints the same text ({out!r})")
        n_prompt = full["usage"]["prompt_tokens"]
        rc, out, err = run(["-p", prompt, "-n", "32", "--json", "--ignore-eos", "--max-seq", str(n_prompt + 5)])
        o = jsons(out)[0] if rc == 0 else {}
        check(o.get("finish_reason") == "length" and len(o.get("token_ids", [])) == 5,
              f"--max-seq prompt+5: 5 tokens, finish_reason length ({o}; {err[-300:]})")
        check("context" in err and "is full" in err, f"... and said on stderr ({err.strip()[-300:]})")
        rc, out, err = run(["-p", prompt, "-n", "4", "--max-seq", str(n_prompt)])
        check(rc == 1 and "no room" in err, f"a prompt filling the context is refused (rc {rc}: {err.strip()[-200:]})")

    if part("finish"):
        # ---- penalties ----
        rc, out, _ = run(["-p", prompt, "-n", "24", "--json", "--ignore-eos", "--repeat-penalty", "1.8",
                          "--repeat-last-n", "-1"])
        pen = jsons(out)[0] if rc == 0 else {}
        check(rc == 0 and pen["token_ids"] != full["token_ids"], "--repeat-penalty changes the greedy output")
        rc, out, _ = run(["-p", prompt, "-n", "24", "--json", "--ignore-eos", "--repeat-penalty", "1.8",
                          "--repeat-last-n", "-1", "--presence-penalty", "1.5", "--frequency-penalty", "1", "--min-p",
                          "0.1"])
        check(rc == 0 and len(jsons(out)[0]["token_ids"]) == 24, "presence / frequency penalties and min-p run")
        for flag, val in [("--repeat-penalty", "0"), ("--presence-penalty", "3"), ("--min-p", "2"),
                          ("--repeat-last-n", "-2")]:
            rc, out, err = run(["-p", prompt, "-n", "2", flag, val])
            check(rc == 2 and flag in err and len(err.strip().splitlines()) == 1,
                  f"{flag} {val}: one line naming the flag, exit 2 (rc {rc}: {err.strip()})")

    if part("io"):
        # ---- help ----
        h = subprocess.run([lattice, "generate", "--help"], capture_output=True, text=True, timeout=60).stdout
        for opt, dflt in [("--max-new-tokens", "32"), ("--temperature", "0"), ("--top-k", "0"), ("--top-p", "1"),
                          ("--min-p", "0"), ("--repeat-penalty", "1"), ("--repeat-last-n", "64"),
                          ("--presence-penalty", "0"), ("--frequency-penalty", "0"), ("--batch", "1")]:
            line = next((l for l in h.splitlines() if re.match(r"\s*(-\w,)?" + re.escape(opt) + r"\b", l)), "")
            check(line.split()[-1].endswith("=" + dflt) if line.split() else False,
                  f"--help states the default of {opt} ({dflt}): {line.strip()!r}")
        check("default: random" in h, "--help says the seed is random by default")
        check("-p,--prompt" in h and "-n,--max-new-tokens" in h, "-p and -n are aliases")
        check(h.rstrip().splitlines()[-1].strip().startswith("lattice generate") and "Examples:" in h,
              "--help ends with examples")
finally:
    shutil.rmtree(tmp, ignore_errors=True)

print(f"test_generate_io: {len(fails)} failed")
sys.exit(1 if fails else 0)
