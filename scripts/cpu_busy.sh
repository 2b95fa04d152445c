#!/usr/bin/env bash
# How busy the machine's cores are while a command runs: one line a 10 s interval from
# /proc/stat's `cpu` line, then the mean (issue 30's CI study: `bash scripts/cpu_busy.sh bash .ci/run`
# read 69 % on one pytest process, 94 % on two xdist workers, 2026-12-06, 2 cores).
set -uo pipefail
"$@" &
job=$!
prev=($(head -1 /proc/stat)); sum=0; n=0
while kill -0 "$job" 2>/dev/null; do
  sleep 10
  cur=($(head -1 /proc/stat))
  t=0; for i in 1 2 3 4 5 6 7 8; do t=$((t + cur[i] - prev[i])); done
  idle=$((cur[4] - prev[4] + cur[5] - prev[5]))
  [ "$t" -gt 0 ] && { b=$((100 - 100 * idle / t)); sum=$((sum + b)); n=$((n + 1)); echo "cpu_busy $(date +%T) ${b}%" >&2; }
  prev=("${cur[@]}")
done
wait "$job"; rc=$?
[ "$n" -gt 0 ] && echo "cpu_busy mean $((sum / n))% over $n samples" >&2
exit "$rc"
