#!/usr/bin/env python3
"""`lattice batch` end to end on the built-in SmolLM2 model (greedy, so every run must give the same
text): a 200-line input in Release, 40 under the sanitizers (each kind of line several times; every
extra line costs the sanitizer stage time, docs/testing.md) with bad lines mixed in (bad JSON, wrong types, empty prompt, a prompt
beyond the context, a line nested 100 deep, a line of 8 MiB, a line with custom_id but no body:
each an error record under its own custom_id);
  - one uninterrupted run is the reference: every valid id once with text, every bad one once as an
    error record;
  - killed with SIGKILL mid-run and rerun with the same --output until it completes: the same set
    of records, each id exactly once, the same texts (a partial last line is cut on resume);
  - the same with SIGTERM: the run drains, exits 75 (requests left) and says what is left; reruns
    finish the job and exit 0;
  - under mpirun -np 2 --pp 2, drained by SIGUSR1 to mpirun (exit 75) and resumed, the results equal
    the single-rank ones.
Records are checked field by field in OpenAI's Batch output format (check_result, check_error).
Every 8th line from the 3rd asks for one of three choices (guided_choice), every 8th from the 7th for a
JSON schema (response_format): their outputs are checked (and, resumed, equal the uninterrupted run's).
`format` (its own small inputs): both endpoints in Batch-format lines and bare bodies, and each kind of
bad line (method, url, JSON, custom_id: error records; a body serve refuses, an unknown "model": serve's
400 / 404 as the record's response, check_refusal), every record checked field by field; the same output
locked by another process, or with damaged lines in its middle, is refused (naming the pid, the line
numbers) and left as it was; the output is bound to its input (appended lines resume, an inserted line
is refused, --restart starts over: input_binding_part, restart_part); ids: an input where two lines
share an id (a repeated custom_id, or a custom_id "line-N" equal to a bare body's) is refused before the
model loads naming both lines, and a 15 MB line, a line with custom_id but no body and a line that
stops being JSON after its custom_id each get one record under their custom_id (ids_part); then
launch/slurm/batch.sbatch stopped by SIGTERM requeues itself (exit 75) and the rerun completes.
Usage: test_batch.py LATTICE_BINARY MODEL_GGUF [kill|drain|format]   (exit 0: pass)"""
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

lattice, model = sys.argv[1], sys.argv[2]
# kill: the reference run, then SIGKILL + resume; drain: the reference run, then SIGTERM + resume and pp 2
# drained by SIGUSR1 + resume (CTest runs the two as separate tests: together they took ~100 s under
# the sanitizers); all: both.
PART = sys.argv[3] if len(sys.argv) > 3 else "all"
fails = []
# 200 lines in the Release build (both endpoints, structured output, bad lines); the
# sanitizer build sets LATTICE_BATCH_LINES=40 (tests/launch/CMakeLists.txt) to stay within its budget.
N_LINES = int(os.environ.get("LATTICE_BATCH_LINES", "200"))
# At most 8 sequences in flight: a drain (SIGTERM, SIGUSR1) finishes those and leaves the rest of the
# lines for the rerun (with the default 64 every line would be in flight at once).
MAX_SEQS = "8"
EXIT_LEFT = 75  # a run stopped with requests left (launch/cmd_batch.cpp kExitRequestsLeft, EX_TEMPFAIL)


def check(ok, what):
    if not ok:
        fails.append(what)
        print("FAILED:", what)


CHOICES = ["yes", "no", "maybe"]
SCHEMA = {"type": "object", "required": ["answer"], "additionalProperties": False,
          "properties": {"answer": {"type": "string", "maxLength": 12}, "sure": {"type": "boolean"}}}


def check_structured(name, recs):
    """The structured lines of make_input: each output is one of CHOICES / an object of SCHEMA."""
    n = 0
    for k, r in recs.items():
        cid = json.loads(k)
        if not (isinstance(cid, str) and cid.startswith("req-")) or int(cid[4:]) % 8 not in (2, 6):
            continue
        if not r.get("response") or r["response"]["status_code"] != 200:  # a bad line (its own checks)
            continue
        i = int(cid[4:])
        text = answer(r)[0]
        try:
            obj = json.loads(text) if i % 8 == 6 else None
            ok = (text in CHOICES) if i % 8 == 2 else (isinstance(obj, dict) and set(obj) <= {"answer", "sure"}
                                                        and isinstance(obj["answer"], str) and len(obj["answer"]) <= 12)
        except (ValueError, KeyError):
            ok = False
        check(ok, f"{name}: structured output of {k}: {text!r}")
        n += 1
    check(n >= 6, f"{name}: only {n} structured outputs")


def make_input(path):
    lines, valid, bad = [], set(), set()
    words = ["The sea", "A quiet village", "Numbers", "Once upon a time", "The best way to learn"]
    for i in range(N_LINES):
        cid = f"req-{i}"
        if i % 23 == 5:
            lines.append("{not json at all")
            bad.add(f"line-{i + 1}")  # a line that is not JSON gets its line number as id
            continue
        if i % 23 == 11:
            lines.append(json.dumps({"custom_id": cid, "body": {"prompt": 17}}))
            bad.add(cid)
            continue
        if i % 23 == 17:
            lines.append(json.dumps({"custom_id": cid, "body": {"prompt": ""}}))
            bad.add(cid)
            continue
        if i == 30:
            lines.append(json.dumps({"custom_id": cid, "body": {"prompt": list(range(1, 9000)), "max_tokens": 2}}))
            bad.add(cid)
            continue
        if i == 38:  # a custom_id but no body: an error record under its own id
            lines.append(json.dumps({"custom_id": cid, "prompt": "no body"}))
            bad.add(cid)
            continue
        if i % 4 == 0:
            body = {"messages": [{"role": "user", "content": f"{words[i % 5]} number {i}?"}], "max_tokens": 6}
            url = "/v1/chat/completions"
        else:
            body = {"prompt": f"{words[i % 5]} {i}", "max_tokens": 4 + i % 5}
            url = "/v1/completions"
        if i % 8 == 2:  # structured output: one of the choices
            body["guided_choice"] = CHOICES
            body["max_tokens"] = 8
        elif i % 8 == 6:  # structured output: a JSON schema
            body = {"messages": body.get("messages", [{"role": "user", "content": body.get("prompt", "")}]),
                    "max_tokens": 40, "response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}}
            url = "/v1/chat/completions"
        body["temperature"] = 0
        body["return_token_ids"] = True
        lines.append(json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body}))
        valid.add(cid)
    # Over the per-line limits (as a request body's): nesting deeper than 64, more than 8 MiB. Neither
    # is parsed, yet each record carries the line's custom_id (found by a scan of the top-level members).
    lines.append(json.dumps({"custom_id": "deep", "body": {"prompt": "x"}}) [:-2] + ', "x": ' + "[" * 100 + "]" * 100 + "}}")
    bad.add("deep")
    lines.append(json.dumps({"custom_id": "big", "body": {"prompt": "x " * (4 << 20) + "y"}}))
    bad.add("big")
    # A bare body on the line whose number an integer custom_id names: both run (distinct ids).
    lines.append(json.dumps({"custom_id": len(lines) + 2, "body": {"prompt": "The sea", "max_tokens": 3,
                                                                  "temperature": 0, "return_token_ids": True}}))
    valid.add(len(lines) + 1)
    lines.append(json.dumps({"prompt": "The sea", "max_tokens": 3, "temperature": 0, "return_token_ids": True}))
    valid.add(f"line-{len(lines)}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return valid, bad


def run(args, inp, out, env=None, kill=None, after_lines=0, more=()):
    """Runs lattice batch (flags `more` added); with `kill`, sends that signal once the output holds
    `after_lines` lines."""
    cmd = args + ["batch", "--model", model, "--input", inp, "--output", out, "--threads", "2", "--progress", "none",
                  "--max-seqs", MAX_SEQS] + list(more)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if kill is not None:
        deadline = time.time() + 240
        while p.poll() is None and time.time() < deadline:
            n = sum(1 for _ in open(out)) if os.path.exists(out) else 0
            if n >= after_lines:
                os.kill(p.pid, kill)
                break
            time.sleep(0.05)
    try:
        so, se = p.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        p.kill()
        so, se = p.communicate()
        check(False, f"batch run did not end within 600 s: {cmd}")
    return p.returncode, se


def records(path):
    out = {}
    dup = []
    with open(path) as f:
        for line in f:
            assert line.endswith("\n"), "a line without its newline"
            j = json.loads(line)
            key = json.dumps(j["custom_id"])
            if key in out:
                dup.append(key)
            out[key] = j
    return out, dup


def verify(name, path, valid, bad, want=None):
    recs, dup = records(path)
    check(not dup, f"{name}: ids written twice: {dup[:5]}")
    keys = {json.dumps(v) for v in valid}
    bad_keys = {json.dumps(v) for v in bad}
    check(keys <= set(recs), f"{name}: missing results for {sorted(keys - set(recs))[:5]}")
    check(bad_keys <= set(recs), f"{name}: missing error records for {sorted(bad_keys - set(recs))[:5]}")
    for k in keys & set(recs):
        check_result(name, recs[k])
    for k in bad_keys & set(recs):  # a line that is no request: an error record; a body serve refuses: its 400
        check_refusal(name, recs[k], 400) if recs[k].get("response") else check_error(name, recs[k])
    if want is not None:
        for k in keys & set(recs):
            if k in want:
                check(answer(recs[k]) == answer(want[k]),
                      f"{name}: {k} differs from the uninterrupted run: {recs[k]} vs {want[k]}")
    return recs


def answer(rec):
    """(text, token ids) of a result record's response body."""
    ch = rec["response"]["body"]["choices"][0]
    return ch["message"]["content"] if "message" in ch else ch["text"], ch.get("token_ids")


def check_result(name, r):
    """A result record in OpenAI's Batch output format, as vLLM's run-batch writes it: field by field."""
    try:
        ok = set(r) == {"id", "custom_id", "response", "error"} and r["error"] is None
        ok = ok and r["id"].startswith("batch_req_") and set(r["response"]) == {"status_code", "request_id", "body"}
        ok = ok and r["response"]["status_code"] == 200 and r["response"]["request_id"].startswith("req_")
        b = r["response"]["body"]
        chat = b["object"] == "chat.completion"
        ok = ok and b["object"] in ("chat.completion", "text_completion")
        ok = ok and b["id"].startswith("chatcmpl-" if chat else "cmpl-") and isinstance(b["created"], int)
        ok = ok and isinstance(b["model"], str) and b["model"] and len(b["choices"]) == 1
        ch = b["choices"][0]
        ok = ok and ch["index"] == 0 and ch["finish_reason"] in ("stop", "length") and ch["logprobs"] is None
        if chat:
            ok = ok and ch["message"]["role"] == "assistant" and isinstance(ch["message"]["content"], str)
        else:
            ok = ok and isinstance(ch["text"], str)
        u = b["usage"]
        ok = ok and u["completion_tokens"] == len(ch.get("token_ids", [0] * u["completion_tokens"])) > 0
        ok = ok and u["prompt_tokens"] > 0
        ok = ok and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    except (KeyError, TypeError, AttributeError, IndexError) as e:
        ok = False
        r = f"{r} ({e!r})"
    check(ok, f"{name}: bad result record {r}")


def check_error(name, r, code=None, words=()):
    """An error record: {"id", "custom_id", "response": null, "error": {"code", "message"}}."""
    try:
        ok = set(r) == {"id", "custom_id", "response", "error"} and r["response"] is None
        ok = ok and r["id"].startswith("batch_req_") and set(r["error"]) == {"code", "message"}
        ok = ok and isinstance(r["error"]["code"], str) and r["error"]["code"] and r["error"]["message"]
        ok = ok and (code is None or r["error"]["code"] == code) and all(w in r["error"]["message"] for w in words)
    except (KeyError, TypeError, AttributeError) as e:
        ok = False
        r = f"{r} ({e!r})"
    check(ok, f"{name}: {r.get('custom_id') if isinstance(r, dict) else r} should be an error record"
              f"{' ' + code if code else ''} naming {words}: {r}")


def check_refusal(name, r, status, words=()):
    """A body serve refuses: {"id", "custom_id", "response": {"status_code", "request_id", "body": serve's
    error body}, "error": null}."""
    try:
        e = r["response"]["body"]["error"]
        ok = r["error"] is None and r["response"]["status_code"] == status and r["response"]["request_id"]
        ok = ok and set(e) == {"message", "type", "param", "code"} and all(w in e["message"] for w in words)
    except (KeyError, TypeError) as x:
        ok, r = False, f"{r} ({x!r})"
    check(ok, f"{name}: should be serve's {status} naming {words}: {r}")


def format_part(tmp):
    """Both endpoints, Batch-format lines and bare bodies, and each kind of bad line: every output line
    checked field by field."""
    inp, out = os.path.join(tmp, "fmt.jsonl"), os.path.join(tmp, "fmt-out.jsonl")
    done = {"prompt": "The sky is", "max_tokens": 3, "temperature": 0}
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}
    lines = [  # (line, custom_id, want: "text_completion" | "chat.completion" | an error code, words in it)
        # "model" is checked as serve checks it: an unknown one is serve's 404 (OpenAI's example model here).
        ({"custom_id": "cmp", "method": "POST", "url": "/v1/completions",
          "body": dict(done, model="gpt-3.5-turbo-0125")}, "cmp", 404, ("gpt-3.5-turbo-0125", "does not exist")),
        ({"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
          "body": dict(chat, return_token_ids=True)}, "chat", "chat.completion", ()),
        ({"custom_id": 7, "body": chat}, 7, "chat.completion", ()),  # no url: "messages" makes it a chat
        (done, "line-4", "text_completion", ()),
        (chat, "line-5", "chat.completion", ()),
        ({"custom_id": "get", "method": "GET", "url": "/v1/completions", "body": done}, "get", "invalid_method",
         ("line 6", '"method"', "GET")),
        ({"custom_id": "emb", "method": "POST", "url": "/v1/embeddings", "body": done}, "emb", "invalid_url",
         ("line 7", '"url"', "/v1/embeddings")),
        ("{not json", "line-8", "invalid_json", ("line 8",)),
        ({"custom_id": "nomsg", "method": "POST", "url": "/v1/chat/completions", "body": done}, "nomsg",
         400, ('"prompt"', "chat completion")),
        ({"custom_id": {"a": 1}, "body": done}, {"a": 1}, "invalid_custom_id", ("line 10", "custom_id")),
        # echo runs as in serve (the prompt's text before the output).
        ({"custom_id": "echo", "body": dict(done, echo=True)}, "echo", "text_completion", ()),
    ]
    with open(inp, "w") as f:
        f.write("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln, _, _, _ in lines))
    rc, err = run([lattice], inp, out)
    check(rc == 0, f"format: exits 0 (rc {rc}): {err[-500:]}")
    recs, dup = records(out)
    check(not dup and len(recs) == len(lines), f"format: {len(recs)} records for {len(lines)} lines, twice: {dup}")
    for _, cid, want, words in lines:
        r = recs.get(json.dumps(cid))
        if r is None:
            check(False, f"format: no record for {cid}")
        elif want in ("text_completion", "chat.completion"):
            check_result("format", r)
            b = r["response"]["body"]
            check(b.get("object") == want, f"format: {cid}: object {b.get('object')}, want {want}")
            check(("token_ids" in b["choices"][0]) == (cid == "chat"), f"format: {cid}: token_ids only when asked: {b}")
            check(b.get("model") == "SmolLM2-135M-Instruct.Q4_1.gguf", f"format: {cid}: model {b.get('model')}")
            check(cid != "echo" or b["choices"][0]["text"].startswith("The sky is"), f"format: echo: {b}")
        elif isinstance(want, int):
            check_refusal("format", r, want, words)
        else:
            check_error("format", r, want, words)
    ids = [r["id"] for r in recs.values()]
    check(len(set(ids)) == len(ids), f"format: record ids repeat: {ids}")
    input_binding_part(inp, out)

    # Another job holds the output (an fcntl lock, as lattice takes): refused, naming its pid, untouched.
    before = open(out).read()
    with open(out, "a") as held:
        fcntl.lockf(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        rc, err = run([lattice], inp, out)
    check(rc == 1 and "in use by another job" in err and f"pid {os.getpid()}" in err and open(out).read() == before,
          f"format: a locked output is refused naming the holder (rc {rc}): {err[-400:]}")
    # Damaged lines in the middle (not a torn tail, which a rerun cuts): refused, naming them; untouched.
    lines_out = before.splitlines(True)
    lines_out[2] = '{"custom_id": "cmp", "resp\n'
    lines_out[5] = "\0\0\0\0\n"
    damaged = "".join(lines_out)
    with open(out, "w") as f:
        f.write(damaged)
    rc, err = run([lattice], inp, out)
    check(rc == 1 and "line 3 is not a batch record (nor is line 6)" in err and open(out).read() == damaged,
          f"format: damaged lines 3 and 6 are refused by number, the file kept (rc {rc}): {err[-400:]}")
    restart_part(inp, out)


def ids_part(tmp):
    """Ids are unique within an input or it is refused before the model loads, naming both lines; every
    line gets one record under its own custom_id, however broken the rest of the line."""
    inp, out = os.path.join(tmp, "ids.jsonl"), os.path.join(tmp, "ids-out.jsonl")
    done = {"prompt": "The sky is", "max_tokens": 2, "temperature": 0}
    refusals = [  # (lines, words the refusal must hold)
        ([done, {"custom_id": "line-1", "body": done}], ("lines 1 and 2", '"line-1"', "bare", "custom_id")),
        ([{"custom_id": "a", "body": done}, done, {"custom_id": "a", "body": done}], ("lines 1 and 3", '"a"')),
        ([{"custom_id": 5, "body": done}, "", {"custom_id": 5, "prompt": "no body"}], ("lines 1 and 3", " 5")),
    ]
    for lines, words in refusals:
        with open(inp, "w") as f:
            f.write("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
        if os.path.exists(out):
            os.unlink(out)
        t0 = time.time()
        # A model that does not exist: the refusal comes first, before any load.
        cmd = [lattice, "batch", "--model", os.path.join(tmp, "no-such-model.gguf"), "--input", inp, "--output", out]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        ok = p.returncode == 1 and all(w in p.stderr for w in words) and "no-such-model" not in p.stderr
        check(ok, f"ids: {lines} refused naming both lines before the model loads (rc {p.returncode}): {p.stderr[-400:]}")
        check(not os.path.exists(out) or os.path.getsize(out) == 0, "ids: a refused input writes no record")
        check(time.time() - t0 < 60, "ids: the refusal is immediate")
    # One record per line under its own custom_id: a 15 MB line whose id comes first, a line with
    # custom_id but no body, a line that stops being JSON after its custom_id, an integer id equal to
    # a later bare body's line number (distinct: 4 is not "line-4").
    lines = [('{"custom_id": "huge", "body": {"prompt": "' + "x " * (15 << 19) + '"}}', "huge", "request_too_large",
              ("line 1", "bytes")),
             ({"custom_id": "nobody", "prompt": "x"}, "nobody", "invalid_request", ("line 2", '"body"')),
             ('{"custom_id": "broken", "body": {"prompt": ', "broken", "invalid_json", ("line 3",)),
             ({"custom_id": 4, "body": done}, 4, "text_completion", ()),
             (done, "line-5", "text_completion", ())]
    with open(inp, "w") as f:
        f.write("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln, _, _, _ in lines))
    os.unlink(out) if os.path.exists(out) else None
    rc, err = run([lattice], inp, out)
    check(rc == 0, f"ids: exits 0 (rc {rc}): {err[-500:]}")
    recs, dup = records(out)
    check(not dup and len(recs) == len(lines), f"ids: {len(recs)} records for {len(lines)} lines: {sorted(recs)}")
    for _, cid, want, words in lines:
        r = recs.get(json.dumps(cid))
        if r is None:
            check(False, f"ids: no record under {cid!r}: {sorted(recs)}")
        elif want == "text_completion":
            check_result("ids", r)
        else:
            check_error("ids", r, want, words)


def input_binding_part(inp, out):
    """On format_part's finished run: the output is bound to its input (OUTPUT.input). A line
    appended at the end resumes (the old records kept byte for byte, only the new line runs); the case the
    binding exists for, a line inserted at the top (a bare body, so every later "line-N" shifts) and a rerun on
    the same --output, is refused naming both files, nothing changed; an output whose fingerprint is missing or
    damaged is refused. Leaves the input with the inserted line (restart_part runs it)."""
    side = out + ".input"
    check(os.path.exists(side), f"bind: the run wrote {side}")
    first = open(out).read()
    with open(inp, "a") as f:
        f.write(json.dumps({"prompt": "The sky is", "max_tokens": 3, "temperature": 0}) + "\n")
    rc, err = run([lattice], inp, out)
    recs, dup = records(out)
    new = recs.get('"line-12"', {}).get("response") or {}
    check(rc == 0 and "1 line(s) appended at its end" in err and open(out).read().startswith(first) and not dup
          and "batch: 12 of 12 requests done (0 errors, 11 from earlier runs)" in err
          and len(recs) == 12 and new.get("body", {}).get("object") == "text_completion",
          f"bind: a line appended at the end resumes, only it runs (rc {rc}, {len(recs)} records): {err[-300:]}")
    before, before_side = open(out).read(), open(side).read()
    with open(inp) as f:
        text = f.read()
    with open(inp, "w") as f:  # the case the binding exists for: a line inserted at the top
        f.write(json.dumps({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3, "temperature": 0})
                + "\n" + text)
    rc, err = run([lattice], inp, out)
    check(rc == 1 and f"--input {inp} is not the input the results in --output {out} came from" in err
          and "a line inserted, edited or removed" in err and "--restart" in err and "new --output" in err
          and open(out).read() == before and open(side).read() == before_side,
          f"bind: an inserted line is refused naming both files, nothing changed (rc {rc}): {err[-500:]}")
    os.rename(side, side + ".away")
    rc, err = run([lattice], inp, out)
    check(rc == 1 and f"there is no {side} beside it" in err and open(out).read() == before,
          f"bind: results without their fingerprint are refused (rc {rc}): {err[-300:]}")
    with open(side, "w") as f:
        f.write('{"format": "lattice-batch-input", "version": 1, "bytes": "many"}\n')
    rc, err = run([lattice], inp, out)
    check(rc == 1 and f"{side}: not a lattice batch input fingerprint" in err and open(out).read() == before,
          f"bind: a damaged fingerprint is refused (rc {rc}): {err[-300:]}")
    os.replace(side + ".away", side)


def restart_part(inp, out):
    """--restart on an output with damaged lines and an edited input: the output is emptied and the edited
    input runs whole, each "line-N" its own line's request (the inserted line-1 a chat, the old bare
    lines 4, 5 and 12 now 5, 6 and 13, the bad JSON line 9)."""
    rc, err = run([lattice], inp, out, more=["--restart"])
    recs, dup = records(out)
    want = {"chat": "chat.completion", 7: "chat.completion", "line-1": "chat.completion",
            "line-5": "text_completion", "line-6": "chat.completion", "line-13": "text_completion",
            "echo": "text_completion", "get": "invalid_method", "emb": "invalid_url", "line-9": "invalid_json",
            "nomsg": 400, "cmp": 404, json.dumps({"a": 1}): "invalid_custom_id"}
    got = {}
    for k, r in recs.items():
        key = json.loads(k)
        key = json.dumps(key) if isinstance(key, dict) else key
        got[key] = (r["response"]["body"].get("object") or r["response"]["status_code"]) if r.get("response") \
            else r["error"]["code"]
    check(rc == 0 and "--restart: discarded the 12 lines" in err and not dup and got == want,
          f"restart: the edited input runs whole (rc {rc}): {got} {err[-300:]}")


def sbatch_part(tmp):
    """launch/slurm/batch.sbatch as a plain script (CPU ranks) with SLURM_JOB_ID set and a stand-in
    `scontrol` that records its arguments: SIGTERM to the script drains lattice, which exits 75, and
    the script requeues the job (`scontrol requeue ID`) and exits 75; the requeued run (restart 1)
    finishes every id exactly once, exits 0 and does not requeue."""
    inp, out = os.path.join(tmp, "sb.jsonl"), os.path.join(tmp, "sb-out.jsonl")
    n = 40  # the engine client admits up to 16 waiting requests beyond --max-seqs: a drain finishes those
    with open(inp, "w") as f:
        for i in range(n):
            f.write(json.dumps({"custom_id": f"s{i}", "method": "POST", "url": "/v1/completions",
                                "body": {"prompt": f"Once upon a time {i}", "max_tokens": 4, "temperature": 0}}) + "\n")
    fake = os.path.join(tmp, "bin")
    os.makedirs(fake)
    calls = os.path.join(tmp, "scontrol.calls")
    with open(os.path.join(fake, "scontrol"), "w") as f:
        f.write(f'#!/bin/sh\necho "$@" >> {calls}\n')
    os.chmod(os.path.join(fake, "scontrol"), 0o755)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, REPO=repo, MODEL=model, INPUT=inp, OUTPUT=out, TP="1", PP="1", CPU_RANKS="1",
               LATTICE=lattice, SLURM_JOB_ID="4242", DRAIN_SECONDS="60", PATH=fake + ":" + os.environ["PATH"],
               EXTRA_ARGS="--threads 2 --progress none --max-seqs 2")
    cmd = ["bash", os.path.join(repo, "launch", "slurm", "batch.sbatch")]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 240
    while p.poll() is None and time.time() < deadline:
        if os.path.exists(out) and sum(1 for _ in open(out)) >= 2:
            p.send_signal(signal.SIGTERM)
            break
        time.sleep(0.05)
    so, se = p.communicate(timeout=600)
    got = open(calls).read() if os.path.exists(calls) else ""
    check(p.returncode == EXIT_LEFT and got == "requeue 4242\n",
          f"sbatch: SIGTERM: exit {p.returncode}, scontrol calls {got!r}: {so[-300:]} {se[-500:]}")
    left = sum(1 for _ in open(out))
    check(left < n, f"sbatch: SIGTERM came before the end ({left} of {n})")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(env, SLURM_RESTART_COUNT="1"))
    got = open(calls).read() if os.path.exists(calls) else ""
    check(p.returncode == 0 and got == "requeue 4242\n",
          f"sbatch: the requeued run exits 0 without requeueing (rc {p.returncode}, calls {got!r}): {p.stderr[-500:]}")
    recs, dup = records(out)
    check(not dup and set(recs) == {json.dumps(f"s{i}") for i in range(n)}, f"sbatch: ids {sorted(recs)}, twice {dup}")
    for r in recs.values():
        check_result("sbatch", r)


with tempfile.TemporaryDirectory() as tmp:
    if PART == "format":
        format_part(tmp)
        ids_part(tmp)
        sbatch_part(tmp)
        print(f"test_batch: {len(fails)} failures")
        sys.exit(1 if fails else 0)
    inp = os.path.join(tmp, "in.jsonl")
    valid, bad = make_input(inp)
    ref = os.path.join(tmp, "ref.jsonl")
    rc, err = run([lattice], inp, ref)
    check(rc == 0, f"uninterrupted run exits 0 (rc {rc}): {err[-500:]}")
    want = verify("uninterrupted", ref, valid, bad)
    check(len(want) == len(valid) + len(bad), f"uninterrupted: {len(want)} records for {len(valid) + len(bad)} ids")
    check_structured("uninterrupted", want)

    if PART in ("all", "kill"):
        # SIGKILL mid-run, then reruns until one completes.
        out = os.path.join(tmp, "killed.jsonl")
        rounds = 0
        while rounds < 16:
            rounds += 1
            before = sum(1 for _ in open(out)) if os.path.exists(out) else 0
            rc, err = run([lattice], inp, out, kill=signal.SIGKILL, after_lines=before + max(16, N_LINES // 8))
            if rc == 0:
                break
            check(rc == -signal.SIGKILL, f"SIGKILL round {rounds}: rc {rc}: {err[-300:]}")
            # Simulate a node lost mid-write on one round: a partial line at the end.
            if rounds == 2:
                with open(out, "a") as f:
                    f.write('{"custom_id": "req-9", "text": "half a li')
        check(rounds >= 2, "the SIGKILL test never killed a run (the runs finished too fast)")
        verify("SIGKILL + resume", out, valid, bad, want)

    if PART in ("all", "drain"):
        # SIGTERM: drains, exits 0, says what is left; reruns finish.
        out = os.path.join(tmp, "term.jsonl")
        rc, err = run([lattice], inp, out, kill=signal.SIGTERM, after_lines=10)
        check(rc == EXIT_LEFT, f"SIGTERM run exits {EXIT_LEFT} (rc {rc}): {err[-500:]}")
        check("stopped by signal 15" in err and "rerun with the same --output" in err,
              f"SIGTERM run says what is left: {err[-300:]}")
        n_after = sum(1 for _ in open(out))
        check(n_after < len(want), f"SIGTERM came before the end ({n_after} of {len(want)} records)")
        rc, err = run([lattice], inp, out)
        # Every line is one request with its own id (an input repeating an id is refused up front).
        check(rc == 0 and "from earlier runs" in err and f"batch: {len(want)} of {len(want)} requests done" in err,
              f"resume after SIGTERM: rc {rc}, every request counted done: {err[-300:]}")
        verify("SIGTERM + resume", out, valid, bad, want)

        # Two pipeline stages under mpirun: the same results.
        mpirun = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2"]
        if os.geteuid() == 0:
            mpirun.append("--allow-run-as-root")
        out = os.path.join(tmp, "pp2.jsonl")
        cmd = mpirun + [lattice, "batch", "--model", model, "--input", inp, "--output", out, "--threads", "1", "--pp",
                        "2", "--progress", "none", "--max-seqs", MAX_SEQS]
        # SIGUSR1 to mpirun (which forwards it to every rank) drains the job; a rerun finishes it.
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 300
        while p.poll() is None and time.time() < deadline:
            if os.path.exists(out) and sum(1 for _ in open(out)) >= 10:
                p.send_signal(signal.SIGUSR1)
                break
            time.sleep(0.05)
        so, se = p.communicate(timeout=600)
        check(p.returncode == EXIT_LEFT and "stopped by signal 10" in se,
              f"pp 2 drain on SIGUSR1 exits {EXIT_LEFT} (rc {p.returncode}): {se[-500:]}")
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        check(p.returncode == 0, f"pp 2 resume exits 0 (rc {p.returncode}): {p.stderr[-500:]}")
        verify("pp 2", out, valid, bad, want)

print(f"test_batch: {len(fails)} failures")
sys.exit(1 if fails else 0)
