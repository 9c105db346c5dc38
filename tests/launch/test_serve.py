#!/usr/bin/env python3
"""`lattice serve` end to end, on loopback only (every server binds 127.0.0.1, port 0), with curl, raw
HTTP and the official `openai` client (from the venv scripts/setup.sh makes). Greedy everywhere, so
every output is checked against `lattice generate` or the golden continuations:
  1. golden tiny-llama2 (no tokenizer, prompts as ids): completions streamed and not equal the golden
     greedy ids and `lattice generate`; chat refused (no tokenizer); SIGTERM exits 0.
  2. the built-in SmolLM2 with an API key: completions and chat, streamed and not, through curl and
     openai, equal `lattice generate` (ids and text); stop strings; /v1/models; every bad input gets
     its status and an OpenAI error body (400 malformed JSON / wrong types / empty messages / prompt
     beyond the context, 401, 404 model and path, 405, 413); 32 concurrent streaming clients (16
     prompts, twice each) get the tokens of their prompts' single runs; /metrics counts them; SIGTERM during a stream: the stream
     finishes, while /health answers 503 "draining" with Retry-After and a new completion 503; exit 0.
  3. --max-seqs 1 --max-queue 1: a running stream, a waiting request, then 503; the stream's client
     disconnects: its blocks return to the pool (/metrics) and the waiting request runs.
  4. launch/slurm/serve.sbatch run as a script with PP=2 on CPU ranks (built-in) and mpirun -np 2 --tp 2
     (golden): the same outputs; SIGTERM to the template and SIGUSR1 to mpirun drain, exit 0.
  6. (part "choices") logprobs and top_logprobs (completions, chat, streamed = not streamed) equal the score
     path's (echo with max_tokens 0) to 1e-4 and are sorted; n 4 at temperature 1 with a seed: 4 different
     answers, the same twice, the siblings' prompt blocks from the prefix cache; best_of 3 picks the highest
     cumulative logprob; a list of 3 prompts: 3 choices in order; unknown fields, best_of with stream and
     max_tokens beyond the context are 400 naming the field.
  7. (part "structured") structured output on the built-in model at temperature 1: a json_schema (chat, through
     the openai client, n 50): every output parses and validates with jsonschema and ends by "stop"; json_object;
     guided_regex (re.fullmatch), guided_choice (one of them); tools with tool_choice named / "required": one
     call whose arguments validate (streamed: the same call in one delta), "none": text; the same in a `lattice
     batch` file (and a line of 2 prompts x n 2 equal to the server's answer); an unsupported keyword, a bad regex,
     two constraints at once, an unknown tool are 400s naming the culprit; --kv-cache-gb 0.02 (29 blocks): /v1/models
     advertises a max_model_len the cache holds and a chat without max_tokens runs.
  5. (part "fronts") the same three requests (ended by length, by a stop string, a chat) through
     `generate --json`, `batch` and serve give the same ids, text, finish reason and usage.
Without the openai package the same requests and checks go through http.client (serve_harness.Api), so the test
never skips for want of it. Every server runs in its own process group and is killed (group and all) when
the test fails or stops; each wait is bounded.
  8. (part "drain") a chat template render of seconds (tiny-llama2, a small tokenizer): /health and /metrics
     answer while it runs; SIGTERM during it interrupts it (503) and the server exits 0 within --drain-seconds.
Usage: test_serve.py LATTICE_BINARY MODEL_GGUF SHARED_DIR [api|choices|structured|fronts|drain|all]   (exit 0: pass)"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import serve_harness
from serve_harness import ApiError, check, cleanup, finish, openai

lattice, builtin, shared = sys.argv[1], sys.argv[2], sys.argv[3]
# api: sections 1-4; choices: section 6; fronts: section 5 (CTest runs them as three tests: api and fronts
# together took 125 s under the sanitizers, over the 120 s per test of scripts/test_budget.conf, and api
# alone is near it); all: every one.
PART = sys.argv[4] if len(sys.argv) > 4 else "all"
golden = os.path.join(shared, "golden", "tiny-llama2")
KEY = "test-key-0123456789"


class Server(serve_harness.Server):
    """`lattice serve --port 0` with `args` (or `cmd` as given), its error bodies scanned for the models' paths."""

    def __init__(self, args, mpirun_np=0, env=None, cmd=None):
        super().__init__(cmd or [lattice, "serve", "--port", "0", "--comm-timeout", "30"] + args, mpirun_np, env,
                         leak_paths=(builtin, golden))


def Api(port, key):
    return serve_harness.Api(port, key, leak_paths=(builtin, golden))


def generate(model, args, mpirun=None):
    cmd = [lattice, "generate", "--model", model, "--temperature", "0", "--print-ids"] + args
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, f"generate {args}: {r.stderr[-300:]}")
    return [int(x) for x in r.stdout.split()]


def generate_json(model, args):
    cmd = [lattice, "generate", "--model", model, "--temperature", "0", "--json", "--threads", "2"] + args
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, f"generate --json {args}: {r.stderr[-300:]}")
    return json.loads(r.stdout.splitlines()[0]) if r.returncode == 0 else {}


def spaced_word(text):
    """' word' for a word of `text` from its middle on that follows a space (a word after a newline has
    none before it), or None: a stop string the text holds."""
    words = text.split()
    spaced = [w for w in words[len(words) // 2:] + words[:len(words) // 2] if " " + w in text]
    return " " + spaced[0] if spaced else None


def three_fronts(s, auth, model, prompt, question):
    """One request each (a completion ended by its length, one by a stop string, a chat ended by the
    model) through `generate --json`, `batch` and serve: the same ids, text, finish reason and usage
    (the fronts share the engine client). Returns generate's outputs."""
    first = generate_json(model, ["--prompt", prompt, "-n", "20"])
    stop = spaced_word(first.get("text", "")) or " the"  # a stop string the text holds
    cases = [("length", {"prompt": prompt, "max_tokens": 20}, ["--prompt", prompt, "-n", "20"]),
             ("stop", {"prompt": prompt, "max_tokens": 20, "stop": [stop]}, ["--prompt", prompt, "-n", "20", "--stop", stop]),
             ("chat", {"messages": [{"role": "user", "content": question}], "max_tokens": 24},
              ["--prompt", question, "--chat", "-n", "24"])]
    gens = {name: first if name == "length" else generate_json(model, args) for name, _, args in cases}
    d = tempfile.mkdtemp(dir=os.environ.get("TMPDIR"))
    inp, out = os.path.join(d, "in.jsonl"), os.path.join(d, "out.jsonl")
    with open(inp, "w") as f:
        for name, body, _ in cases:
            f.write(json.dumps({"custom_id": name, "body": dict(body, temperature=0, return_token_ids=True)}) + "\n")
    r = subprocess.run([lattice, "batch", "--model", model, "--threads", "2", "--input", inp, "--output", out,
                        "--progress", "none"], capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, f"batch: {r.stderr[-300:]}")
    batch = {}
    for j in map(json.loads, open(out).read().splitlines()) if r.returncode == 0 else []:
        b = (j.get("response") or {}).get("body", {})  # OpenAI's Batch output format: the server's body
        ch = b.get("choices", [{}])[0]
        batch[j["custom_id"]] = {"token_ids": ch.get("token_ids"), "finish_reason": ch.get("finish_reason"),
                                 "text": ch["message"]["content"] if "message" in ch else ch.get("text"),
                                 "usage": {k: b.get("usage", {}).get(k) for k in ("prompt_tokens", "completion_tokens")}}
    for name, body, _ in cases:
        chat = "messages" in body
        st, _, raw = s.request("POST", "/v1/chat/completions" if chat else "/v1/completions",
                               dict(body, temperature=0, return_token_ids=True), auth)
        j = json.loads(raw) if st == 200 else {}
        ch = j.get("choices", [{}])[0]
        served = {"token_ids": ch.get("token_ids"), "finish_reason": ch.get("finish_reason"),
                  "text": ch["message"]["content"] if chat and "message" in ch else ch.get("text"),
                  "usage": {k: j.get("usage", {}).get(k) for k in ("prompt_tokens", "completion_tokens")}}
        g, b = gens.get(name, {}), batch.get(name, {})
        for key in ("token_ids", "text", "finish_reason", "usage"):
            check(st == 200 and g.get(key) == b.get(key) == served[key],
                  f"{name}: {key}: generate {g.get(key)!r}, batch {b.get(key)!r}, serve {served[key]!r} ({st})")
        check(g.get("finish_reason") == ("stop" if name == "stop" else g.get("finish_reason")),
              f"{name}: finish {g.get('finish_reason')}")
    return gens


def fronts_section():
    s = Server(["--model", builtin, "--threads", "2", "--served-model-name", "smol"],
               env=dict(os.environ, LATTICE_API_KEY=KEY))
    three_fronts(s, {"Authorization": f"Bearer {KEY}"}, builtin, "The three most common colors of flowers are",
                 "What is the capital of France?")
    s.stop(signal.SIGTERM, "fronts server")


def uncached(usage):
    """usage without prompt_tokens_details (what the prefix cache held differs between runs)."""
    return {k: v for k, v in usage.items() if k != "prompt_tokens_details"}


def stream_ids(events):
    ids, text, finish = [], "", None
    for e in events:
        if e == "[DONE]" or not e["choices"]:
            continue
        ch = e["choices"][0]
        ids += ch.get("token_ids", [])
        text += ch.get("text", "") or (ch.get("delta", {}).get("content") or "")
        finish = ch["finish_reason"] or finish
    return ids, text, finish


def error_body(status, body, what, want):
    ok = check(status == want, f"{what}: status {status}, want {want}: {body[:200]}")
    try:
        e = json.loads(body)["error"]
        ok = check(isinstance(e["message"], str) and e["message"] and "type" in e and "param" in e and "code" in e,
                   f"{what}: error body {body[:200]}") and ok
        return e
    except (ValueError, KeyError, TypeError):
        check(False, f"{what}: not an OpenAI error body: {body[:200]}")
        return {}


def bad_command_lines():
    for args, what, env in ((["--max-queue", "0"], "--max-queue", {}), (["--port", "70000"], "--port", {}),
                            (["--host", "192.0.2.1", "--port", "0"], "cannot listen on 192.0.2.1", {}),
                            (["--api-key", ""], "empty --api-key", {}),
                            ([], "LATTICE_API_KEY is set but empty", {"LATTICE_API_KEY": ""})):
        try:
            r = subprocess.run([lattice, "serve", "--model", golden] + args, capture_output=True, text=True, timeout=120,
                               env=dict(os.environ, **env))
            check(r.returncode != 0 and what in r.stderr, f"serve {args}: exit {r.returncode}: {r.stderr[-300:]}")
        except subprocess.TimeoutExpired:
            check(False, f"serve {args} did not exit")


def golden_section():
    cases = json.load(open(os.path.join(golden, "expected.json")))["cases"]
    s = Server(["--model", golden, "--threads", "1"])
    st, _, body = s.request("GET", "/v1/models")
    check(st == 200 and json.loads(body)["data"][0]["id"] == "tiny-llama2", f"golden /v1/models: {body}")
    for i, case in enumerate(cases[:2]):
        want = case["greedy_ids"][:24]
        gen = generate(golden, ["--prompt-ids", ",".join(map(str, case["prompt_ids"])), "--max-new-tokens", "24",
                                "--ignore-eos", "--threads", "1"])
        check(gen == want, f"golden case {i}: generate {gen} != golden {want}")
        req = {"model": "tiny-llama2", "prompt": case["prompt_ids"], "max_tokens": 24, "temperature": 0,
               "ignore_eos": True}
        st, _, body = s.request("POST", "/v1/completions", req)
        j = json.loads(body) if st == 200 else {}
        check(st == 200 and j["choices"][0]["token_ids"] == want and j["choices"][0]["finish_reason"] == "length"
              and j["usage"] == {"prompt_tokens": len(case["prompt_ids"]), "completion_tokens": 24,
                                 "total_tokens": len(case["prompt_ids"]) + 24,
                                 "prompt_tokens_details": j["usage"].get("prompt_tokens_details")}
              and isinstance(j["usage"]["prompt_tokens_details"]["cached_tokens"], int),
              f"golden case {i} completion: {st} {body[:300]}")
        ids, _, finish = stream_ids(s.stream("/v1/completions", dict(req, stream=True)))
        check(ids == want and finish == "length", f"golden case {i} stream: {ids} {finish}")
    st, _, body = s.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    error_body(st, body, "chat without a tokenizer", 400)
    s.stop()


def choices_and_logprobs(s, client, auth):
    """logprobs, top_logprobs, echo, n, best_of and lists of prompts on the built-in model (one server)."""
    t0 = time.time()
    P = "/v1/completions"
    ids = lambda body: json.loads(s.request("POST", P, dict(body, return_token_ids=True), auth)[2])
    # Greedy with logprobs 5: the chosen token is the most likely, so it is the first of its top_logprobs.
    prompt = "The three most common colors of flowers are"
    c = ids({"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 5})
    ch = c["choices"][0]
    lp = ch["logprobs"]
    check(len(lp["tokens"]) == len(ch["token_ids"]) == 6 and len(lp["token_logprobs"]) == 6
          and lp["text_offset"][0] == 0 and "".join(lp["tokens"]) == ch["text"], f"completion logprobs {lp}")
    for i, (tok, top) in enumerate(zip(lp["tokens"], lp["top_logprobs"])):
        vals = list(top.values())
        check(len(top) == 5 and vals == sorted(vals, reverse=True) and list(top)[0] == tok
              and abs(top[tok] - lp["token_logprobs"][i]) < 1e-6 and all(v <= 0 for v in vals),
              f"top_logprobs {i}: {top} for {tok!r}")
    # The same tokens scored (echo, max_tokens 0: the score path, a log-softmax of the prefill's logits)
    # give the same logprobs and alternatives to 1e-4.
    e = ids({"prompt": prompt_ids(s, auth, prompt) + ch["token_ids"], "max_tokens": 0,
             "echo": True, "logprobs": 5})
    elp = e["choices"][0]["logprobs"]
    check(elp["token_logprobs"][0] is None and elp["top_logprobs"][0] is None, f"echo: first token {elp}")
    check(e["usage"]["completion_tokens"] == 0 and e["choices"][0]["text"].endswith(ch["text"]), f"echo {e}")
    for i in range(6):
        got, want = elp["top_logprobs"][-6 + i], lp["top_logprobs"][i]
        check(abs(elp["token_logprobs"][-6 + i] - lp["token_logprobs"][i]) < 1e-4
              and set(got) == set(want) and all(abs(got[k] - want[k]) < 1e-4 for k in want),
              f"scored logprobs {i}: {got} != generated {want}")
    # Streamed logprobs equal the non-streamed ones.
    chunks = [k for k in s.stream(P, {"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 5,
                                      "stream": True}, auth) if k != "[DONE]" and k["choices"]]
    slp = [x for k in chunks for x in (k["choices"][0]["logprobs"] or {}).get("token_logprobs", [])]
    check(slp == lp["token_logprobs"], f"streamed logprobs {slp} != {lp['token_logprobs']}")
    # Chat: logprobs true, top_logprobs 3 through the openai client.
    r = client.create("chat", model="smol", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0,
                      logprobs=True, top_logprobs=3)
    content = r["choices"][0]["logprobs"]["content"]
    check(len(content) == 4 and all(len(x["top_logprobs"]) == 3 and x["top_logprobs"][0]["token"] == x["token"]
                                    and bytes(x["bytes"]).decode("utf-8", "replace") == x["token"] for x in content)
          and "".join(x["token"] for x in content) == r["choices"][0]["message"]["content"], f"chat logprobs {content}")
    # n 4 at temperature 1 with a seed: 4 different answers, the same on a second call; siblings share the
    # prompt's full KV blocks (the prefix cache serves them).
    before = s.metrics()["lattice:prefix_cache_hits_total"]
    long_prompt = "Once upon a time in a land far away there lived a king who had three daughters and a castle by the sea"
    n4 = [ids({"prompt": long_prompt, "max_tokens": 8, "temperature": 1, "seed": 11, "n": 4, "logprobs": 0})
          for _ in range(2)]
    texts = [[c["text"] for c in sorted(r["choices"], key=lambda c: c["index"])] for r in n4]
    check(len(set(texts[0])) == 4 and texts[0] == texts[1] and [c["index"] for c in n4[0]["choices"]] == [0, 1, 2, 3],
          f"n 4: {texts}")
    plen = n4[0]["usage"]["prompt_tokens"]
    check(n4[0]["usage"]["completion_tokens"] == 32 and plen > 16, f"n 4 usage {n4[0]['usage']}")
    hits = s.metrics()["lattice:prefix_cache_hits_total"] - before
    check(hits >= 2 * 3 * (plen // 16) * 16, f"n 4: {hits} prompt tokens from the prefix cache")
    print(f"  n 4: {hits:.0f} prompt tokens of the siblings from the prefix cache ({plen} per prompt)", flush=True)
    # best_of 3, n 1: one choice, the best of seeds 11..13 (n 4's first three) by cumulative logprob.
    b = ids({"prompt": long_prompt, "max_tokens": 8, "temperature": 1, "seed": 11, "n": 1, "best_of": 3})
    sums = [(sum(c["logprobs"]["token_logprobs"]), c["text"]) for c in n4[0]["choices"][:3]]
    check(len(b["choices"]) == 1 and b["choices"][0]["text"] == max(sums)[1], f"best_of 3: {b['choices']} of {sums}")
    # A list of 3 prompts: 3 choices in order, each its prompt's single answer.
    three = ["The sea", "A red", "My dog"]
    r = client.create("completions", model="smol", prompt=three, max_tokens=3, temperature=0)
    singles = [client.create("completions", model="smol", prompt=p, max_tokens=3, temperature=0) for p in three]
    check([c["index"] for c in r["choices"]] == [0, 1, 2]
          and [c["text"] for c in r["choices"]] == [x["choices"][0]["text"] for x in singles]
          and r["usage"]["prompt_tokens"] == sum(x["usage"]["prompt_tokens"] for x in singles), f"3 prompts: {r}")
    # Refusals naming the field: unknown, best_of with stream, max_tokens beyond the context.
    for body, field in (({"frobnicate": 1}, "frobnicate"), ({"best_of": 2, "stream": True}, "best_of"),
                        ({"max_tokens": 5000}, "max_tokens")):
        e = error_body(*s.request("POST", P, dict({"prompt": "x"}, **body), auth)[::2], f"refused {field}", 400)
        check(e.get("param") == field and field in e.get("message", ""), f"refusal names {field}: {e}")
    print(f"  logprobs, echo, n, best_of, prompt lists: {time.time() - t0:.1f} s", flush=True)


PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 20}, "age": {"type": "integer"},
                         "city": {"enum": ["Paris", "Rome", "Tokyo"]},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
                         "address": {"type": "object", "required": ["zip"],
                                     "properties": {"zip": {"type": "string", "maxLength": 6},
                                                    "main": {"type": "boolean"}}}}}


def structured_section(s, client):
    """Structured output: every sampled output matches its constraint (response_format, guided_*)."""
    import jsonschema
    t0 = time.time()
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    r = client.create("chat", model="smol", messages=[{"role": "user", "content": "Describe a person as JSON."}],
                      max_tokens=160, temperature=1, seed=5, n=50, response_format=fmt)
    outs = [(c["message"]["content"], c["finish_reason"]) for c in r["choices"]]
    valid = 0
    for text, why in outs:
        try:
            jsonschema.validate(json.loads(text), PERSON)
            valid += why == "stop"
        except Exception as e:  # noqa: BLE001 (any failure is a failed check, reported with the text)
            check(False, f"json_schema output does not validate ({e.__class__.__name__}): {text!r}")
    check(len(outs) == 50 and valid == 50, f"json_schema: {valid} of {len(outs)} outputs valid and stopped")
    check(len({t for t, _ in outs}) > 10, f"json_schema: temperature 1 gave only {len({t for t, _ in outs})} outputs")
    print(f"  json_schema: {valid} of 50 valid ({time.time() - t0:.1f} s); e.g. {outs[0][0]}", flush=True)
    # json_object at temperature 1: free strings would run on, but near max_tokens the mask keeps only tokens
    # that close the document (the scheduler's finishing mask), so all 6 end by "stop" and parse.
    r = client.create("completions", model="smol", prompt="A JSON object:", max_tokens=120, temperature=1, seed=3,
                      n=6, extra_body={"response_format": {"type": "json_object"}})
    stopped = [c for c in r["choices"] if c["finish_reason"] == "stop"]
    check(len(stopped) == 6, f"json_object: only {len(stopped)} of 6 ended within 120 tokens")
    for c in stopped:
        ok = False
        try:
            ok = isinstance(json.loads(c["text"]), dict)
        except ValueError:
            pass
        check(ok, f"json_object output: {c['text']!r}")
    regex = r"[0-9]{3}-[a-z]{2,5}(\.[a-z]+)?"
    r = client.create("completions", model="smol", prompt="A code:", max_tokens=30, temperature=1, seed=4, n=8,
                      extra_body={"guided_regex": regex})
    texts = [c["text"] for c in r["choices"]]
    check(all(re.fullmatch(regex, t) for t in texts), f"guided_regex {regex}: {texts}")
    options = ["yes", "no", "maybe later"]
    r = client.create("chat", model="smol", messages=[{"role": "user", "content": "Well?"}], max_tokens=10,
                      temperature=1, seed=6, n=8, extra_body={"guided_choice": options})
    picks = [c["message"]["content"] for c in r["choices"]]
    check(all(p in options for p in picks), f"guided_choice: {picks}")
    # Tools: a forced call (tool_choice named, and "required" over two tools) is one call of an offered tool whose
    # arguments validate against its parameters; streamed, the same call arrives in one delta; "none" gives text.
    weather = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
               "parameters": {"type": "object", "required": ["city"], "additionalProperties": False,
                              "properties": {"city": {"type": "string", "maxLength": 20},
                                             "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
    clock = {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string", "maxLength": 10}}, "required": ["zone"]}}}
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    for choice in ({"type": "function", "function": {"name": "get_weather"}}, "required"):
        r = client.create("chat", model="smol", messages=ask, tools=[weather, clock], tool_choice=choice,
                          max_tokens=80, temperature=1, seed=2, n=4)
        for c in r["choices"]:
            calls = c["message"].get("tool_calls") or []
            ok = c["finish_reason"] == "tool_calls" and len(calls) == 1 and c["message"]["content"] is None
            if ok:
                fn = calls[0]["function"]
                ok = fn["name"] in (["get_weather"] if choice != "required" else ["get_weather", "get_time"])
                params = (weather if fn["name"] == "get_weather" else clock)["function"]["parameters"]
                try:
                    jsonschema.validate(json.loads(fn["arguments"]), params)
                except Exception:  # noqa: BLE001
                    ok = False
                ok = ok and calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
            check(ok, f"tool_choice {choice}: {c}")
    chunks = client.create("chat", model="smol", messages=ask, tools=[weather], tool_choice="required",
                           max_tokens=80, temperature=1, seed=2, stream=True)
    deltas = [k["choices"][0] for k in chunks if k["choices"]]
    streamed = [tc for d in deltas for tc in d["delta"].get("tool_calls") or []]
    whole = client.create("chat", model="smol", messages=ask, tools=[weather], tool_choice="required",
                          max_tokens=80, temperature=1, seed=2)
    want = whole["choices"][0]["message"]["tool_calls"]
    # Streamed as written: the first delta names the call, the others add pieces of its arguments.
    args = "".join(tc["function"].get("arguments") or "" for tc in streamed)
    check(streamed and streamed[0]["function"]["name"] == want[0]["function"]["name"]
          and args == want[0]["function"]["arguments"] and all(tc["index"] == 0 for tc in streamed)
          and deltas[-1]["finish_reason"] == "tool_calls", f"streamed tool call {streamed} != {want}")
    r = client.create("chat", model="smol", messages=ask, tools=[weather], tool_choice="none", max_tokens=8,
                      temperature=0)
    check(r["choices"][0]["message"].get("tool_calls") in (None, []) and r["choices"][0]["message"]["content"],
          f"tool_choice none: {r['choices'][0]}")
    # Refusals name the culprit: an unsupported keyword (with its place), a bad regex, two constraints at once.
    P = "/v1/completions"
    bad = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[A-Z]"}}}
    for body, words in ((dict(guided_json=bad), ("guided_json", "pattern")),
                        (dict(guided_regex="(ab"), ("guided_regex",)),
                        (dict(guided_regex="a", guided_choice=["a"]), ("guided_regex", "guided_choice")),
                        (dict(response_format={"type": "xml"}), ("response_format", "xml")),
                        (dict(tools=[weather], tool_choice={"type": "function", "function": {"name": "nope"}}),
                         ("tool_choice", "nope")),
                        (dict(tools=[weather], tool_choice="required", guided_regex="a"), ("tool_choice", "guided_regex")),
                        (dict(tools=[{"type": "function", "function": {"name": "bad name"}}]), ("tools",))):
        chat = "tools" in body
        st, _, raw = s.request("POST", "/v1/chat/completions" if chat else P,
                               dict({"messages": ask} if chat else {"prompt": "x"}, max_tokens=4, **body))
        msg = json.loads(raw).get("error", {}).get("message", "") if raw else ""
        check(st == 400 and all(w in msg for w in words), f"refused {body}: {st} {msg!r}")
    # The same constraints in a batch file (the Batch format; one parser for both fronts), and a line with a
    # list of 2 prompts x n 2 (one record of 4 choices, as the server answers the same body).
    multi = {"prompt": ["The sea", "A red"], "n": 2, "max_tokens": 5, "temperature": 1, "seed": 9}
    served = json.loads(s.request("POST", P, multi)[2])
    with tempfile.TemporaryDirectory() as d:
        lines = [{"custom_id": "schema", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"messages": [{"role": "user", "content": "A person?"}], "max_tokens": 160, "seed": 1,
                           "temperature": 1, "response_format": fmt}},
                 {"custom_id": "choice", "method": "POST", "url": "/v1/completions",
                  "body": {"prompt": "Well?", "max_tokens": 8, "temperature": 1, "guided_choice": options}},
                 {"custom_id": "multi", "method": "POST", "url": "/v1/completions", "body": multi}]
        inp, out = os.path.join(d, "in.jsonl"), os.path.join(d, "out.jsonl")
        with open(inp, "w") as f:
            f.write("".join(json.dumps(l) + "\n" for l in lines))
        p = subprocess.run([lattice, "batch", "--model", builtin, "--threads", "2", "--input", inp, "--output", out],
                           capture_output=True, text=True, timeout=300)
        check(p.returncode == 0, f"batch with structured output: exit {p.returncode}: {p.stderr[-400:]}")
        got = {}
        if os.path.exists(out):
            for l in open(out):
                rec = json.loads(l)
                got[rec["custom_id"]] = rec["response"]["body"]["choices"][0] if rec.get("response") else rec
        try:
            jsonschema.validate(json.loads(got["schema"]["message"]["content"]), PERSON)
            check(got["choice"]["text"] in options, f"batch guided_choice: {got['choice']}")
            body = json.loads(open(out).read().split("\n")[[json.loads(l)["custom_id"] for l in open(out)].index("multi")])
            mine = sorted((c["index"], c["text"]) for c in body["response"]["body"]["choices"])
            theirs = sorted((c["index"], c["text"]) for c in served["choices"])
            check(mine == theirs and [i for i, _ in mine] == [0, 1, 2, 3]
                  and uncached(body["response"]["body"]["usage"]) == uncached(served["usage"]),
                  f"batch n 2 x 2 prompts: {mine} {body['response']['body']['usage']} != serve's {theirs} {served['usage']}")
        except Exception as e:  # noqa: BLE001
            check(False, f"batch structured outputs: {e!r}: {got}")
    print(f"  structured output: {time.time() - t0:.1f} s", flush=True)


def prompt_ids(s, auth, prompt):
    """The prompt's token ids, as the server encodes it (echo with return_token_ids)."""
    r = json.loads(s.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 0, "echo": True,
                                                         "return_token_ids": True}, auth)[2])
    return r["choices"][0]["token_ids"]


def builtin_section():
    t0 = time.time()
    s = Server(["--model", builtin, "--threads", "2", "--max-body-bytes", "100000", "--served-model-name", "smol"],
               env=dict(os.environ, LATTICE_API_KEY=KEY))
    auth = {"Authorization": f"Bearer {KEY}"}
    url = f"http://127.0.0.1:{s.port}"
    client = Api(s.port, KEY)
    prompt = "The three most common colors of flowers are"
    gen = generate(builtin, ["--prompt", prompt, "--max-new-tokens", "20", "--threads", "2"])
    question = "What is the capital of France?"
    chat_gen = generate(builtin, ["--prompt", question, "--chat", "--max-new-tokens", "24", "--threads", "2"])
    req = {"model": "smol", "prompt": prompt, "max_tokens": 20, "temperature": 0, "return_token_ids": True}

    # curl, not streamed and streamed.
    def curl(body, stream=False):
        cmd = ["curl", "-sS", "--max-time", "300", "-H", f"Authorization: Bearer {KEY}", "-H",
               "Content-Type: application/json", "-d", json.dumps(body), url + "/v1/completions"]
        r = subprocess.run(cmd + (["-N"] if stream else []), capture_output=True, text=True, timeout=320)
        check(r.returncode == 0, f"curl: {r.stderr}")
        return r.stdout

    j = json.loads(curl(req))
    text = j["choices"][0]["text"]
    check(j["object"] == "text_completion" and j["choices"][0]["token_ids"] == gen and text,
          f"curl completion {j} != generate {gen}")
    events = [json.loads(l[6:]) if l != "data: [DONE]" else "[DONE]"
              for l in curl(dict(req, stream=True), stream=True).splitlines() if l.startswith("data: ")]
    ids, stext, finish = stream_ids(events)
    check(ids == gen and stext == text and events[-1] == "[DONE]" and finish == j["choices"][0]["finish_reason"],
          f"curl stream {ids} {stext!r} {finish} != {gen} {text!r}")

    # The openai client (or plain HTTP without it): completions and chat, streamed and not.
    c = client.create("completions", model="smol", prompt=prompt, max_tokens=20, temperature=0)
    check(c["choices"][0]["text"] == text and c["usage"]["completion_tokens"] == len(gen), f"api completion {c}")
    st = "".join(ch["choices"][0]["text"] for ch in client.create(
        "completions", model="smol", prompt=prompt, max_tokens=20, temperature=0, stream=True) if ch["choices"])
    check(st == text, f"api completion stream {st!r} != {text!r}")
    msgs = [{"role": "user", "content": question}]
    r = client.create("chat", model="smol", messages=msgs, max_tokens=24, temperature=0,
                      extra_body={"return_token_ids": True})
    content = r["choices"][0]["message"]["content"]
    check(r["object"] == "chat.completion" and r["choices"][0]["message"]["role"] == "assistant" and content
          and r["choices"][0]["token_ids"] == chat_gen, f"api chat {r} != generate {chat_gen}")
    chunks = client.create("chat", model="smol", messages=msgs, max_tokens=24, temperature=0, stream=True,
                           stream_options={"include_usage": True})
    check(chunks[0]["choices"][0]["delta"]["role"] == "assistant", f"first chat chunk {chunks[0]}")
    scontent = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"])
    finishes = [ch["choices"][0]["finish_reason"] for ch in chunks if ch["choices"] and ch["choices"][0]["finish_reason"]]
    check(scontent == content and finishes == [r["choices"][0]["finish_reason"]], f"chat stream {scontent!r} {finishes}")
    check(all(ch["usage"] is None for ch in chunks[:-1]) and chunks[-1]["choices"] == []
          and chunks[-1]["usage"]["completion_tokens"] == r["usage"]["completion_tokens"]
          and chunks[-1]["usage"]["prompt_tokens"] == r["usage"]["prompt_tokens"], f"usage chunk {chunks[-1]}")
    check(client.models() == ["smol"], "api models list")

    # A stop string: the text ends right before it.
    stop = spaced_word(text)
    check(stop is not None, f"no word after a space in {text!r}")
    c = client.create("completions", model="smol", prompt=prompt, max_tokens=20, temperature=0, stop=[stop])
    ctext = c["choices"][0]["text"]
    check(c["choices"][0]["finish_reason"] == "stop" and ctext == text[:text.find(stop)],
          f"stop {stop!r}: {ctext!r} from {text!r}")

    print(f"  curl and api: {time.time() - t0:.1f} s", flush=True)

    # Bad inputs: status and an OpenAI error body each.
    P = "/v1/completions"
    error_body(*s.request("POST", P, raw="{\"prompt\": \"x", headers=auth)[::2], "malformed JSON", 400)
    e = error_body(*s.request("POST", P, {"prompt": "x", "max_tokens": "many"}, auth)[::2], "wrong type", 400)
    check(e.get("param") == "max_tokens", f"wrong type param {e}")
    error_body(*s.request("POST", "/v1/chat/completions", {"messages": []}, auth)[::2], "empty messages", 400)
    error_body(*s.request("POST", P, {"prompt": [1] * 5000}, auth)[::2], "prompt beyond the context", 400)
    error_body(*s.request("POST", P, {"prompt": "x", "model": "gpt-4"}, auth)[::2], "unknown model", 404)
    error_body(*s.request("POST", P, {"prompt": "x" * 200000}, auth)[::2], "body over the limit", 413)
    error_body(*s.request("POST", P, {"prompt": "x"})[::2], "no key", 401)
    error_body(*s.request("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})[::2], "wrong key", 401)
    error_body(*s.request("GET", P, headers=auth)[::2], "wrong method", 405)
    error_body(*s.request("GET", "/nope")[::2], "unknown path", 404)
    for want, call in ((401, lambda: Api(s.port, "wrong").models()),
                       (404, lambda: client.create("completions", model="nope", prompt="x")),
                       (400, lambda: client.create("completions", model="smol", prompt="x",
                                                   extra_body={"frobnicate": 1}))):
        try:
            call()
            check(False, f"api: no error {want}")
        except ApiError as err:
            check(err.status == want and bool(err.message), f"api error {err.status} {err.message!r}, want {want}")

    # 32 concurrent streaming clients (16 prompts, each twice): each gets the tokens of its prompt's single run.
    t0 = time.time()
    prompts = [f"Write a short note number {i} about {['rivers', 'cats', 'bread', 'stars'][i % 4]}:" for i in range(16)]
    body = lambda p: {"prompt": p, "max_tokens": 10, "temperature": 0, "ignore_eos": True, "return_token_ids": True,
                      "stream": True}
    single = [stream_ids(s.stream(P, body(p), auth))[0] for p in prompts]
    print(f"  16 single streams: {time.time() - t0:.1f} s", flush=True)
    # The engine publishes its gauges after the step whose tokens the clients already have: wait for the
    # snapshot after the last single run (one publish carries all gauges, so its token count is final).
    before = s.wait_metrics(lambda m: m["lattice:num_requests_running"] == 0 and m["lattice:num_requests_waiting"] == 0)
    results = [None] * 32

    def client_run(i):
        results[i] = stream_ids(s.stream(P, body(prompts[i % 16]), auth))[0]

    threads = [threading.Thread(target=client_run, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    for i in range(32):
        check(results[i] == single[i % 16] and len(single[i % 16]) == 10,
              f"concurrent client {i}: {results[i]} != {single[i % 16]}")
    print(f"  32 concurrent streams: {time.time() - t0:.1f} s", flush=True)
    # The engine's gauges are published after the step whose tokens the clients already have: poll.
    gen = lambda m: m["lattice:generation_tokens_total"] - before["lattice:generation_tokens_total"]
    m = s.wait_metrics(lambda m: gen(m) == 320 and m["lattice_kv_blocks_used"] == 0)
    check(gen(m) == 320, f"generation tokens counted: {gen(m)}")
    check(m["lattice:time_to_first_token_seconds_count"] - before["lattice:time_to_first_token_seconds_count"] == 32,
          "TTFT observed per request")
    ok200 = 'lattice_http_requests_total{route="/v1/completions",code="200"}'
    check(m[ok200] - before[ok200] == 32, f"requests by status: {m[ok200] - before[ok200]} more 200s, want 32")
    check(m['lattice_http_requests_total{route="/v1/completions",code="413"}'] == 1, "413 counted")
    check(m["lattice_kv_blocks_used"] == 0 and m["lattice_kv_blocks_total"] > 0, f"KV blocks after the runs: {m}")
    check(m["lattice:inter_token_latency_seconds_count"] - before["lattice:inter_token_latency_seconds_count"] == 32 * 9,
          "ITL observed per token after the first")
    text = s.request("GET", "/metrics")[2]
    for name, kind in (("lattice_http_requests_total", "counter"), ("lattice:prompt_tokens_total", "counter"),
                       ("lattice:generation_tokens_total", "counter"), ("lattice:num_preemptions_total", "counter"),
                       ("lattice:num_requests_running", "gauge"), ("lattice:num_requests_waiting", "gauge"),
                       ("lattice:kv_cache_usage_perc", "gauge"), ("lattice_kv_blocks_used", "gauge"),
                       ("lattice_kv_blocks_total", "gauge"), ("lattice:time_to_first_token_seconds", "histogram"),
                       ("lattice:inter_token_latency_seconds", "histogram"),
                       ("lattice:e2e_request_latency_seconds", "histogram"),
                       ("lattice:request_prompt_tokens", "histogram"), ("lattice:request_success_total", "counter")):
        check(f"# TYPE {name} {kind}\n" in text, f"/metrics lacks {name} ({kind})")
    check(m["lattice:e2e_request_latency_seconds_count"] - before["lattice:e2e_request_latency_seconds_count"] == 32,
          "e2e latency observed per finished request")
    check(m["lattice:request_generation_tokens_sum"] - before["lattice:request_generation_tokens_sum"] == 320,
          "generated tokens per finished request")
    check('lattice:time_to_first_token_seconds_bucket{model_name="smol",le="+Inf"} ' in text, "TTFT histogram buckets")

    # SIGTERM mid-stream, the drain: the listener stays open; GET /health answers 503 "draining" with
    # Retry-After (polled until it does) and a new completion 503, while the stream goes on and finishes
    # whole; then exit 0.
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=300)
    c.request("POST", P, body=json.dumps(dict(body(prompt), max_tokens=48)), headers=auth)
    r = c.getresponse()
    first = r.readline()
    s.p.send_signal(signal.SIGTERM)
    health = (0, {}, "")
    deadline = time.time() + 60
    while time.time() < deadline and health[0] != 503:
        health = s.request("GET", "/health", timeout=30)
        check(health[0] in (200, 503), f"/health while draining: {health[0]} (the listener must stay open)")
    check(health[0] == 503 and health[1].get("Retry-After") == "5" and '"draining"' in health[2],
          f"/health while draining: {health}")
    late = s.request("POST", P, dict(body(prompt), stream=False), auth, timeout=60)
    check(late[0] == 503 and "shutting down" in late[2], f"a new completion while draining: {late[:1]} {late[2][:200]}")
    rest = [first] + list(r)
    events = [json.loads(l[6:]) if l.strip() != b"data: [DONE]" else "[DONE]" for l in rest if l.startswith(b"data: ")]
    ids, _, finish = stream_ids(events)
    check(len(ids) == 48 and finish == "length" and events[-1] == "[DONE]", f"drained stream: {len(ids)} {finish}")
    rc = s.wait()
    check(rc == 0, f"exit status after SIGTERM: {rc}")
    check(any("stopped by signal 15" in l for l in s.err), f"drain report: {''.join(s.err[-5:])}")
    return single, prompts


def queue_and_disconnect_section():
    s = Server(["--model", builtin, "--threads", "2", "--max-seqs", "1", "--max-queue", "1"])
    # A long stream occupies the only sequence slot.
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=60)
    b = json.dumps({"prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": True, "stream": True})
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(b)}\r\n\r\n{b}".encode())
    got = b""
    while got.count(b"data: ") < 3:
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    m = s.wait_metrics(lambda m: m["lattice:num_requests_running"] == 1 and m["lattice_kv_blocks_used"] > 0)
    check(m["lattice:num_requests_running"] == 1 and m["lattice_kv_blocks_used"] > 0, f"one running stream: {m}")
    # A second request waits; a third finds the queue full.
    second = {}
    t = threading.Thread(target=lambda: second.update(r=s.request("POST", "/v1/completions",
                                                                    {"prompt": "Hello", "max_tokens": 4})))
    t.start()
    s.wait_metrics(lambda m: m["lattice:num_requests_waiting"] == 1)
    st, hdr, body = s.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 4})
    error_body(st, body, "queue full", 503)
    check(hdr.get("Retry-After") == "1", f"queue full: Retry-After ({hdr})")
    # The stream's client goes away: its blocks return, the waiting request runs.
    sock.close()
    t.join(timeout=300)
    check(second.get("r", (0,))[0] == 200, f"the waiting request after the disconnect: {second}")
    m = s.wait_metrics(lambda m: m["lattice_kv_blocks_used"] == 0 and m["lattice:num_requests_running"] == 0)
    check(m["lattice_kv_blocks_used"] == 0, f"blocks freed after the disconnect: {m}")
    aborted = sum(v for k, v in m.items() if k.startswith("lattice:request_success_total{")
                  and 'finished_reason="abort"' in k)
    check(m["lattice_client_disconnects_total"] == 1 and aborted == 1, f"disconnect counted: {m}")
    s.stop()


def mpi_section(single, prompts):
    # pp 2 through the Slurm template run as a plain script (CPU ranks via launch/lattice-mpirun): its SIGTERM
    # trap passes the drain on to mpirun as SIGUSR1.
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sbatch = os.path.join(repo, "launch", "slurm", "serve.sbatch")
    env = dict(os.environ, REPO=repo, MODEL=builtin, TP="1", PP="2", PORT="0", CPU_RANKS="1", LATTICE=lattice,
               EXTRA_ARGS="--threads 1", COMM_TIMEOUT="30", DRAIN_SECONDS="30")
    s = Server([], env=env, cmd=["bash", sbatch])
    client = Api(s.port, "")
    for i in (0, 5):
        ids = stream_ids(s.stream("/v1/completions", {"prompt": prompts[i], "max_tokens": 10, "temperature": 0,
                                                      "ignore_eos": True, "return_token_ids": True, "stream": True}))[0]
        check(ids == single[i], f"pp 2 stream {i}: {ids} != {single[i]}")
    r = client.create("completions", model="SmolLM2-135M-Instruct.Q4_1.gguf", prompt=prompts[3], max_tokens=10,
                      temperature=0, extra_body={"ignore_eos": True, "return_token_ids": True})
    check(r["choices"][0]["token_ids"] == single[3], f"pp 2 api: {r['choices'][0]['token_ids']} != {single[3]}")
    s.stop(signal.SIGTERM, "serve.sbatch pp 2")

    cases = json.load(open(os.path.join(golden, "expected.json")))["cases"]
    s = Server(["--model", golden, "--threads", "1", "--tp", "2"], mpirun_np=2)
    for i, case in enumerate(cases[:2]):
        st, _, body = s.request("POST", "/v1/completions", {"prompt": case["prompt_ids"], "max_tokens": 24,
                                                            "temperature": 0, "ignore_eos": True})
        check(st == 200 and json.loads(body)["choices"][0]["token_ids"] == case["greedy_ids"][:24],
              f"tp 2 golden case {i}: {body[:300]}")
    s.stop(signal.SIGUSR1, "mpirun tp 2")


def drain_render_section():
    """A near-budget chat template render (to the step limit) on tiny-llama2 with a small tokenizer:
    GET /health and /metrics answer while it runs (it is on a route thread, not the I/O thread); SIGTERM during
    it ends the render at its next step (the request gets 503 naming the interruption) and the process exits 0
    well within --drain-seconds."""
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as d:
        for f in ("config.json", "model.safetensors"):
            os.symlink(os.path.join(golden, f), os.path.join(d, f))
        vocab = {"<s>": 0, "</s>": 1, "\u2581": 2, "a": 3, "\u2581a": 4}
        with open(os.path.join(d, "tokenizer.json"), "w") as f:
            json.dump({"model": {"type": "BPE", "byte_fallback": False, "vocab": vocab, "merges": ["\u2581 a"]},
                       "added_tokens": [{"id": 0, "content": "<s>", "special": True},
                                        {"id": 1, "content": "</s>", "special": True}]}, f)
        # Runs to the step limit: ~0.5 s of CPU (Release), the longest a 60 KB conversation's render may take.
        slow = ("{% for m in messages %}{% for i in range(1000) %}{% set x = ((m.content ~ i) ~ (m.content ~ i) ~ "
                "(m.content ~ i) ~ (m.content ~ i) ~ (m.content ~ i))|length %}{% endfor %}{% endfor %}{{ bos_token }}a")
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"bos_token": "<s>", "eos_token": "</s>", "chat_template": slow}, f)
        s = Server(["--model", d, "--threads", "1", "--drain-seconds", "5"])
        # 61 KB: under the 64 KiB up to which bodies used to be routed on the I/O thread.
        body = {"messages": [{"role": "user", "content": "a"}] * 1800, "max_tokens": 2}
        result = {}
        chat = threading.Thread(target=lambda: result.update(r=s.request("POST", "/v1/chat/completions", body,
                                                                         timeout=300)))
        chat.start()
        deadline = time.time() + 60  # the chat's connection open (its 61 KB body then arrives in a few ms)
        while time.time() < deadline and s.metrics().get("lattice_http_connections", 0) < 2:
            time.sleep(0.005)
        polls = [s.request("GET", path, timeout=60)[0] for path in ("/health", "/metrics") * 5]
        check(polls == [200] * 10, f"/health and /metrics during a render: {polls}")
        check(chat.is_alive(), "the render still runs after the polls (else they proved nothing: a faster machine?)")
        t0 = time.time()
        s.p.send_signal(signal.SIGTERM)
        rc = s.wait()
        took = time.time() - t0
        chat.join(timeout=60)
        st, _, text = result.get("r", (0, {}, ""))
        check(st == 503 and "interrupted" in text, f"the chat whose render SIGTERM interrupted: {st} {text[:300]}")
        check(rc == 0 and took < 5, f"SIGTERM during a render: exit {rc} after {took:.1f} s (--drain-seconds 5)")
        print(f"  SIGTERM during a render: exit after {took:.2f} s", flush=True)


print(f"test_serve: {'openai ' + openai.__version__ if openai else 'http.client (no openai package)'} client",
      flush=True)
t0 = time.time()
try:
    if PART in ("api", "all"):
        bad_command_lines()
        golden_section()
        print(f"golden: {time.time() - t0:.1f} s", flush=True)
        single, prompts = builtin_section()
        print(f"built-in: {time.time() - t0:.1f} s", flush=True)
        queue_and_disconnect_section()
        print(f"queue and disconnect: {time.time() - t0:.1f} s", flush=True)
        mpi_section(single, prompts)
        print(f"mpirun: {time.time() - t0:.1f} s", flush=True)
    if PART in ("choices", "all"):
        s = Server(["--model", builtin, "--threads", "2", "--served-model-name", "smol"])
        choices_and_logprobs(s, Api(s.port, ""), {})
        s.stop()
        print(f"choices: {time.time() - t0:.1f} s", flush=True)
    if PART in ("structured", "all"):
        s = Server(["--model", builtin, "--threads", "2", "--served-model-name", "smol"])
        structured_section(s, Api(s.port, ""))
        s.stop()
        # A KV cache of 29 blocks bounds the context /v1/models advertises, and a chat without
        # max_tokens (the rest of that context) runs.
        s = Server(["--model", builtin, "--threads", "2", "--served-model-name", "smol", "--kv-cache-gb", "0.02"])
        st, _, raw = s.request("GET", "/v1/models")
        models = json.loads(raw)["data"] if st == 200 else []
        mml = models[0].get("max_model_len") if models else None
        check(isinstance(mml, int) and 0 < mml <= 29 * 16, f"--kv-cache-gb 0.02: /v1/models max_model_len {mml}")
        st, _, raw = s.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                                "temperature": 0})
        check(st == 200, f"--kv-cache-gb 0.02: a chat without max_tokens: {st} {raw[:300]}")
        s.stop()
        print(f"structured: {time.time() - t0:.1f} s", flush=True)
    if PART in ("drain", "all"):
        drain_render_section()
        print(f"drain during a render: {time.time() - t0:.1f} s", flush=True)
    if PART in ("fronts", "all"):
        fronts_section()
        print(f"three fronts: {time.time() - t0:.1f} s", flush=True)
except Exception:
    traceback.print_exc()
    check(False, "exception")
finally:
    cleanup()
finish()
