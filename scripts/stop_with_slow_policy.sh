#!/usr/bin/env bash
# Issue 31's operator check: a policy that takes 50 ms a call (tests/support/broken_policies.py:Slow), one
# Ctrl-C after step 6; prints how long the run took to exit (exit status 130 and the --resume line
# expected). Measured 2026-12-06 on the 2-core machine: 29 s before the fix, 5.0 s after.
# Usage: bash scripts/stop_with_slow_policy.sh [WORKDIR]   (needs .venv and the tiny model)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$(mktemp -d)}
mkdir -p "$work/.shunter/models"
cp -r "$root/examples" "$work/" && cp "$root/tests/broken_policies.py" "$work/"
[ -e "$work/.shunter/models/sort-tiny" ] || ln -s "$root/.shunter/models/sort-tiny" "$work/.shunter/models/sort-tiny"
cd "$work" && rm -rf runs/slow
export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1
setsid "$root/.venv/bin/shunter" run examples/sort_separate.toml --policy broken_policies:Slow --steps 40 \
  --no-progress --run-id slow > run.log 2>&1 &
pid=$!
until [ -f runs/slow/metrics.jsonl ] && [ "$(wc -l < runs/slow/metrics.jsonl)" -ge 6 ]; do
  kill -0 $pid 2>/dev/null || { echo "the run ended before the stop; see $work/run.log"; exit 1; }
  sleep 1
done
t0=$(date +%s.%N)
kill -INT $pid
rc=0; wait $pid || rc=$?
echo "exit status $rc, $(echo "$(date +%s.%N) - $t0" | bc) s after one Ctrl-C; log: $work/run.log"
