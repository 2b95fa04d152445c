"""The true bound: the least wall time any schedule could take for the work a run did, on the
GPUs the run had — computed from the machine's capacity and the work, never from the run's own
busy flags.

Invariants: every figure here is a pure function of the work (``StepWork``, one per optimizer
step, read from the event log) and of the machine (``Capacity``: from the simulator's cost
model, or from raw vLLM measured on the same hardware); each bound is a *lower* bound on the
wall time of the schedule family it names, so ``frac_of_bound = bound / measured <= 1`` up to
clock resolution, and a schedule can only reach 1 by wasting nothing.

The work of step ``s``: ``tokens_s`` response tokens trained (what was generated and kept —
tokens generated and then dropped are waste, not work), the longest response ``longest_s``,
and the trainer's time ``train_s``: the optimizer step plus the weight publish that follows it
(``step_s + sync_s``).

- **overlapped** (``separate``: a fixed rollout fleet beside the trainer). Generation at full
  decode capacity for the batches of steps 1..s must be done before step s trains, no
  sequence decodes faster than alone, and steps train one after another::

      ready_s  = max(sum(tokens_1..s) / capacity, longest_s / alone)
      finish_s = max(finish_(s-1), ready_s) + train_s

- **lending** (the trainer's GPUs also generate while the trainer is idle): the larger of the
  overlapped bound with the lent capacity always present, and the GPU-seconds bound
  (generation GPU-seconds + training GPU-seconds) / GPUs.
- **serial** (``colocated``: every GPU generates, then every GPU trains): each step generates
  its batch at the capacity of all replicas, no faster than its longest sequence alone, then
  trains: ``finish_s = finish_(s-1) + max(tokens_s / capacity, longest_s / alone) + train_s``.

Left out (so each bound is looser, never tighter, than the truth): prefill, the staleness
limit, switch and load costs, the time a sample spends queued.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

Schedule = Literal["overlapped", "lending", "serial"]


class StepWork(NamedTuple):
    tokens: int
    """Response tokens of the samples trained in this step."""
    longest: int
    """The longest response trained in this step."""
    step_s: float
    """The optimizer step (seconds)."""
    sync_s: float = 0.0
    """The weight publish that follows it (seconds; 0 when none does)."""

    @property
    def train_s(self) -> float:
        return self.step_s + self.sync_s


class Capacity(NamedTuple):
    """What the variant's GPUs can do at best."""

    rollout_tok_s: float
    """Peak decode tokens/s of the replicas that always serve rollout (or, serial: all)."""
    alone_tok_s: float
    """Tokens/s of one sequence decoding alone on a replica (the fastest any sequence goes)."""
    lendable_tok_s: float = 0.0
    """Peak tokens/s the trainer's GPUs add when lent to rollout (lending schedules)."""
    gpus: int = 1
    """All GPUs of the variant."""
    trainer_gpus: int = 1
    """GPUs the trainer holds while it trains or publishes."""
    gpu_tok_s: float = 0.0
    """Peak decode tokens/s of one GPU (for the GPU-seconds bound of a lending schedule)."""


def overlapped_s(work: Sequence[StepWork], capacity_tok_s: float, alone_tok_s: float) -> float:
    finish, made = 0.0, 0
    for w in work:
        made += w.tokens
        ready = max(made / capacity_tok_s, w.longest / alone_tok_s)
        finish = max(finish, ready) + w.train_s
    return finish


def serial_s(work: Sequence[StepWork], capacity_tok_s: float, alone_tok_s: float) -> float:
    return sum(max(w.tokens / capacity_tok_s, w.longest / alone_tok_s) + w.train_s for w in work)


def bound_s(work: Sequence[StepWork], cap: Capacity, schedule: Schedule) -> float:
    """The least wall time a ``schedule`` could take for ``work`` on ``cap`` (0: no work)."""
    if not work:
        return 0.0
    if cap.rollout_tok_s <= 0 or cap.alone_tok_s <= 0:
        raise ValueError(f"capacity must be positive, got {cap}")
    if schedule == "serial":
        return serial_s(work, cap.rollout_tok_s, cap.alone_tok_s)
    if schedule == "overlapped":
        return overlapped_s(work, cap.rollout_tok_s, cap.alone_tok_s)
    lent = overlapped_s(work, cap.rollout_tok_s + cap.lendable_tok_s, cap.alone_tok_s)
    if cap.gpu_tok_s <= 0:
        return lent
    gpu_s = sum(w.tokens for w in work) / cap.gpu_tok_s + sum(w.train_s for w in work) * cap.trainer_gpus
    return max(lent, gpu_s / cap.gpus)


def figures(work: Sequence[StepWork], cap: Capacity, schedule: Schedule, wall_s: float) -> dict[str, float]:
    """``bound_s`` and ``frac_of_bound`` (bound / measured wall time) of one run."""
    b = bound_s(work, cap, schedule)
    return {"bound_s": b, "frac_of_bound": b / wall_s if wall_s > 0 else 0.0}
