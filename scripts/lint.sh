#!/usr/bin/env bash
# Lint, format and type checks (part of scripts/test.sh, so of CI): ruff on everything; mypy
# --strict on events/, policies/ and the engine's pure core (the modules that import no torch).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
core=(loop loop_parts loop_calls loop_end apply intents inflight batches guard finale cuts summary errors state buffer buffer_groups dispatcher executor
      snapshot local rollout trainer_host backend config config_base config_run config_rollout config_trainer checkpoint records placement ranks supervisor model_dir
      datasets dataset_files deadlines rewards environments turns replica_modes replica_validation replica_envs heartbeat batch_stats math_reward
      relay in_order)
args=(-p shunter.events -p shunter.policies -p shunter.engine.tasks)
for m in "${core[@]}"; do args+=(-m "shunter.engine.$m"); done
# mypy sees the package under its installed name through a link (the repository root is the package)
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
ln -s "$PWD" "$root/shunter"
(cd "$root" && "$OLDPWD/.venv/bin/mypy" --strict --config-file "$OLDPWD/pyproject.toml" --cache-dir "$OLDPWD/.mypy_cache" "${args[@]}")
