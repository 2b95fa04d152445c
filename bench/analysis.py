"""Figures derived from a run's event log (real or simulated), nothing else.

Invariants: every figure is a pure function of the messages (their ``wall_time`` stamps
and durations), so the same log always gives the same numbers and a real run and a
simulated one are measured by the same code.

- trainer busy: the sum of ``StepEnd.duration_s`` and ``WeightsReady.duration_s``;
- replica busy: time with at least one sample generating (+1 at ``SampleBegin`` /
  ``SampleResumed``, -1 at ``SampleEnd`` / ``SampleAborted``), counted while the replica is
  in rollout mode (standalone from the start, hybrid between ``ModeChanged`` events);
- idle fraction = 1 - busy / span, span = first ``RunStarted`` to ``RunEnded``;
- ideal overlap step time = max(trainer busy, mean replica busy) / steps: the step time if
  generation and training + sync overlapped perfectly with the same work.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from shunter.events import (
    Message,
    ModeChanged,
    ReplicaUp,
    RunEnded,
    RunStarted,
    SampleAborted,
    SampleBegin,
    SampleEnd,
    SampleResumed,
    StepEnd,
    WeightsReady,
)
from shunter.events.view import ROLLOUT


def _intervals_busy(changes: list[tuple[float, int]], start: float, end: float) -> float:
    """Time with a positive running count, given (time, +-1) changes."""
    busy, level, last = 0.0, 0, start
    for t, d in sorted(changes, key=lambda x: (x[0], -x[1])):
        t = min(max(t, start), end)
        if level > 0:
            busy += t - last
        level += d
        last = t
    if level > 0:
        busy += end - last
    return busy


def summarize(messages: Iterable[Message]) -> dict[str, float]:
    msgs = list(messages)
    start = next((m.wall_time for m in msgs if isinstance(m, RunStarted)), msgs[0].wall_time if msgs else 0.0)
    end = next((m.wall_time for m in reversed(msgs) if isinstance(m, RunEnded)), msgs[-1].wall_time if msgs else 0.0)
    span = max(end - start, 1e-12)
    steps = [m for m in msgs if isinstance(m, StepEnd)]
    trainer_busy = sum(m.duration_s for m in steps) + sum(m.duration_s for m in msgs if isinstance(m, WeightsReady))
    flight: dict[str, list[tuple[float, int]]] = defaultdict(list)
    rollout_spans: dict[str, list[tuple[float, int]]] = defaultdict(list)
    tokens = 0
    for m in msgs:
        match m:
            case ReplicaUp():
                if m.mode == ROLLOUT:
                    rollout_spans[m.replica_id].append((start, 1))
                else:
                    rollout_spans.setdefault(m.replica_id, [])
            case ModeChanged():
                rollout_spans[m.replica_id].append((m.wall_time, 1 if m.mode == ROLLOUT else -1))
            case SampleBegin() | SampleResumed():
                flight[m.replica_id].append((m.wall_time, 1))
            case SampleEnd():
                flight[m.replica_id].append((m.wall_time, -1))
                tokens += len(m.sample.token_ids)
            case SampleAborted():
                flight[m.replica_id].append((m.wall_time, -1))
    replica_busy = {r: _intervals_busy(flight.get(r, []), start, end) for r in rollout_spans}
    replica_avail = {r: _intervals_busy(ch, start, end) for r, ch in rollout_spans.items()}
    n = max(1, len(steps))
    mean_busy = sum(replica_busy.values()) / max(1, len(replica_busy))
    avail = sum(replica_avail.values())
    out = {
        "wall_s": span,
        "steps": float(len(steps)),
        "step_s": span / n,
        "trainer_busy_s": trainer_busy,
        "trainer_idle_frac": max(0.0, 1 - trainer_busy / span),
        "rollout_idle_frac": max(0.0, 1 - sum(replica_busy.values()) / avail) if avail > 0 else 1.0,
        "rollout_tokens": float(tokens),
        "rollout_tokens_per_s": tokens / span,
        "ideal_step_s": max(trainer_busy, mean_busy) / n,
    }
    out["overlap_frac_of_ideal"] = out["ideal_step_s"] / out["step_s"] if out["step_s"] > 0 else 0.0
    if steps:
        stale = [m.metrics.get("batch/staleness_mean", 0.0) for m in steps]
        out["staleness_mean"] = sum(stale) / len(stale)
    switches = [m for m in msgs if isinstance(m, ModeChanged)]
    out["switches"] = float(len(switches))
    return out
