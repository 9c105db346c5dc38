#!/usr/bin/env bash
# Sets up everything (Debian packages, the built-in SmolLM2-135M-Instruct model), builds lattice,
# and answers one chat prompt with it, printing the answer and prefill/decode tokens/s.
# Usage: scripts/quickstart.sh ["your prompt"] [extra lattice generate flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/lattice-ccache}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target lattice -j"${LATTICE_JOBS:-$(nproc)}"
prompt=${1:-"Explain in two sentences why the sky is blue."}
shift || true
exec build/launch/lattice generate --chat --prompt "$prompt" --max-new-tokens 128 "$@"
