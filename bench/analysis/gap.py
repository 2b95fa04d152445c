"""Where the distance to the bound goes: the wall time a run took above the best split's bound,
cut into named parts that add up to it exactly, so a reader sees which mechanism to improve next.

A ladder of bounds first (``shunter.bench.analysis.bound``; each rung the previous one with one more
constraint, so each part is computed from the work and the machine, never from busy flags):

- ``split``: the variant's own schedule and split against the best trainer:rollout split of the
  same GPUs (negative where lending beats every fixed split);
- ``first_batch``: its first step no sooner than the run's own began (an online schedule cannot
  know the first batch's lengths; a sequence in a full batch decodes slower than alone). The
  parts are not independent: the bound's first step (the longest sample alone, every other
  one at a full batch) and its generation rate (every replica at a full batch) cannot both
  hold. Measured on ``long_tail`` (separate 9:7, staleness 16, seed 1, with a patch to
  ``InFlight.pump`` that was not kept): admitting at most 64 groups until the first step cut
  this part from 390 s to 23 s and grew ``rollout`` from 487 s to 975 s (the run 3 % longer);
  capping each replica at 96 or 160 sequences until then traded the same way;
- ``gate``: the staleness gate on top (``on_stale = "wait"``: a step's groups start only once the
  weights ``max_staleness`` versions older are out).

What is left — the run's wall time above the last rung — is what the trainer did beyond that
bound after its first step: read from the log by a sweep over the trainer's idle time, each
instant named by the first that holds of:

- ``end_of_run``: every group the run trained had started (no group was left to start: the
  replicas that are idle stay idle);
- ``deadline``: enough groups had finished for a step, and the trainer waited all the same: with
  ``on_stale = "wait"`` a batch takes an older straggler first once its deadline has come, so
  the groups that finished later wait with the trainer (a policy holding a batch back would
  land here too: the log does not say which batches are formable at an instant — a
  ``BatchReady`` batch can stop being formable when the version moves on);
- ``switches``: a replica was switching mode or loading weights;
- ``rollout``: none of these — generation short of the bound's perfectly packed replicas; the
  bound's own trainer idle time is taken off this part (it may then be negative);

plus ``trainer_switches`` (the trainer's offload / onload time, not training) and ``tail`` (from
the last step's end to the run's end). ``other``: what the sweep and the ladder do not account
for (overlapping trainer work, clock resolution) — near zero, and shown so that the parts add up.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence

from shunter.bench.analysis import bound
from shunter.events import (
    Message,
    ModeChanged,
    Offloaded,
    Onloaded,
    RunEnded,
    RunStarted,
    SampleBegin,
    SampleEnd,
    StepBegin,
    StepEnd,
    WeightsLoaded,
    WeightsReady,
)

PARTS = (
    "split",
    "first_batch",
    "gate",
    "end_of_run",
    "deadline",
    "switches",
    "rollout",
    "trainer_switches",
    "tail",
    "other",
)
"""The parts, in the order a report stacks them (ladder first, then the run's own)."""


class Gaps:
    """A sink that keeps what the sweep needs, O(groups + steps): then :meth:`parts`."""

    def __init__(self) -> None:
        self.start: float | None = None
        self.end: float | None = None
        self.busy: list[tuple[float, float]] = []  # trainer: step, publish
        self.trainer_switch: list[tuple[float, float]] = []  # trainer: offload / onload
        self.switching: list[tuple[float, float]] = []  # replicas: mode switch, weight load
        self.steps: list[tuple[float, int, list[int]]] = []  # StepBegin: (time, samples, groups)
        self.last_step_end: float | None = None
        self.began: dict[int, float] = {}  # group -> its first sample's start
        self.ended: dict[int, float] = {}  # group -> its last sample's end so far

    def __call__(self, m: Message) -> None:
        match m:
            case RunStarted():
                self.start = m.wall_time if self.start is None else self.start
            case RunEnded():
                self.end = m.wall_time
            case StepBegin():
                self.steps.append((m.wall_time, m.samples, list(m.group_ids)))
            case StepEnd():
                self.busy.append((m.wall_time - m.duration_s, m.wall_time))
                self.last_step_end = m.wall_time
            case WeightsReady():
                self.busy.append((m.wall_time - m.duration_s, m.wall_time))
                self.last_step_end = m.wall_time if self.last_step_end is not None else None
            case Offloaded() | Onloaded():
                self.trainer_switch.append((m.wall_time - m.duration_s, m.wall_time))
            case ModeChanged() | WeightsLoaded() if m.duration_s > 0:
                self.switching.append((m.wall_time - m.duration_s, m.wall_time))
            case SampleBegin():
                self.began.setdefault(m.group_id, m.wall_time)
            case SampleEnd():
                g = m.sample.group_id
                self.ended[g] = max(self.ended.get(g, m.wall_time), m.wall_time)

    def sweep(self) -> list[dict[str, float]]:
        """The trainer's idle seconds from its first step to its last step's end, by cause, per
        step (an idle instant belongs to the step that begins next; after the last begin, to it)."""
        causes = ("end_of_run", "deadline", "switches", "rollout")
        out = [dict.fromkeys(causes, 0.0) for _ in self.steps]
        if not self.steps or self.last_step_end is None:
            return out
        first, last = self.steps[0][0], self.last_step_end
        begins = [t for t, _, _ in self.steps]
        trained = [g for _, _, gs in self.steps for g in gs]
        all_started = max((self.began.get(g, first) for g in trained), default=first)
        per_step_groups = statistics.median(len(gs) for _, _, gs in self.steps)
        # (time, order, what, change): ends before starts at one instant, so touching intervals do not count as busy
        ch: list[tuple[float, int, str, float]] = []
        for a, b in (*self.busy, *self.trainer_switch):
            ch += [(a, 1, "busy", 1), (b, 0, "busy", -1)]
        for a, b in self.switching:
            ch += [(a, 1, "switch", 1), (b, 0, "switch", -1)]
        for t, _, gs in self.steps:
            for g in gs:
                if g in self.ended:
                    ch += [(min(self.ended[g], t), 1, "finished", 1), (t, 0, "finished", -1)]
        ch.append((last, 0, "busy", 0))  # the sweep's end
        ch.sort(key=lambda x: (x[0], x[1]))
        level = {"busy": 0.0, "switch": 0.0, "finished": 0.0}
        prev = first
        for t, _, what, d in ch:
            lo, hi = max(prev, first), min(t, last)
            if hi > lo and level["busy"] <= 0:
                step = min(bisect.bisect_right(begins, lo), len(begins) - 1)
                cause = self._cause(lo, all_started, level, per_step_groups)
                out[step][cause] += hi - lo
            prev = max(prev, t)
            level[what] += d
        return out

    @staticmethod
    def _cause(t: float, all_started: float, level: dict[str, float], groups: float) -> str:
        if t >= all_started:
            return "end_of_run"
        if level["finished"] >= groups:
            return "deadline"
        if level["switch"] > 0:
            return "switches"
        return "rollout"

    def parts(
        self,
        work: Sequence[bound.StepWork],
        fleet: bound.Fleet,
        schedule: bound.Schedule,
        best_split_s: float,
        gate: bound.Gate | None,
    ) -> dict[str, float]:
        """Seconds per part (``PARTS``), adding up to the wall time minus ``best_split_s``.

        The last rung's own trainer waits are taken off the run's, step by step, in proportion
        to the causes of the run's wait before that step (the bound waits at the same steps for
        the same generation); a serial schedule's, and a lending bound's GPU-seconds term, off
        ``rollout``."""
        if not work or not self.steps or self.start is None or self.end is None:
            return {}
        wall = self.end - self.start
        first_at = self.steps[0][0] - self.start
        own = bound.bound_s(work, fleet, schedule)
        first = bound.bound_s(work, fleet, schedule, first_at=first_at)
        gate = gate if schedule != "serial" else None
        gated = bound.bound_s(work, fleet, schedule, gate, first_at=first_at) if gate else first
        per_step = self.sweep()
        idle = {k: sum(p[k] for p in per_step) for k in per_step[0]} if per_step else {}
        train = sum(w.train_s for w in work)
        bound_idle = gated - first_at - train  # the last rung's own trainer wait after its first step
        if schedule != "serial" and len(per_step) == len(work):
            lent = fleet.lendable if schedule == "lending" else 0
            fin = bound.overlapped_finishes(work, fleet.machine, fleet.replicas + lent, gate, first_at)
            for s in range(1, len(work)):
                wait = fin[s] - work[s].train_s - fin[s - 1]
                have = sum(per_step[s].values())
                for k, v in per_step[s].items():
                    idle[k] -= wait * v / have if have > 0 else (wait if k == "rollout" else 0.0)
                bound_idle -= wait
        idle["rollout"] -= bound_idle  # what the per-step netting left (serial; a GPU-seconds term)
        tail = self.end - self.last_step_end if self.last_step_end is not None else 0.0
        out = {
            "split": own - best_split_s,
            "first_batch": first - own,
            "gate": gated - first,
            **idle,
            "trainer_switches": sum(b - a for a, b in self.trainer_switch),
            "tail": tail,
        }
        out["other"] = (wall - best_split_s) - sum(out.values())
        return {k: out[k] for k in PARTS}
