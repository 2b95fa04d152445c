#!/usr/bin/env bash
# The test suite: unit, contracts, actors (local Ray) and end to end (vLLM CPU + torch).
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -m "not e2e"`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
