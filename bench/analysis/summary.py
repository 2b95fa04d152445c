"""Figures derived from a run's event log (real or simulated), nothing else.

Invariants: every figure is a pure function of the messages (their ``wall_time`` stamps
and durations), so the same log always gives the same numbers and a real run and a
simulated one are measured by the same code.

- trainer busy: the sum of ``StepEnd.duration_s`` and ``WeightsReady.duration_s``;
- replica busy: time with at least one sample generating (+1 at ``SampleBegin`` /
  ``SampleResumed``, -1 at ``SampleEnd`` / ``SampleAborted``), counted while the replica is
  in rollout mode (standalone from the start, hybrid between ``ModeChanged`` events);
- idle fraction = 1 - busy / span, span = first ``RunStarted`` to ``RunEnded``; the *steady*
  trainer idle counts from the first ``StepBegin`` on (the wait for the first batch, which no
  schedule avoids, left out — ``first_step_s`` says how long it was);
- ``rollout_avail_s``: replica-seconds in rollout mode (the denominator of the decode capacity
  used, ``bench/runner/results.py``'s ``rollout_work_frac``);
- the work of each optimizer step (``work()``: the prompt and response length of every sample
  of the groups it trained, its duration plus the publish after it) — the input of the true bound
  (``shunter.bench.analysis.bound``), which needs the machine's capacity besides. Busy time is not a
  bound: a replica holding one straggler is busy and nearly idle;
- ``ahead_batches``: at each step's start, the groups begun (a ``SampleBegin``) and not yet
  trained, in mini-batches — the rollout's pipeline depth; the median over the middle half of
  the steps (the start fills the pipeline, the end drains it);
- ``rollout_idle_after_first_frac``: the replicas' idle fraction from the first step's start to
  the run's end (the trainer's ``trainer_idle_steady_frac`` window);
- ``rollout_idle_steady_frac``: the replicas' idle fraction from the first step's start to the
  start of the run's last group — the rollout's counterpart of the trainer's steady idle: after
  the first batch, while a group was left to start (after the last one, a replica with nothing
  left is idle whatever the schedule; ``rollout_stopped_frac`` counts that too).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable

from shunter.bench.analysis.bound import SampleWork, StepWork
from shunter.events import (
    Message,
    ModeChanged,
    PublishWeights,
    ReplicaUp,
    RunEnded,
    RunStarted,
    SampleAborted,
    SampleBegin,
    SampleEnd,
    SampleResumed,
    StepBegin,
    StepEnd,
    WeightsLoaded,
    WeightsReady,
)
from shunter.events.relay import flatten
from shunter.events.vocab import ROLLOUT


def busy_intervals(changes: list[tuple[float, int]]) -> list[tuple[float, float]]:
    """(start, duration) of the stretches with a positive running count, given (time, +-1)
    changes (ties: increments first)."""
    out, level, since = [], 0, 0.0
    for t, d in sorted(changes, key=lambda x: (x[0], -x[1])):
        if level <= 0 < level + d:
            since = t
        level += d
        if level <= 0 < level - d:
            out.append((since, t - since))
    return out


def busy_within(changes: list[tuple[float, int]], start: float, end: float) -> float:
    """Time within [start, end] with a positive running count (an open stretch runs to end)."""
    clipped = [(min(max(t, start), end), d) for t, d in changes]
    level = sum(d for _, d in clipped)
    return sum(d for _, d in busy_intervals(clipped + ([(end, -level)] if level > 0 else [])))


class Summary:
    """A sink that folds messages as they pass (no log kept), then ``result()``."""

    def __init__(self) -> None:
        self.start: float | None = None
        self.end: float | None = None
        self.first = self.last = None
        self.steps = 0
        self.first_step: float | None = None
        self.trainer_busy = 0.0
        self.stale: list[float] = []
        self.flight: dict[str, list[tuple[float, int]]] = defaultdict(list)
        self.rollout: dict[str, list[tuple[float, int]]] = {}
        self.tokens = 0
        self.samples = 0
        """Samples finished (``SampleEnd``)."""
        self.switches = 0
        self.publishes: list[float] = []
        """Each publish's trainer time (``WeightsReady.duration_s``)."""
        self._asked: float | None = None  # the last PublishWeights not yet answered
        self._synced: dict[int, list[float]] = {}  # version -> [asked at, last loaded at]
        self._groups: dict[int, list[SampleWork]] = {}  # group -> the work of its finished samples
        self._work: list[list] = []  # per step: [samples, step seconds, publish seconds]
        self._begun: set[int] = set()  # groups a sample of which began
        self.last_group_at: float | None = None
        """When the run's last group began (after it, no group is left to start)."""
        self._trained_groups = 0
        self.ahead: list[float] = []
        """At each step's start: groups begun and not yet trained, in mini-batches."""

    def __call__(self, m: Message) -> None:
        self.first = m.wall_time if self.first is None else self.first
        self.last = m.wall_time
        match m:
            case RunStarted():
                self.start = m.wall_time if self.start is None else self.start
            case RunEnded():
                self.end = m.wall_time
            case StepBegin():
                self.first_step = m.wall_time if self.first_step is None else self.first_step
                if m.group_ids:
                    self.ahead.append((len(self._begun) - self._trained_groups) / len(m.group_ids))
                    self._trained_groups += len(m.group_ids)
                self._work.append([tuple(x for g in m.group_ids for x in self._groups.pop(g, ())), 0.0, 0.0])
            case StepEnd():
                self.steps += 1
                self.trainer_busy += m.duration_s
                self.stale.append(m.metrics.get("batch/staleness_mean", 0.0))
                if self._work:
                    self._work[-1][1] += m.duration_s
            case WeightsReady():
                self.trainer_busy += m.duration_s
                self.publishes.append(m.duration_s)
                if self._asked is not None:
                    self._synced[m.version] = [self._asked, self._asked]
                    self._asked = None
                if self._work:
                    self._work[-1][2] += m.duration_s
            case PublishWeights():
                self._asked = m.wall_time
            case WeightsLoaded() if m.version in self._synced:
                self._synced[m.version][1] = max(self._synced[m.version][1], m.wall_time)
            case ReplicaUp():
                self.rollout.setdefault(m.replica_id, []).append(
                    (float("-inf") if m.mode == ROLLOUT else 0.0, 1 if m.mode == ROLLOUT else 0)
                )
            case ModeChanged():
                self.switches += 1
                self.rollout.setdefault(m.replica_id, []).append((m.wall_time, 1 if m.mode == ROLLOUT else -1))
            case SampleBegin() | SampleResumed():
                self.flight[m.replica_id].append((m.wall_time, 1))
                if isinstance(m, SampleBegin) and m.group_id not in self._begun:
                    self._begun.add(m.group_id)
                    self.last_group_at = m.wall_time
            case SampleEnd():
                self.samples += 1
                self.flight[m.replica_id].append((m.wall_time, -1))
                sm = m.sample
                n, observed = len(sm.token_ids), sum(t.observed for t in sm.turns)
                self.tokens += n - observed
                self._groups.setdefault(sm.group_id, []).append(
                    SampleWork(len(sm.prompt_token_ids), n, observed, sum(t.env_s for t in sm.turns))
                )
            case SampleAborted():
                self.flight[m.replica_id].append((m.wall_time, -1))

    def _rollout_idle(self, lo: float, hi: float) -> float | None:
        """The replicas' idle fraction between ``lo`` and ``hi`` (None: none was in rollout)."""
        busy = sum(busy_within(self.flight.get(r, []), lo, hi) for r in self.rollout)
        avail = sum(busy_within([c for c in ch if c[1]], lo, hi) for ch in self.rollout.values())
        return max(0.0, 1 - busy / avail) if avail > 0 else None

    def result(self) -> dict[str, float]:
        start = self.start if self.start is not None else (self.first or 0.0)
        end = self.end if self.end is not None else (self.last or 0.0)
        span = max(end - start, 1e-12)
        replica_busy = {r: busy_within(self.flight.get(r, []), start, end) for r in self.rollout}
        replica_avail = {r: busy_within([c for c in ch if c[1]], start, end) for r, ch in self.rollout.items()}
        n = max(1, self.steps)
        avail = sum(replica_avail.values())
        out = {
            "wall_s": span,
            "steps": float(self.steps),
            "step_s": span / n,
            "trainer_busy_s": self.trainer_busy,
            "trainer_idle_frac": max(0.0, 1 - self.trainer_busy / span),
            "rollout_idle_frac": max(0.0, 1 - sum(replica_busy.values()) / avail) if avail > 0 else 1.0,
            "rollout_tokens": float(self.tokens),
            "rollout_tokens_per_s": self.tokens / span,
            "switches": float(self.switches),
            "rollout_avail_s": avail,
        }
        if self.first_step is not None:
            steady = max(end - self.first_step, 1e-12)
            out["first_step_s"] = self.first_step - start
            out["trainer_idle_steady_frac"] = max(0.0, 1 - self.trainer_busy / steady)
            windows = {"rollout_idle_after_first_frac": end}
            if self.last_group_at is not None and self.last_group_at > self.first_step:
                windows["rollout_idle_steady_frac"] = self.last_group_at
            for key, hi in windows.items():
                if (idle := self._rollout_idle(self.first_step, hi)) is not None:
                    out[key] = idle
        if self.stale:
            out["staleness_mean"] = sum(self.stale) / len(self.stale)
        if len(self.ahead) >= 4:  # the middle half: past the start's ramp, before the end drains
            k = len(self.ahead) // 4
            out["ahead_batches"] = statistics.median(self.ahead[k : len(self.ahead) - k])
        if self.publishes:
            out["publish_s"] = statistics.median(self.publishes)
        synced = [b - a for a, b in self._synced.values() if b > a]
        if synced:  # PublishWeights -> the last replica serving the version
            out["sync_s"] = statistics.median(synced)
        return out

    def work(self) -> list[StepWork]:
        """The work of each optimizer step so far, in order (steps that failed count as work)."""
        return [StepWork(samples, float(s), float(y)) for samples, s, y in self._work]


def summarize(messages: Iterable[Message]) -> dict[str, float]:
    """The figures of a run's messages; a relay's report (``read_log(..., reports=True)``) is
    read as the facts it carries, as the run applied them."""
    s = Summary()
    for m in flatten(messages):
        s(m)
    return s.result()
