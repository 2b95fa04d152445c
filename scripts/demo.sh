#!/usr/bin/env bash
# One command from a fresh machine to a learning async RL run:
# venv + dependencies, a tiny HF model built offline, then `shunter run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ "$#" -eq 0 ] || [ "${1#-}" != "$1" ]; then set -- examples/sort_separate.toml "$@"; fi  # flags alone: the default config
exec .venv/bin/shunter run "$@"
