#!/usr/bin/env python3
"""`lattice chat` in a pseudo-terminal (stdlib pty), on the built-in default model (the executable's
own default-model resolution: no --model), greedy (--temperature 0) with --verbose-prompt, which
prints each turn's prompt ids on stderr:
  - two turns: the second turn's prompt starts with the whole first prompt and contains the ids of
    the first answer (as `lattice tokenize` encodes its text) and of the second message: the
    conversation is kept; the first answer is not empty;
  - /reset: the next prompt is the first-turn rendering of the new message alone (equal to what a
    fresh chat sends for it), without the earlier answer;
  - Ctrl-C while an answer streams stops it ("answer stopped"), the prompt comes back, and the next
    message gets an answer; Ctrl-D at the prompt exits 0; in a second session Ctrl-C at the prompt
    exits 0; a message too long for a tiny --max-seq is refused, not sent, and the chat goes on.
Every wait is for output (a hang guard is the only timeout); nothing sleeps for ordering.
Usage: test_chat.py LATTICE_BINARY SOURCE_DIR   (exit 0 pass, 77 skip, 1 fail)"""
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

lattice, source = os.path.abspath(sys.argv[1]), sys.argv[2]
model = os.path.join(source, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
if not os.environ.get("LATTICE_DEFAULT_MODEL") and not os.path.exists(model):
    print(f"SKIP: the default model {model} is missing (scripts/setup.sh fetches it)")
    sys.exit(77)
tok_model = os.environ.get("LATTICE_DEFAULT_MODEL") or model

HANG_GUARD = 600  # seconds per wait: only against a hang
fails = []


def check(ok, what):
    print(("ok: " if ok else "FAILED: ") + what)
    if not ok:
        fails.append(what)


class Session:
    """lattice chat on a pty: its stdin, stdout and stderr are the terminal."""

    def __init__(self, args):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            try:
                os.chdir("/")  # away from the source tree: the default model is found by the executable
                os.execv(lattice, [lattice, "chat"] + args)
            finally:
                os._exit(127)
        self.buf = ""
        self.pos = 0  # what expect() consumed

    def read_some(self, deadline):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no output for %d s; so far:\n%s" % (HANG_GUARD, self.buf[-2000:]))
        r, _, _ = select.select([self.fd], [], [], left)
        if not r:
            return False
        try:
            data = os.read(self.fd, 4096)
        except OSError:  # EIO: the child closed the terminal (exited)
            data = b""
        if not data:
            raise EOFError("the chat exited; so far:\n" + self.buf[-2000:])
        self.buf += data.decode("utf-8", "replace").replace("\r\n", "\n")
        return True

    def expect(self, pattern):
        """Waits until `pattern` (regex) appears after what was consumed; returns the match."""
        rx = re.compile(pattern, re.S)
        deadline = time.monotonic() + HANG_GUARD
        while True:
            m = rx.search(self.buf, self.pos)
            if m:
                self.pos = m.end()
                return m
            self.read_some(deadline)

    def send(self, text):
        os.write(self.fd, text.encode())

    def turn(self, message):
        """Sends a message; returns (prompt ids, answer text) once the next prompt shows."""
        self.send(message + "\n")
        m = self.expect(r"chat: prompt of (\d+) tokens: ([\d ]+)\n")
        ids = [int(x) for x in m.group(2).split()]
        check(len(ids) == int(m.group(1)), "the prompt line's count matches its ids")
        a = self.expect(r"(.*?)\n> ")
        # The terminal carries stderr too: an answer cut at -n ends with chat's notice, not text.
        return ids, re.sub(r"\s*chat: the answer reached --max-new-tokens \d+\s*$", "", a.group(1))

    def wait_exit(self):
        deadline = time.monotonic() + HANG_GUARD
        while True:  # drain until the terminal closes, then reap
            try:
                if not self.read_some(deadline):
                    continue
            except EOFError:
                break
        _, status = os.waitpid(self.pid, 0)
        os.close(self.fd)
        return os.waitstatus_to_exitcode(status)

    def kill(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except OSError:
            pass


def tokenize(text):
    out = subprocess.run([lattice, "tokenize", "--tokenizer", tok_model, "--text", text], capture_output=True,
                         text=True, timeout=120)
    return [int(x) for x in re.findall(r"-?\d+", out.stdout)]


def contains(seq, sub):
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


# --quant w8a16: the name check below is about the conversation being kept, so it runs the model on
# its accurate path; under the default W8A8 (activations rounded to int8 per token) this 135M model
# forgets the name on some machines (2-vCPU Intel Xeon, AVX-512, 2026-12-03: "My name is Elara"),
# while fp32 and W8A16 answer "Your name is Zorblax" (test_smollm_nll bounds W8A8's accuracy).
base = ["--temperature", "0", "--verbose-prompt", "--max-seq", "1024", "--threads", "2", "--quant", "w8a16"]
s = Session(base + ["-n", "120"])
try:
    s.expect(r"\n> ")
    m1 = "My name is Zorblax and I live on the planet Quux."
    ids1, ans1 = s.turn(m1)
    ans1 = ans1.split(m1, 1)[-1].strip()  # (the terminal echoes what we typed)
    check(len(ans1) > 0, f"turn 1 answered: {ans1!r}")
    m2 = "What is my name?"
    ids2, ans2 = s.turn(m2)
    print(f"turn 1 prompt {len(ids1)} tokens, answer {ans1!r}\nturn 2 prompt {len(ids2)} tokens, answer {ans2!r}")
    check(ids2[:len(ids1)] == ids1, "turn 2's prompt starts with all of turn 1's prompt")
    a1 = tokenize(ans1)
    check(len(a1) > 0 and contains(ids2[len(ids1):], a1), "turn 2's prompt holds turn 1's answer (its token ids)")
    check(contains(ids2, tokenize(m2)), "... and the new message")
    check(len(ids2) >= len(ids1) + len(a1) + len(tokenize(m2)), "the prompt grew by the answer and the message")
    check("Zorblax" in ans2, f"the second answer uses the first turn: it knows the name ({ans2!r})")

    s.send("/reset\n")
    s.expect(r"conversation cleared\n> ")
    ids3, ans3 = s.turn(m2)
    check(not contains(ids3, a1) and not contains(ids3, tokenize("Zorblax")),
          "after /reset the prompt holds nothing of the earlier turns")
    check(len(ids3) < len(ids2), f"after /reset the prompt is short again ({len(ids3)} < {len(ids2)})")
    check("Zorblax" not in ans3, f"... and the answer no longer knows the name ({ans3!r})")

    # Ctrl-C while the answer streams: wait for the first answer bytes after the prompt line.
    s.send("Write a very long story about a dragon who learns to sing, in ten chapters.\n")
    s.expect(r"chat: prompt of \d+ tokens: [\d ]+\n")
    s.expect(r"\S")  # the answer has started
    s.send("\x03")
    m = s.expect(r"(answer stopped|\n> )")
    check(m.group(1) == "answer stopped", "Ctrl-C stops the answer and says so")
    if m.group(1) == "answer stopped":
        s.expect(r"\n> ")
    ids5, ans5 = s.turn("Say hello.")
    check(len(ids5) > len(ids3), "after Ctrl-C the conversation goes on (the partial answer is kept)")
    check(ans5.split("Say hello.", 1)[-1].strip() != "", f"... and the next message gets an answer: {ans5!r}")
    s.send("\x04")  # Ctrl-D at the prompt
    rc = s.wait_exit()
    check(rc == 0, f"Ctrl-D at the prompt exits 0 (got {rc})")
except (TimeoutError, EOFError) as e:
    check(False, f"session 1: {e}")
    s.kill()

# A second session: a message that cannot fit a tiny context is refused; Ctrl-C at the prompt exits 0.
s = Session(["--temperature", "0", "--max-seq", "48", "--threads", "2", "-n", "4"])
try:
    s.expect(r"\n> ")
    s.send(" ".join(["word"] * 80) + "\n")
    s.expect(r"not sent")
    s.expect(r"\n> ")
    s.send("Hi\n")
    s.expect(r"\n> ")  # answered (or cut by the context), and back at the prompt
    s.send("\x03")
    rc = s.wait_exit()
    check(rc == 0, f"Ctrl-C at the prompt exits 0 (got {rc})")
    check("not sent" in s.buf, "a message beyond the context is refused clearly")
except (TimeoutError, EOFError) as e:
    check(False, f"session 2: {e}")
    s.kill()

print(f"test_chat: {len(fails)} failed")
sys.exit(1 if fails else 0)
