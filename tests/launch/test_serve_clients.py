#!/usr/bin/env python3
"""The clients people already run, against one `lattice serve` of the built-in model (greedy), then one
`lattice batch` of the same bodies:
  1. lm-evaluation-harness 0.4.x's local-completions: its exact payloads (loglikelihood: echo, logprobs 1,
     max_tokens 1, a list of token-id prompts; generate_until: max_tokens, temperature 0, stop, seed) and its
     parse_logprobs / parse_generations (reimplemented here from its source): the loglikelihoods equal the
     log-softmax of `lattice score`'s logits within 1e-6, the context / continuation boundary falls where
     lm-eval slices it, and the remote tokenizer it probes (/tokenizer_info, /tokenize, /detokenize) round-trips.
  2. vLLM's /tokenize (prompt and chat messages: the chat's count is the chat completion's prompt_tokens),
     /detokenize, /version; prompt_logprobs on both endpoints; usage.prompt_tokens_details.cached_tokens from
     the prefix cache (a repeated long prompt).
  3. The openai SDK's tool loop: a forced call returns content null + tool_calls; the assistant message goes
     back as returned, then a "tool" message: 200, streamed and not; a streamed call arrives as a first
     delta with id and name, then argument deltas, which concatenate to the non-streamed arguments.
  4. The same 21 bodies (logprobs, echo, n, stop, json_schema, tools, bad fields, over-long max_tokens, an
     unknown model ...) to serve and to `lattice batch`: status and body equal field by field (ids, created
     and the prefix cache's cached_tokens aside; logprobs within 1e-4).
Every 4xx body either front produces is scanned for a server path (serve_bodies.py).
Usage: test_serve_clients.py LATTICE_BINARY MODEL_GGUF   (exit 0: pass)"""
import http.client
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import time

import serve_harness
from serve_bodies import path_leak
from serve_harness import check, finish

try:
    import openai
except ImportError:
    openai = None
try:
    import numpy as np
except ImportError:
    np = None

lattice, model = sys.argv[1], os.path.abspath(sys.argv[2])
NAME = os.path.basename(model)
bodies_4xx = []  # (what, body) of every refusal seen


class Server(serve_harness.Server):
    """`lattice serve` of the model; every refusal's body kept in bodies_4xx for the scan at the end."""

    def __init__(self):
        super().__init__([lattice, "serve", "--model", model, "--port", "0", "--threads", "2", "--kv-cache-gb", "0.2"],
                         ready_s=120)

    def scan(self, what, status, body):
        if status >= 400:
            bodies_4xx.append((what, body))

    def post(self, path, body):
        st, j = self.request_json("POST", path, body)
        check(st == 200, f"{path} {json.dumps(body)[:200]}: status {st}: {str(j)[:300]}")
        return j


TMP = tempfile.TemporaryDirectory()


def start(args):
    """A lattice command in the background (it loads its model while the server answers)."""
    return subprocess.Popen([lattice] + args + ["--model", model, "--threads", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finished(p, what):
    out, err = p.communicate(timeout=240)
    check(p.returncode == 0, f"{what}: rc {p.returncode}: {err[-400:]}")


def start_score(ids):
    out = os.path.join(TMP.name, "logits.safetensors")
    return start(["score", "--kv-cache-gb", "0.05", "--prompt-ids", ",".join(map(str, ids)), "--out", out]), out


def score_logprobs(ids, scoring):
    """log-softmax of `lattice score`'s logits: logprob of ids[i] given ids[:i] (i >= 1)."""
    finished(scoring[0], "lattice score")
    raw = open(scoring[1], "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    meta = json.loads(raw[8:8 + n])["logits"]
    T, V = meta["shape"]
    begin = 8 + n + meta["data_offsets"][0]
    lps = [None]
    for i in range(1, T):
        if np is not None:
            row = np.frombuffer(raw, dtype="<f4", count=V, offset=begin + 4 * (i - 1) * V).astype(np.float64)
            m = row.max()
            lse = m + math.log(np.exp(row - m).sum())
        else:
            row = struct.unpack_from(f"<{V}f", raw, begin + 4 * (i - 1) * V)
            m = max(row)
            lse = m + math.log(sum(math.exp(x - m) for x in row))
        lps.append(float(row[ids[i]]) - lse)
    return lps


def lm_eval_parse_logprobs(out, ctxlens):
    """lm-eval's parse_logprobs (local-completions), reimplemented from its source."""
    res = []
    for choice, ctxlen in zip(sorted(out["choices"], key=lambda c: c["index"]), ctxlens):
        assert ctxlen > 0
        lps = choice["logprobs"]["token_logprobs"][ctxlen:-1]
        tops = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        greedy = all(tok == max(top.values()) for tok, top in zip(lps, tops))
        res.append((sum(lps), greedy))
    return res


def lm_eval_section(s):
    t0 = time.time()
    # The remote tokenizer lm-eval probes: /tokenizer_info with eos_token, /tokenize, /detokenize.
    st, info = s.request_json("GET", "/tokenizer_info")
    check(st == 200 and "eos_token" in info and info["chat_template"], f"/tokenizer_info: {str(info)[:200]}")
    text = "Question: What is the capital of France?\nAnswer: Paris is the capital of France"
    ids = s.post("/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]
    scoring = start_score(ids)
    check(s.post("/detokenize", {"tokens": ids})["prompt"] == text, "detokenize(tokenize(text)) != text")
    # loglikelihood: lm-eval sends each (context, continuation) as context_enc + continuation_enc and slices at
    # len(context_enc); three splits of one sequence, so one `lattice score` checks them all.
    ctxlens = [len(ids) - 5, len(ids) - 3, len(ids) - 1]
    payload = {"model": NAME, "prompt": [ids] * 3, "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234,
               "echo": True}
    out = s.post("/v1/completions", payload)
    want = score_logprobs(ids, scoring)
    for choice in out.get("choices", []):
        lp = choice["logprobs"]
        check(len(lp["tokens"]) == len(ids) + 1 and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
              and lp["text_offset"][0] == 0 and choice["text"].startswith(text), f"echo shape: {str(choice)[:300]}")
        off = [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]
        check(lp["text_offset"] == off, f"text_offset {lp['text_offset']} != {off}")
        got = lp["token_logprobs"][1:len(ids)]
        check(all(abs(a - b) < 1e-6 for a, b in zip(got, want[1:])), f"echo logprobs != score: {got} {want[1:]}")
    res = lm_eval_parse_logprobs(out, ctxlens)
    for (ll, greedy), k in zip(res, ctxlens):
        ref = sum(want[k:])
        check(abs(ll - ref) < 1e-6 * len(ids), f"loglikelihood from {k}: {ll} != score's {ref}")
        check(isinstance(greedy, bool), f"is_greedy {greedy}")
    # echo + logprobs with max_tokens 0 gives the same prompt logprobs (the score path alone).
    zero = s.post("/v1/completions", dict(payload, prompt=ids, max_tokens=0))
    check(zero["choices"][0]["logprobs"]["token_logprobs"] == out["choices"][0]["logprobs"]["token_logprobs"][:-1],
          "echo max_tokens 0 and 1 disagree on the prompt")
    # generate_until: lm-eval's payload (token-id prompts, stop strings, seed): parse_generations by index.
    gen = {"prompt": [ids[:12], ids[:9]], "model": NAME, "max_tokens": 24, "temperature": 0, "stop": ["\n\n", "."],
           "seed": 1234}
    out = s.post("/v1/completions", gen)
    texts = [None] * len(out["choices"])
    for c in out["choices"]:
        texts[c["index"]] = c["text"]
    single = s.post("/v1/completions", dict(gen, prompt=ids[:9]))
    check(len(texts) == 2 and all(isinstance(t, str) and "." not in t and "\n\n" not in t for t in texts)
          and texts[1] == single["choices"][0]["text"], f"generate_until: {texts} vs {single['choices'][0]['text']!r}")
    print(f"  lm-eval payloads: {time.time() - t0:.1f} s", flush=True)


def endpoints_section(s):
    st, v = s.request_json("GET", "/version")
    check(st == 200 and isinstance(v.get("version"), str) and v["version"], f"/version: {v}")
    msgs = [{"role": "user", "content": "Name three colors."}]
    tok = s.post("/tokenize", {"messages": msgs, "return_token_strs": True})
    chat = s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "temperature": 0})
    check(tok["count"] == len(tok["tokens"]) == chat["usage"]["prompt_tokens"] and len(tok["token_strs"]) == tok["count"]
          and tok["max_model_len"] > 0, f"/tokenize messages: {tok} vs usage {chat['usage']}")
    for path, body, want in (("/tokenize", {"prompt": 5}, 400), ("/tokenize", {"prompt": "x", "model": "nope"}, 404),
                             ("/detokenize", {"tokens": [-1]}, 400), ("/detokenize", {}, 400)):
        st, _ = s.request_json("POST", path, body)
        check(st == want, f"{path} {body}: {st}, want {want}")
    # prompt_logprobs: completions per choice, chat at the top; [null, {id: {logprob, rank, decoded_token}}...].
    c = s.post("/v1/completions", {"prompt": "The sky is blue", "max_tokens": 1, "temperature": 0, "prompt_logprobs": 2})
    pl = c["choices"][0]["prompt_logprobs"]
    check(pl[0] is None and all(1 <= len(x) <= 3 and all({"logprob", "rank", "decoded_token"} == set(e) for e in x.values())
                                for x in pl[1:]), f"prompt_logprobs: {pl}")
    ch = s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0})
    check(len(ch["prompt_logprobs"]) == ch["usage"]["prompt_tokens"] and ch["prompt_logprobs"][0] is None,
          f"chat prompt_logprobs: {str(ch.get('prompt_logprobs'))[:200]}")
    # cached_tokens: the same long prompt twice; the second finds its full blocks in the prefix cache.
    long = {"prompt": "Once upon a time " * 12, "max_tokens": 1, "temperature": 0}
    first, second = s.post("/v1/completions", long), s.post("/v1/completions", long)
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    check(first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 and cached >= 32
          and cached < second["usage"]["prompt_tokens"], f"cached_tokens {first['usage']} then {second['usage']}")


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "required": ["city"],
                                                          "properties": {"city": {"type": "string", "maxLength": 6},
                                                                         "days": {"type": "integer"}}}}}]


def tool_loop_section(s):
    """The openai SDK's standard loop: call, assistant message back as returned (content null), tool result."""
    if openai is None:
        print("  (no openai package: the tool loop goes through http.client)", flush=True)
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    forced = {"messages": msgs, "tools": TOOLS, "tool_choice": "required", "max_tokens": 30, "temperature": 0}
    if openai is not None:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{s.port}/v1", api_key="none", max_retries=0)
        r = client.chat.completions.create(model=NAME, **forced)
        message = r.choices[0].message  # as the SDK returns it: content None, tool_calls
        m = message.model_dump(exclude_unset=True)
    else:
        m = message = s.post("/v1/chat/completions", forced)["choices"][0]["message"]
    check(m["content"] is None and m["tool_calls"][0]["function"]["name"] == "get_weather", f"forced call: {m}")
    # Streamed: the first tool delta carries id, type and name; later ones only argument pieces (how many
    # depends on how the model's tokens cut the text: a member and the closing brace in one token come as one
    # piece; the piece by piece order is test_openai_clients' ToolCallStream case).
    calls = [tc for d in stream(s, forced) for tc in d.get("tool_calls") or []]
    check(len(calls) >= 2 and calls[0].get("id") and calls[0]["function"]["name"] == "get_weather"
          and all("id" not in tc and "name" not in tc.get("function", {}) for tc in calls[1:])
          and "".join(tc["function"].get("arguments", "") for tc in calls) == m["tool_calls"][0]["function"]["arguments"],
          f"streamed tool call deltas: {calls} vs {m['tool_calls']}")
    history = msgs + [message, {"role": "tool", "tool_call_id": m["tool_calls"][0]["id"], "content": "sunny"}]
    for streamed in (False, True):
        if openai is not None:
            try:
                out = client.chat.completions.create(model=NAME, messages=history, tools=TOOLS, max_tokens=6,
                                                     temperature=0, stream=streamed)
                text = "".join(c.choices[0].delta.content or "" for c in out if c.choices) if streamed \
                    else out.choices[0].message.content
                check(isinstance(text, str) and text, f"tool loop (stream {streamed}): {text!r}")
            except openai.APIStatusError as e:
                bodies_4xx.append(("openai tool loop", json.dumps(e.body)))
                check(False, f"tool loop (stream {streamed}): {e.status_code} {e.message}")
        else:
            body = {"messages": history, "tools": TOOLS, "max_tokens": 6, "temperature": 0}
            stream(s, body) if streamed else s.post("/v1/chat/completions", body)
    # content missing, and content parts: normalized as vLLM does.
    s.post("/v1/chat/completions", {"messages": msgs + [{"role": "assistant"}, {"role": "user", "content": [
        {"type": "text", "text": "And"}, {"type": "text", "text": "Rome?"}]}], "max_tokens": 2})


def stream(s, body):
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
    c.request("POST", "/v1/chat/completions", body=json.dumps(dict(body, stream=True)))
    r = c.getresponse()
    check(r.status == 200, f"stream status {r.status}")
    out = [json.loads(l[6:]) for l in (x.decode().strip() for x in r) if l.startswith("data: {")]
    c.close()
    return [ch["choices"][0]["delta"] for ch in out if ch.get("choices")]


def bodies():
    """(custom_id, url, body): what serve and batch must answer alike."""
    C, H = "/v1/completions", "/v1/chat/completions"
    p = "The three most common colors of flowers are"
    hi = [{"role": "user", "content": "Hi, who are you?"}]
    schema = {"type": "object", "required": ["name"], "additionalProperties": False,
              "properties": {"name": {"type": "string", "maxLength": 8}}}
    loop = hi + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    return [("greedy", C, {"prompt": p, "max_tokens": 5, "temperature": 0}),
            ("logprobs", C, {"prompt": p, "max_tokens": 4, "temperature": 0, "logprobs": 3}),
            ("echo", C, {"prompt": p, "max_tokens": 3, "temperature": 0, "echo": True}),
            ("echo-lp", C, {"prompt": p, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1}),
            ("echo-0", C, {"prompt": p, "max_tokens": 0, "echo": True, "logprobs": 2}),
            ("n", C, {"prompt": p, "max_tokens": 4, "temperature": 1, "seed": 7, "n": 3}),
            ("stop", C, {"prompt": p, "max_tokens": 20, "temperature": 0, "stop": [",", "."]}),
            ("prompts", C, {"prompt": ["The sea", "My dog"], "max_tokens": 3, "temperature": 0}),
            ("prompt-lp", C, {"prompt": p, "max_tokens": 2, "temperature": 0, "prompt_logprobs": 2}),
            ("best-of", C, {"prompt": p, "max_tokens": 4, "temperature": 1, "seed": 3, "best_of": 3}),
            ("chat", H, {"messages": hi, "max_tokens": 6, "temperature": 0}),
            ("chat-lp", H, {"messages": hi, "max_tokens": 3, "temperature": 0, "logprobs": True, "top_logprobs": 2}),
            ("schema", H, {"messages": hi, "max_tokens": 30, "temperature": 0,
                           "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}),
            ("tools", H, {"messages": hi, "max_tokens": 30, "temperature": 0, "tools": TOOLS, "tool_choice": "required"}),
            ("tool-loop", H, {"messages": loop, "max_tokens": 5, "temperature": 0, "tools": TOOLS}),
            ("chat-n", H, {"messages": hi, "max_tokens": 3, "temperature": 1, "seed": 5, "n": 2}),
            ("bad-field", C, {"prompt": p, "frobnicate": 1}),
            ("too-long", C, {"prompt": p, "max_tokens": 100000}),
            ("no-model", H, {"model": "gpt-3.5-turbo-0125", "messages": hi}),
            ("bad-stream", C, {"prompt": p, "prompt_logprobs": 1, "stream": True}),
            ("bad-role", H, {"messages": [{"content": "x"}]})]


def same(a, b, where, diffs):
    """a == b field by field: ids and created aside, floats within 1e-4."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = set(a) | set(b)
        for k in keys - {"id", "created", "cached_tokens", "request_id"}:
            same(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{where}.{k}", diffs)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]", diffs)
    elif isinstance(a, float) and isinstance(b, (float, int)):
        if abs(a - b) > 1e-4:
            diffs.append(f"{where}: {a} != {b}")
    elif a != b:
        diffs.append(f"{where}: {json.dumps(a)[:120]} != {json.dumps(b)[:120]}")


def start_batch():
    inp, out = os.path.join(TMP.name, "in.jsonl"), os.path.join(TMP.name, "out.jsonl")
    with open(inp, "w") as f:
        for cid, url, body in bodies():
            f.write(json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body}) + "\n")
    return start(["batch", "--input", inp, "--output", out, "--kv-cache-gb", "0.2", "--progress", "none"]), out


def batch_section(s, batch):
    t0 = time.time()
    cases = bodies()
    serve_out = {cid: s.request_json("POST", url, body) for cid, url, body in cases}
    finished(batch[0], "lattice batch")
    recs = {}
    for line in open(batch[1]):
        j = json.loads(line)
        recs[j["custom_id"]] = j
    for cid, _, _ in cases:
        st, want = serve_out[cid]
        rec = recs.get(cid)
        if not check(rec is not None and rec["response"] is not None, f"batch: no response record for {cid}: {rec}"):
            continue
        got = rec["response"]["body"]
        if st >= 400:
            bodies_4xx.append((f"batch {cid}", json.dumps(got)))
        diffs = []
        same(got, want, cid, diffs)
        check(rec["response"]["status_code"] == st and rec["error"] is None and not diffs,
              f"batch != serve for {cid}: status {rec['response']['status_code']} vs {st}: {diffs[:4]}")
    check(sum(st >= 400 for st, _ in serve_out.values()) == 5, "five of the bodies are refused by serve")
    print(f"  {len(cases)} bodies through serve and batch: {time.time() - t0:.1f} s", flush=True)


t0 = time.time()
batch_run = start_batch()
server = Server()
print(f"serve ready: {time.time() - t0:.1f} s", flush=True)
try:
    for section in (lm_eval_section, endpoints_section, tool_loop_section, lambda s: batch_section(s, batch_run)):
        t1 = time.time()
        section(server)
        print(f"{getattr(section, '__name__', 'batch_section').strip('<>')}: {time.time() - t1:.1f} s", flush=True)
finally:
    server.stop()
    for p in (batch_run[0],):
        if p.poll() is None:
            p.kill()
for what, body in bodies_4xx:
    leak = path_leak(body, [model])
    check(not leak, f"{what}: the error body shows the server path {leak!r}: {body[:300]}")
print(f"{len(bodies_4xx)} error bodies scanned for server paths; {time.time() - t0:.1f} s in all")
finish()
