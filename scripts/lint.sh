#!/usr/bin/env bash
# Lint, format and type checks (part of scripts/test.sh, so of CI): ruff on everything; mypy
# --strict on events/, policies/ and the engine's pure core (the modules that import no torch).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# the engine's sub-packages that import no torch, whole; of the trainer's, the modules that import none
args=(-p shunter.events -p shunter.policies)
for p in io config data tasks replica coordinator; do args+=(-p "shunter.engine.$p"); done
for m in trainer.host trainer.in_order trainer.batch_stats trainer.counters models.folder; do args+=(-m "shunter.engine.$m"); done
# mypy sees the package under its installed name through a link (the repository root is the package)
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
ln -s "$PWD" "$root/shunter"
(cd "$root" && "$OLDPWD/.venv/bin/mypy" --strict --config-file "$OLDPWD/pyproject.toml" --cache-dir "$OLDPWD/.mypy_cache" "${args[@]}")
