"""The true bound: the least wall time any schedule could take for the work a run did, on the
GPUs the run had — computed from the machine's capacity and the work, never from the run's own
busy flags.

Invariants: every figure here is a pure function of the work (``StepWork``, one per optimizer
step: the prompt and response length of every sample it trained, read from the event log) and
of the machine (a ``Machine``: the simulator's cost model, ``ModelMachine``, or the peak rates
of raw vLLM measured on the same hardware, ``RateMachine``); each bound is a *lower* bound on
the wall time of the schedule family it names, so ``frac_of_bound = bound / measured <= 1`` up
to clock resolution, and a schedule can only reach 1 by wasting nothing.

A multi-turn sample (``SampleWork`` with ``observed`` tokens an environment appended and
``env_s`` seconds its calls took) counts its generated tokens as if they came first after the
prompt (its true contexts are no smaller), its observations as prefill of their own tokens only
(a replica with its prefix cached pays no more), and its environment time on its own critical
path: no trajectory ends sooner than its prompt's prefill, its decode alone and its tool calls
one after another. Environment time costs no replica capacity (a request ends at its tool call).

Generation work is counted in replica-seconds. Under the cost model, the responses of ``T``
tokens that attended to ``C`` tokens of context in all (a response of ``L`` tokens after a
``P``-token prompt attends to ``L*P + L*(L-1)/2``), with prompts whose prefill costs ``PF``
seconds, need at least::

    decode_step_s * max(T / max_batch, C / kv_tokens) + decode_step_s_per_seq * T
      + decode_s_per_kv_token * C + PF

(a step produces at most ``max_batch`` tokens and holds at most ``kv_tokens`` of context; each
step costs its fixed part once), and no sequence finishes sooner than alone on a replica
(its prompt's prefill plus its decode steps at batch 1). With a peak rate instead, ``T``
tokens need ``T / peak`` replica-seconds and a response of ``L`` tokens ``L / alone``.

- **overlapped** (``separate``: a fixed fleet of ``R`` replicas beside the trainer). The
  generation of steps 1..s must be done before step s trains, no sequence is faster than
  alone, and steps train one after another (``train_s`` = optimizer step + the publish after)::

      ready_s  = max(work(steps 1..s) / R, alone_s)
      finish_s = max(finish_(s-1), ready_s) + train_s

- **lending** (the trainer's GPUs also generate while the trainer is idle): the larger of the
  overlapped bound with the lent replicas always present and the GPU-seconds bound
  (generation GPU-seconds + training GPU-seconds) / GPUs.
- **serial** (``colocated``: every GPU generates a version's batches, then every GPU trains
  them): per version ``v`` (its ``steps_per_version`` steps),
  ``finish_v = finish_(v-1) + max(work(steps of v) / R, alone_v) + train_s(steps of v)``.
- **at a staleness bound** (``stale_bound``): with ``on_stale = "wait"`` the groups of step s
  start only once the weights ``max_staleness`` versions before the ones step s trains are
  published (AReaL's gate), so also ``ready_s >= finish_(that publish) + alone_s``. This is the
  best any schedule can do *at that staleness*; ``bound_s`` is the best at any.

Left out (so each bound is looser, never tighter, than the truth): switch and load costs,
the time a sample spends queued, preemption.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

from shunter.bench.sim.replica_model import ReplicaCost, lone_decode_s, prefill_s

Schedule = Literal["overlapped", "lending", "serial"]


class SampleWork(NamedTuple):
    """One trained sample's work; a plain ``(prompt, response)`` pair is a single-turn one."""

    prompt: int
    response: int
    """Tokens after the prompt: generated ones and ``observed`` ones."""
    observed: int = 0
    """Tokens an environment appended (prefilled, never decoded)."""
    env_s: float = 0.0
    """Seconds its environment calls took, one after another."""

    @property
    def generated(self) -> int:
        return self.response - self.observed


def as_work(x: tuple) -> SampleWork:
    return x if isinstance(x, SampleWork) else SampleWork(*x)


class StepWork(NamedTuple):
    samples: tuple[tuple, ...]
    """Each sample this step trained: a ``SampleWork`` or a (prompt tokens, response tokens) pair."""
    step_s: float
    """The optimizer step (seconds)."""
    sync_s: float = 0.0
    """The weight publish that follows it (seconds; 0 when none does)."""

    @property
    def train_s(self) -> float:
        return self.step_s + self.sync_s

    @property
    def tokens(self) -> int:
        """Generated tokens."""
        return sum(as_work(x).generated for x in self.samples)


class Load(NamedTuple):
    """The generation a set of samples needs, as the machine counts it."""

    tokens: float = 0.0
    context: float = 0.0
    prefill_s: float = 0.0
    alone_s: float = 0.0
    """The longest of them alone on a replica."""

    def plus(self, o: Load) -> Load:
        return Load(
            self.tokens + o.tokens, self.context + o.context, self.prefill_s + o.prefill_s, max(self.alone_s, o.alone_s)
        )


class Machine(Protocol):
    def load(self, samples: Sequence[tuple]) -> Load: ...
    def work_s(self, load: Load) -> float:
        """Replica-seconds of generation ``load`` needs at least."""
        ...


@dataclass(frozen=True)
class ModelMachine:
    """A replica as the simulator's cost model has it (``shunter.bench.sim.replica_model``)."""

    cost: ReplicaCost
    max_batch: int

    def load(self, samples: Sequence[tuple]) -> Load:
        c = self.cost
        ws = [as_work(x) for x in samples]
        tokens = sum(w.generated for w in ws)
        context = sum(w.generated * w.prompt + w.generated * (w.generated - 1) / 2 for w in ws)
        pf = sum(prefill_s(c, w.prompt) + c.prefill_s_per_token * w.observed for w in ws)
        alone = max(
            (prefill_s(c, w.prompt) + lone_decode_s(c, w.prompt, w.generated) + w.env_s for w in ws), default=0.0
        )
        return Load(tokens, context, pf, alone)

    def work_s(self, load: Load) -> float:
        c = self.cost
        steps = load.tokens / self.max_batch
        if c.kv_tokens:
            steps = max(steps, load.context / c.kv_tokens)
        return (
            c.decode_step_s * steps
            + c.decode_step_s_per_seq * load.tokens
            + c.decode_s_per_kv_token * load.context
            + load.prefill_s
        )


@dataclass(frozen=True)
class RateMachine:
    """A replica known by its measured peak decode rate and one sequence's rate alone."""

    peak_tok_s: float
    alone_tok_s: float

    def load(self, samples: Sequence[tuple]) -> Load:
        ws = [as_work(x) for x in samples]
        alone = max((w.generated / self.alone_tok_s + w.env_s for w in ws), default=0.0)
        return Load(float(sum(w.generated for w in ws)), alone_s=alone)

    def work_s(self, load: Load) -> float:
        return load.tokens / self.peak_tok_s


class Fleet(NamedTuple):
    """What the variant's GPUs can do at best."""

    machine: Machine
    replicas: int
    """Replicas that always serve rollout (serial: all of them)."""
    lendable: int = 0
    """Replicas on the trainer's GPUs that may be lent to rollout (lending schedules)."""
    gpus: int = 1
    """All GPUs of the variant."""
    trainer_gpus: int = 1
    """GPUs the trainer holds while it trains or publishes."""
    gpus_per_replica: int = 1
    steps_per_version: int = 1
    """Optimizer steps between publishes: a serial schedule generates them all at once."""


class Gate(NamedTuple):
    """The staleness gate of a run in ``on_stale = "wait"`` mode."""

    max_staleness: int
    steps_per_version: int = 1


def _check(work: Sequence[StepWork], fleet: Fleet) -> None:
    if fleet.replicas <= 0:
        raise ValueError(f"a fleet needs replicas, got {fleet.replicas}")


class Generation(NamedTuple):
    """What the overlapped bound needs of the generation, per step, whatever the split: the
    replica-seconds of work up to and including the step, and its longest sequence alone."""

    cum_work_s: list[float]
    alone_s: list[float]


def generation(work: Sequence[StepWork], machine: Machine) -> Generation:
    cum, alone, total = [], [], Load()
    for w in work:
        step = machine.load(w.samples)
        total = total.plus(step)
        cum.append(machine.work_s(total))
        alone.append(step.alone_s)
    return Generation(cum, alone)


def overlapped_s(
    work: Sequence[StepWork],
    machine: Machine,
    replicas: int,
    gate: Gate | None = None,
    first_at: float = 0.0,
    gen: Generation | None = None,
) -> float:
    """``gen``: ``generation(work, machine)`` when already computed (it does not depend on
    ``replicas``, the gate or the train times: a search over splits computes it once)."""
    finish = overlapped_finishes(work, machine, replicas, gate, first_at, gen)
    return finish[-1] if finish else 0.0


def overlapped_finishes(
    work: Sequence[StepWork],
    machine: Machine,
    replicas: int,
    gate: Gate | None = None,
    first_at: float = 0.0,
    gen: Generation | None = None,
) -> list[float]:
    """When each step's train (and publish) ends in the overlapped bound (``overlapped_s``)."""
    g = gen if gen is not None else generation(work, machine)
    finish: list[float] = []
    for s, w in enumerate(work):
        alone = g.alone_s[s]
        ready = max(g.cum_work_s[s] / replicas, alone, first_at if s == 0 else 0.0)
        if gate is not None:
            first = (s // gate.steps_per_version - gate.max_staleness) * gate.steps_per_version - 1
            if first >= 0:
                ready = max(ready, finish[first] + alone)
        finish.append(max(finish[-1] if finish else 0.0, ready) + w.train_s)
    return finish


def serial_s(
    work: Sequence[StepWork], machine: Machine, replicas: int, first_at: float = 0.0, steps_per_version: int = 1
) -> float:
    out, k = 0.0, max(1, steps_per_version)
    for v in range(0, len(work), k):
        steps = work[v : v + k]
        gen = machine.load([x for w in steps for x in w.samples])
        ready = max(machine.work_s(gen) / replicas, gen.alone_s, first_at if v == 0 else 0.0)
        out += ready + sum(w.train_s for w in steps)
    return out


def bound_s(
    work: Sequence[StepWork], fleet: Fleet, schedule: Schedule, gate: Gate | None = None, first_at: float = 0.0
) -> float:
    """The least wall time a ``schedule`` could take for ``work`` on ``fleet`` (0: no work);
    with a ``gate``, at that staleness bound; with ``first_at``, for a schedule whose first
    step could not begin before then."""
    if not work:
        return 0.0
    _check(work, fleet)
    m = fleet.machine
    if schedule == "serial":
        return serial_s(work, m, fleet.replicas, first_at, fleet.steps_per_version)
    if schedule == "overlapped":
        return overlapped_s(work, m, fleet.replicas, gate, first_at)
    lent = overlapped_s(work, m, fleet.replicas + fleet.lendable, gate, first_at)
    total = Load()
    for w in work:
        total = total.plus(m.load(w.samples))
    gpu_s = m.work_s(total) * fleet.gpus_per_replica + sum(w.train_s for w in work) * fleet.trainer_gpus
    return max(lent, gpu_s / fleet.gpus)


def figures(
    work: Sequence[StepWork],
    fleet: Fleet,
    schedule: Schedule,
    wall_s: float,
    gate: Gate | None = None,
    first_step_s: float | None = None,
) -> dict[str, float]:
    """``bound_s`` and ``frac_of_bound`` (bound / measured wall time) of one run;
    ``bound_first_step_s``: when the bound's first step could begin (its batch generated by a
    schedule that knew every length in advance — an online scheduler cannot, so the wait for
    the first batch is where a real run loses most to this bound); with ``first_step_s`` (when
    the run's first step began), ``first_step_bound_s`` / ``frac_of_first_step_bound``: the
    bound of a schedule whose first step begins no sooner — what is lost after the first
    batch; with a gate, also ``stale_bound_s`` / ``frac_of_stale_bound``: the same at the run's
    staleness bound."""
    b = bound_s(work, fleet, schedule)
    out = {"bound_s": b, "frac_of_bound": b / wall_s if wall_s > 0 else 0.0}
    if work:
        k = fleet.steps_per_version if schedule == "serial" else 1  # a serial run generates a version at once
        first = fleet.machine.load([x for w in work[:k] for x in w.samples])
        replicas = fleet.replicas + (fleet.lendable if schedule == "lending" else 0)
        out["bound_first_step_s"] = max(fleet.machine.work_s(first) / replicas, first.alone_s)
    if work and first_step_s is not None:
        fb = bound_s(work, fleet, schedule, first_at=first_step_s)
        out.update(first_step_bound_s=fb, frac_of_first_step_bound=fb / wall_s if wall_s > 0 else 0.0)
    if gate is not None and schedule != "serial":
        sb = bound_s(work, fleet, schedule, gate)
        out.update(stale_bound_s=sb, frac_of_stale_bound=sb / wall_s if wall_s > 0 else 0.0)
    return out
