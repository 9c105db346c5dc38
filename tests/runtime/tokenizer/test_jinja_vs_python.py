#!/usr/bin/env python3
"""lattice's Jinja engine against Python's jinja2 on the chat templates of real models.

Every template in ../shared/chat-templates is rendered on a set of conversations (system + user,
multi-turn, tools given, tool calls and results, add_generation_prompt true and false, non-ASCII
and odd whitespace) by tests/runtime/tokenizer/jinja_render (one process for all cases) and by jinja2
configured as Hugging Face transformers configures it (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loopcontrols, its tojson, raise_exception and strftime_now; strftime_now on a fixed
date here). Outputs must be byte-identical; a case that raises in jinja2 must raise in lattice.
Exit 77 (SKIP) only when python3-jinja2 is missing (scripts/setup.sh installs it).

Usage: test_jinja_vs_python.py RENDER_EXE TEMPLATE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime

try:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("SKIP: python3-jinja2 is not installed (scripts/setup.sh installs it)")
    sys.exit(77)

NOW = "2024-09-05"

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Unit  "},
            "days": {"type": ["integer", "number"], "description": "Forecast days"},
            "tags": {"type": "array", "items": {"type": "string"}, "description": "Tags"}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "number", "description": "first"}, "b": {"type": "number", "description": "second"}},
            "required": ["a", "b"]},
        "return": {"type": "number", "description": "the sum"}}},
]

SYSTEM = {"role": "system", "content": "You are terse. Answer in one line."}
CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system_user": [SYSTEM, {"role": "user", "content": "  What is 2+2?  \n"}],
    "multi_turn": [SYSTEM, {"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": "<think>\nsay hi\n</think>\n\nHello, how can I help?"},
                   {"role": "user", "content": "Tell me a joke about \"quotes\" and 'apostrophes'."}],
    "unicode": [{"role": "user", "content": "Grüße, 世界! Ça va? \t tabs\nnewlines"},
                {"role": "assistant", "content": "Très bien — merci."},
                {"role": "user", "content": "\u00a0¿Y tú? 🙂\u3000\n"}],
    "no_think_system": [{"role": "system", "content": "Be brief. /no_think"}, {"role": "user", "content": "Why?"}],
    "tool_call": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call12345", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"temp\": 21.5}"},
        {"role": "assistant", "content": "It is 21.5 °C in Paris."},
        {"role": "user", "content": "Thanks"}],
    "tool_call_string_args": [
        {"role": "user", "content": "Add 1 and 2"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "abcdefghi", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"}}]},
        {"role": "tool", "tool_call_id": "abcdefghi", "content": "3"}],
    "two_tool_results": [
        {"role": "user", "content": "Both?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "aaaaaaaaa", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
        {"role": "tool", "tool_call_id": "aaaaaaaaa", "content": "3"},
        {"role": "tool", "tool_call_id": "aaaaaaaaa", "content": "again 3"}],
    "bad_roles": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    "empty": [],
}


def cases(template_dir):
    out = []
    for name in sorted(os.listdir(template_dir)):
        if not name.endswith(".jinja"):
            continue
        path = os.path.join(template_dir, name)
        for conv_name, conv in CONVERSATIONS.items():
            for tools in (None, TOOLS):
                if tools and conv_name in ("unicode", "bad_roles", "empty"):
                    continue
                for agp in (True, False):
                    if not agp and conv_name not in ("multi_turn", "tool_call", "user"):
                        continue
                    ctx = {"messages": conv, "tools": tools, "add_generation_prompt": agp,
                           "bos_token": "<s>", "eos_token": "</s>"}
                    out.append({"template": path, "context": ctx,
                                "label": f"{name} {conv_name} tools={bool(tools)} agp={agp}"})
    return out


_COMPILED = {}


def python_render(path, ctx):
    if path in _COMPILED:
        return _COMPILED[path].render(**ctx)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.strptime(NOW, "%Y-%m-%d").replace(hour=12).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    with open(path, encoding="utf-8") as f:
        template = env.from_string(f.read())
    _COMPILED[path] = template
    return template.render(**ctx)


def main():
    exe, template_dir = sys.argv[1], sys.argv[2]
    if not os.path.isdir(template_dir):
        print(f"FAIL: {template_dir} not found")
        return 1
    all_cases = cases(template_dir)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
        json.dump({"now": NOW, "cases": [{"template": c["template"], "context": c["context"]} for c in all_cases]}, f)
        spec = f.name
    try:
        got = json.loads(subprocess.run([exe, spec], check=True, capture_output=True, text=True).stdout)
    finally:
        os.unlink(spec)
    if len(got) != len(all_cases):  # zip() below would compare only the first ones
        print(f"FAIL: jinja_render gave {len(got)} results for {len(all_cases)} cases")
        return 1
    failures, raised = 0, 0
    templates = set()
    for case, mine in zip(all_cases, got):
        templates.add(case["template"])
        try:
            want, want_err = python_render(case["template"], case["context"]), None
        except Exception as e:  # noqa: BLE001 - any jinja2 error must be an error in lattice too
            want, want_err = None, f"{type(e).__name__}: {e}"
        if want_err is not None:
            raised += 1
            if "error" not in mine:
                failures += 1
                print(f"FAIL {case['label']}: jinja2 raised ({want_err}), lattice rendered {mine['out'][:200]!r}")
            continue
        if "error" in mine:
            failures += 1
            print(f"FAIL {case['label']}: lattice raised {mine['error']!r}")
        elif mine["out"] != want:
            failures += 1
            at = next((i for i, (a, b) in enumerate(zip(mine["out"], want)) if a != b), min(len(mine["out"]), len(want)))
            print(f"FAIL {case['label']}: differs at {at}:\n  lattice {mine['out'][max(0, at - 60):at + 60]!r}\n"
                  f"  jinja2  {want[max(0, at - 60):at + 60]!r}")
    print(f"{len(all_cases)} renders of {len(templates)} templates, {raised} raising in both expected; "
          f"{failures} mismatches")
    if len(templates) < 10 or raised == 0:
        print("FAIL: expected >= 10 templates and some raising cases")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
