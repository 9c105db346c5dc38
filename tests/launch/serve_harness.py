"""What the python tests of `lattice serve` share (test_serve.py, test_serve_clients.py, test_lora_fronts.py):
  check(ok, what) / fails / finish(): failures collected, the run's verdict and exit status;
  Server(cmd, ...): a server process (or an mpirun of them, or a Slurm template) in its own process group, its
    port read from its "listening on" line, ready once /health answers 200; request / stream / metrics against
    it; every 4xx / 5xx body scanned for a path of the server (serve_bodies.path_leak); killed, group and all,
    by cleanup() at exit when still running;
  Api(port, key, leak_paths): completions, chat and models through the official openai client when it is
    installed, else http.client, as plain dicts in OpenAI's shapes.
Every wait is bounded."""
import atexit
import http.client
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

from serve_bodies import path_leak

try:
    import openai
except ImportError:
    openai = None

fails = []
_processes = []  # every process started, for cleanup()


def check(ok, what):
    if not ok:
        fails.append(what)
        print("FAILED:", what, flush=True)
    return ok


def finish(prefix=""):
    """Prints the verdict and exits 1 when any check failed, else 0."""
    print(f"{prefix}{'FAILED: ' + str(len(fails)) if fails else 'all passed'}")
    sys.exit(1 if fails else 0)


def cleanup():
    for p in _processes:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # mpirun and its ranks too
            except OSError:
                pass
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass


atexit.register(cleanup)

_LISTENING = re.compile(r"lattice serve: listening on http://127\.0\.0\.1:(\d+)$")


class Server:
    """`cmd` (a `lattice serve ... --port 0`, or what starts one) run in its own session; `leak_paths`: paths an
    error body must not show besides any under /work, /tmp, /root, /home (the model file, its folder)."""

    def __init__(self, cmd, mpirun_np=0, env=None, leak_paths=(), ready_s=300):
        if mpirun_np:
            mpi = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(mpirun_np)]
            if os.geteuid() == 0:
                mpi.append("--allow-run-as-root")
            cmd = mpi + cmd
        self.leak_paths = tuple(leak_paths)
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                  start_new_session=True)
        _processes.append(self.p)
        self.err = []
        self.err_reader = threading.Thread(target=lambda: self.err.extend(self.p.stderr), daemon=True)
        self.err_reader.start()
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(l) for l in self.p.stdout] + [lines.put(None)], daemon=True).start()
        self.port = None
        deadline = time.time() + 120
        while time.time() < deadline and self.port is None:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.time()))
            except queue.Empty:
                break
            if line is None:
                break
            m = _LISTENING.match(line.strip())
            if m:
                self.port = int(m.group(1))
        if self.port is None:
            cleanup()
            raise SystemExit(f"server did not say where it listens: {' '.join(cmd)}\n{''.join(self.err[-20:])}")
        deadline = time.time() + ready_s
        while time.time() < deadline and self.p.poll() is None:
            if self.request("GET", "/health", timeout=30)[0] == 200:
                return
            time.sleep(0.05)
        cleanup()
        raise SystemExit(f"server never became ready: {''.join(self.err[-20:])}")

    def scan(self, what, status, body):
        """Checks that an error body shows no server path."""
        if status >= 400:
            leak = path_leak(body, self.leak_paths)
            check(not leak, f"{what}: {status} body shows the server path {leak!r}: {body[:200]}")

    def request(self, method, path, body=None, headers=None, raw=None, timeout=300):
        """(status, headers dict, body text); status 0 when the connection failed."""
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
            data = raw if raw is not None else (json.dumps(body) if body is not None else None)
            c.request(method, path, body=data, headers=headers or {})
            r = c.getresponse()
            out = (r.status, dict(r.getheaders()), r.read().decode())
            c.close()
        except OSError:
            return 0, {}, ""
        self.scan(f"{method} {path}", out[0], out[2])
        return out

    def request_json(self, method, path, body=None, timeout=300):
        """(status, the body parsed as JSON, or its text when it is not JSON)."""
        st, _, text = self.request(method, path, body, {"Content-Type": "application/json"}, timeout=timeout)
        try:
            return st, json.loads(text)
        except ValueError:
            return st, text

    def stream(self, path, body, headers=None):
        """The parsed events of a streamed response ("[DONE]" kept as a string)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        c.request("POST", path, body=json.dumps(body), headers=headers or {})
        r = c.getresponse()
        check(r.status == 200 and r.getheader("Content-Type") == "text/event-stream", f"stream status {r.status}")
        events = []
        for line in r:
            line = line.decode().rstrip("\n")
            if line.startswith("data: "):
                events.append("[DONE]" if line == "data: [DONE]" else json.loads(line[6:]))
        c.close()
        return events

    def metrics(self):
        st, _, text = self.request("GET", "/metrics")
        out = {}
        for line in text.splitlines():
            m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", line)
            if m:
                # lattice: metrics (vLLM's names) carry only the model_name label: keyed by the bare name.
                labels = m.group(2) or ""
                key = m.group(1) if labels.startswith('{model_name="') and "," not in labels else m.group(1) + labels
                out[key] = float(m.group(3))
        return out

    def wait_metrics(self, pred, limit=120):
        """Polls /metrics until pred(metrics) holds or `limit` seconds pass; returns the last metrics."""
        deadline = time.time() + limit
        while True:
            m = self.metrics()
            try:
                if pred(m):
                    return m
            except KeyError:
                pass
            if time.time() > deadline:
                return m
            time.sleep(0.05)

    def wait(self):
        try:
            rc = self.p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait(timeout=30)
            rc = "hung"
        self.err_reader.join(timeout=10)
        return rc

    def stop(self, sig=signal.SIGTERM, what="server"):
        self.p.send_signal(sig)
        rc = self.wait()
        check(rc == 0, f"{what}: exit status after signal {sig}: {rc}: {''.join(self.err[-10:])}")


class ApiError(Exception):
    def __init__(self, status, message):
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message


class Api:
    """Completions, chat and models through the official openai client when it is installed, else through
    http.client; either way the results are plain dicts in OpenAI's shapes (streams: the list of chunks)
    and refusals raise ApiError(status, message)."""

    def __init__(self, port, key, leak_paths=()):
        self.port, self.key, self.leak_paths = port, key, tuple(leak_paths)
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key or "none", max_retries=0,
                                    timeout=300) if openai else None

    def _scan(self, what, status, body):
        leak = path_leak(body, self.leak_paths)
        check(not leak, f"{what}: {status} body shows the server path {leak!r}")

    def create(self, what, extra_body=None, **kw):
        if self.client:
            api = self.client.completions if what == "completions" else self.client.chat.completions
            try:
                r = api.create(**kw, extra_body=extra_body)
                return [c.model_dump() for c in r] if kw.get("stream") else r.model_dump()
            except openai.APIStatusError as e:
                self._scan(what, e.status_code, json.dumps(e.body))
                raise ApiError(e.status_code, e.message)
        body = dict(kw, **(extra_body or {}))
        path = "/v1/completions" if what == "completions" else "/v1/chat/completions"
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        try:
            c.request("POST", path, body=json.dumps(body), headers={"Authorization": f"Bearer {self.key}",
                                                                     "Content-Type": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                text = r.read().decode()
                self._scan(what, r.status, text)
                raise ApiError(r.status, json.loads(text)["error"]["message"])
            if not kw.get("stream"):
                return json.loads(r.read())
            data = [l.decode().rstrip("\n")[6:] for l in r if l.startswith(b"data: ")]
            check(data and data[-1] == "[DONE]", f"stream without [DONE]: {data[-1:]}")
            return [json.loads(d) for d in data if d != "[DONE]"]
        finally:
            c.close()

    def models(self):
        if self.client:
            try:
                return [m.id for m in self.client.models.list().data]
            except openai.APIStatusError as e:
                raise ApiError(e.status_code, e.message)
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        c.request("GET", "/v1/models", headers={"Authorization": f"Bearer {self.key}"})
        r = c.getresponse()
        body = r.read()
        c.close()
        if r.status != 200:
            raise ApiError(r.status, json.loads(body)["error"]["message"])
        return [m["id"] for m in json.loads(body)["data"]]
