#!/usr/bin/env bash
# The test suite: lint and types (scripts/lint.sh), then unit, contracts, actors (local Ray) and
# end to end (vLLM CPU + torch). Extra arguments go to pytest and skip the lint
# (e.g. `bash scripts/test.sh tests/unit`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "$#" -eq 0 ]; then bash scripts/lint.sh; fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
