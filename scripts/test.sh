#!/usr/bin/env bash
# The test suite: lint and types (scripts/lint.sh), then unit, contracts, actors (local Ray) and
# end to end (vLLM CPU + torch). Extra arguments go to pytest and skip the lint
# (e.g. `bash scripts/test.sh tests/unit`).
#
# The whole suite runs on SHUNTER_TEST_WORKERS pytest-xdist workers (default 2; 0: one process),
# each taking the next test as it frees up (worksteal), so the long end-to-end tests run side by
# side. Measured on the 2-core machine (2026-12-06): one process keeps the cores 69 % busy (most
# of an e2e test is a vLLM engine start's imports, one process at a time) and took 1,582 s; two
# workers kept them 94 % busy and took 1,122 s, every test passing. The tests are written for
# it: the unit tier passes with both cores busy, and no test finds or ends processes other than
# its own (a run's process group, its Ray session's folder, an environment mark).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ "$#" -eq 0 ]; then
  bash scripts/lint.sh
  exec .venv/bin/python -m pytest -p no:cacheprovider -n "${SHUNTER_TEST_WORKERS:-2}" --dist worksteal
fi
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
