"""Checks shared by the python serve tests on what a client may see in an error body.
A 4xx/5xx body must never show a filesystem path of the server (the model is named by its served id):
path_leak(body, extra) returns the first server path found in it ("" when none): the given extra paths
(the model file and its folder) and any absolute path under /work, /tmp, /root or /home."""
import os
import re

ROOTS = ("/work", "/tmp", "/root", "/home")
_PATH = re.compile(r"(?<![A-Za-z0-9_.:])(" + "|".join(re.escape(r) for r in ROOTS) + r")(/[^\s\"'<>]*)?")


def path_leak(body, extra=()):
    for p in extra:
        for q in (p, os.path.dirname(p), os.path.realpath(p)):
            if q and q != "/" and q in body:
                return q
    m = _PATH.search(body)
    return m.group(0) if m else ""
