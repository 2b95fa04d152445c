"""The policy contract: what every policy must do, checkable on any policy without touching
the project.

    shunter check-policy my_policies:MyPolicy [--options '{"k": 1}'] [--standalone 1 --hybrid 1]

Checks (each on its own, each bounded in real time; a policy that raises, hangs or returns junk
fails the check that found it, with the policy, the check and the event named, and never
stops the others):

- ``run``: a whole simulated run (the real coordinator over the simulated cluster of
  ``shunter.bench``, in virtual time) ends ``completed`` with no ``PolicyFailed``, and the first
  event the policy sees is ``RunStarted``;
- ``every_event``: ``decide()`` on one example of every event type, in several views, returns a
  list of intents;
- ``deterministic``: two fresh instances decide alike over the run's recorded (event, view) trace;
- ``snapshot_restore``: a policy restored from ``snapshot()`` mid-trace decides exactly like the
  original from there on, and the snapshot is plain data;
- ``restore_strict``: ``restore()`` refuses a snapshot with a key its ``State`` does not have;
- ``resume``: a run resumed from a mid-run checkpoint (``restore()`` then ``RunResumed``) goes on
  to complete every remaining step.

The ``run`` check also reports what the policy did (:class:`Decisions`: its intents by kind,
the switches done, its refused intents, the steps), which ``shunter check-policy`` prints.

The same checks make up ``tests/contracts`` for the built-in and example policies.
"""

from __future__ import annotations

import copy
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from shunter.engine.config.base import ConfigError
from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.config.load import from_dict
from shunter.engine.coordinator.guard import GIVE_UP_AFTER_S, check_intents, not_returned
from shunter.engine.coordinator.policy_worker import GivenUp, PolicyWorker
from shunter.engine.coordinator.watchdog import WATCHDOG, Stuck
from shunter.engine.io.errors import bounded, describe, secs
from shunter.events import (
    BufferView,
    EngineView,
    Event,
    Intent,
    IntentRejected,
    Message,
    ModeChanged,
    PolicyFailed,
    RelayReport,
    ReplicaView,
    RunStarted,
    TrainerView,
    WeightsReady,
    tag_of,
)
from shunter.events.examples import CASES
from shunter.policies import Policy, make_policy, policy_class

SETUPS = ((1, 1), (1, 0), (0, 2), (2, 0), (2, 2))
"""(standalone, hybrid) replica setups tried, first one the policy's ``check_setup`` accepts."""
EVENTS = [m for m in CASES if isinstance(m, Event) and type(m).to_policy]
VIEWS = [
    EngineView(),
    EngineView(
        replicas=(
            ReplicaView(replica_id="standalone-0", kind="standalone", rank=0, mode="rollout", samples_per_s=50),
            ReplicaView(replica_id="hybrid-1", kind="hybrid", rank=1, mode="trainer"),
        ),
        trainer=TrainerView(state="idle", step=3, version=1),
        buffer=BufferView(ready_samples=4, gate_open=True),
        ppo_mini_batch_size=8,
        parameter_sync_step=2,
        validate_every=1,
    ),
    EngineView(
        replicas=(ReplicaView(replica_id="hybrid-1", kind="hybrid", rank=1, mode="rollout"),),
        trainer=TrainerView(state="idle", steps_since_publish=2),
        buffer=BufferView(ready_batches=3),
        done=True,
    ),
]


class CheckFailed(AssertionError):
    """A contract check found a problem (the message names it)."""


@dataclass
class Decisions:
    """What the policy did in the ``run`` check's simulated run — so a passing check also says
    whether the policy ever lent a replica, trained, published."""

    intents: Counter[str] = field(default_factory=Counter)
    """The intents it returned, by tag."""
    refused: Counter[str] = field(default_factory=Counter)
    """Its intents the coordinator refused, by ``tag (reason)``."""
    lent: Counter[str] = field(default_factory=Counter)
    """Switches done from the trainer to rollout, by replica."""
    reclaimed: int = 0
    """Switches done from rollout back to the trainer."""
    steps: int = 0
    total_steps: int = 0
    published: int = 0
    hybrid: int = 0

    def record(self, out: object) -> None:
        if isinstance(out, list | tuple):
            self.intents.update(tag_of(i) for i in out if isinstance(i, Intent))

    def observe(self, messages: Iterable[Message]) -> None:
        for m in messages:
            for ev in m.events if isinstance(m, RelayReport) else (m,):
                if isinstance(ev, ModeChanged) and ev.mode == "rollout" and ev.previous == "trainer":
                    self.lent[ev.replica_id] += 1
                elif isinstance(ev, ModeChanged) and ev.mode == "trainer" and ev.previous == "rollout":
                    self.reclaimed += 1
                elif isinstance(ev, WeightsReady):
                    self.published += 1
                elif isinstance(ev, IntentRejected) and ev.intent_source == "policy":
                    key = f"{ev.intent_kind} ({ev.reason})"  # counted 1st, 10th, 100th …: the last count holds
                    self.refused[key] = max(self.refused[key], ev.repeats)

    def lines(self) -> list[str]:
        def counts(c: Counter[str]) -> str:
            return ", ".join(f"{n} {k}" for k, n in c.most_common()) or "none"

        lends = sum(self.lent.values())
        if lends:
            who = ", ".join(f"{r} {n}x" for r, n in sorted(self.lent.items()))
            lending = f"{lends} to rollout ({who}), {self.reclaimed} back to the trainer"
        else:
            lending = "none" + (
                f" — it never lent a hybrid replica to rollout ({self.hybrid} stayed with the trainer)"
                if self.hybrid
                else ""
            )
        return [
            f"intents: {counts(self.intents)}",
            f"switches: {lending}",
            f"refused: {counts(self.refused)}",
            f"steps: {self.steps} of {self.total_steps}; weight versions published: {self.published}",
        ]


class CheckTimeout(BaseException):
    """A check ran out of real time. A BaseException, so that no ``except Exception`` on the
    way out — the coordinator's guard around the policy included — can swallow it."""


@dataclass
class CheckResult:
    check: str
    ok: bool
    detail: str = ""
    seconds: float = 0.0


@dataclass
class Subject:
    """The policy under test: how to make fresh instances, and the setup it runs with."""

    spec: str
    options: dict[str, Any] = field(default_factory=dict)
    standalone: int = 1
    hybrid: int = 1
    steps: int = 6
    time_limit_s: float = 30.0
    budget_ms: float = 10.0
    """``run.policy_budget_ms``: the run check fails a policy slower than this in more than 3 calls."""
    decisions: Decisions | None = None
    """What the policy did in the ``run`` check (None until it ran to its end)."""
    _trace: list[tuple[Event, EngineView]] | None = None
    _run_failed: str = ""

    def make(self) -> Policy:
        return make_policy(self.spec, self.options)

    @property
    def call_timeout_s(self) -> float:
        """``run.policy_timeout_s`` of the checks: one ``decide()`` call gets this long, a third
        of a check's real time (at least 0.5 s, at most 10 s)."""
        return max(0.5, min(10.0, self.time_limit_s / 3))

    def config(self, **run: Any) -> EngineConfig:
        colocated = self.standalone == 0
        return from_dict(
            {
                "run": {
                    "total_steps": self.steps,
                    "policy": self.spec,
                    "policy_options": self.options,
                    "stall_timeout_s": 600.0,
                    "policy_timeout_s": self.call_timeout_s,
                    **run,
                },
                "rollout": {
                    "standalone_replicas": self.standalone,
                    "hybrid_replicas": self.hybrid,
                    "n_samples_per_prompt": 4,
                    "max_tokens": 64,
                    "max_model_len": 256,
                    "max_staleness": 0 if colocated else 1,
                    "max_in_flight_per_replica": 32,
                },
                "trainer": {"ppo_mini_batch_size": 8, "parameter_sync_step": 2, "train_batch_size": 16},
                "validation": {"every": 0},
            }
        )


@contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Raise ``CheckTimeout`` in this thread after ``seconds`` of real time (a signal interrupts
    whatever the thread waits on); a no-op outside the main thread."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def fire(signum: int, frame: object) -> None:
        inside = f" (it was in decide() on {_DECIDING[0]})" if _DECIDING[0] else ""
        raise CheckTimeout(f"{what} took longer than {secs(seconds)} s of real time{inside}")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class OverBudget(BaseException):
    """``decide()`` was slower than the budget too often (a BaseException: the guard around the
    policy must not contain it)."""


class Recording(Policy):
    """Wraps a policy, records every (event, view) it is asked to decide on, and holds it to the
    time budget: more than ``SLOW_CALLS_ALLOWED`` calls over ``budget_ms`` end the check."""

    SLOW_CALLS_ALLOWED = 3  # a garbage collection may stretch one call; a slow policy is slow every time

    def __init__(self, inner: Policy, trace: list[tuple[Event, EngineView]], budget_ms: float = 0.0) -> None:
        self.inner, self.trace, self.budget_ms = inner, trace, budget_ms
        self.wrapped = inner  # the guard names the policy inside
        self.slow: list[tuple[str, float]] = []
        self.decisions = Decisions()

    def decide(self, event: Event, view: EngineView) -> list[Intent]:
        self.trace.append((event, view))
        t0 = time.perf_counter()
        out = self.inner.decide(event, view)
        ms = (time.perf_counter() - t0) * 1e3
        if self.budget_ms and ms > self.budget_ms:
            self.slow.append((tag_of(event), ms))
            if len(self.slow) > self.SLOW_CALLS_ALLOWED:
                worst = max(self.slow, key=lambda x: x[1])
                raise OverBudget(
                    f"decide() took more than run.policy_budget_ms = {self.budget_ms:g} ms in "
                    f"{len(self.slow)} calls (the slowest {worst[1]:.1f} ms on {worst[0]}); the coordinator "
                    "waits for every call to return, so every replica waits that long"
                )
        self.decisions.record(out)
        return out  # type: ignore[no-any-return]

    def snapshot(self) -> dict[str, Any]:
        return self.inner.snapshot()

    def restore(self, state: dict[str, Any]) -> None:
        self.inner.restore(state)


def _sim(subject: Subject, policy: Policy, **kw: Any) -> Any:
    from shunter.bench.sim.cluster import run_sim
    from shunter.bench.sim.cost_model import CostModel

    cost = CostModel(
        prompt_tokens=16, decode_step_s=0.01, length_median=24, length_sigma=0.6, train_step_s=0.2, weight_bytes=1e8
    )
    cfg = subject.config(**kw.pop("run", {}))
    return run_sim(cfg, cost, policy=policy, keep=True, time_limit_s=7200.0, **kw)


def _ended_ok(result: Any, what: str) -> None:
    failed = [m for m in result.messages if isinstance(m, PolicyFailed)]
    if failed:
        raise CheckFailed(f"{what}: the policy failed on {failed[0].on_kind}: {failed[0].error}")
    if result.ended.reason != "completed":
        raise CheckFailed(f"{what} ended {result.ended.reason}: {result.ended.error}")


def check_run(subject: Subject) -> str:
    trace: list[tuple[Event, EngineView]] = []
    subject._run_failed = "the run check failed"  # until it passes: the checks that replay its trace skip
    recording = Recording(subject.make(), trace, subject.budget_ms)
    try:
        result = _sim(subject, recording)
    except OverBudget as e:
        raise CheckFailed(str(e)) from None
    d = subject.decisions = recording.decisions
    d.observe(result.messages)
    d.steps, d.total_steps, d.hybrid = result.ended.steps, subject.steps, subject.hybrid
    _ended_ok(result, "the simulated run")
    if not trace or not isinstance(trace[0][0], RunStarted):
        raise CheckFailed(f"the policy's first event was {tag_of(trace[0][0]) if trace else 'none'}, not run.started")
    if result.ended.steps != subject.steps:
        raise CheckFailed(f"the run trained {result.ended.steps} of {subject.steps} steps")
    subject._trace, subject._run_failed = trace, ""
    return f"{len(trace)} events decided, {subject.steps} steps in {result.sim_s:.0f} simulated s"


def _trace(subject: Subject) -> list[tuple[Event, EngineView]]:
    if subject._trace is None and not subject._run_failed:
        check_run(subject)
    if subject._trace is None:
        raise CheckFailed(f"not run: it replays the trace of the run check, and {subject._run_failed}")
    return subject._trace


_DECIDING = [""]  # the event a direct decide() call is on (named when a deadline interrupts it)
_WORKER: list[PolicyWorker | None] = [None]  # the thread direct decide() calls run on


def _watched(policy: Policy, event: Event, view: EngineView, timeout_s: float) -> Any:
    tid = threading.get_ident()
    WATCHDOG.begin(timeout_s, tid)
    try:
        return policy.decide(event, view)
    finally:
        WATCHDOG.end(tid)


def _decide(subject: Subject, policy: Policy, event: Event, view: EngineView) -> list[Intent]:
    """``policy.decide(event, view)`` as the engine calls a user's policy: on a thread of its own,
    interrupted in Python after ``run.policy_timeout_s`` and abandoned 1 s later if blocked in C,
    the failure named as the engine names it."""
    _DECIDING[0] = tag_of(event)
    worker = _WORKER[0]
    if worker is None or worker.abandoned:
        worker = _WORKER[0] = PolicyWorker("shunter-contract-policy")
    timeout_s = subject.call_timeout_s
    try:
        out = worker.call(_watched, policy, event, view, timeout_s, timeout_s=timeout_s + GIVE_UP_AFTER_S)
    except (Stuck, GivenUp) as e:
        raise CheckFailed(f"decide() on {tag_of(event)} did not return {not_returned(e, timeout_s)}") from None
    except Exception as e:
        raise CheckFailed(f"decide() raised {describe(e)} on {tag_of(event)}") from e
    except BaseException:  # the check's deadline, while the call may still run: the next call gets a new thread
        _WORKER[0] = None
        raise
    finally:
        _DECIDING[0] = ""
    problem = check_intents(out)
    if problem:
        raise CheckFailed(f"decide() on {tag_of(event)} {problem}")
    return list(out)


def check_every_event(subject: Subject) -> str:
    for event in EVENTS:
        for view in VIEWS:
            _decide(subject, subject.make(), event, view)
    return f"{len(EVENTS)} event types x {len(VIEWS)} views"


def check_deterministic(subject: Subject) -> str:
    a, b = subject.make(), subject.make()
    for ev, view in _trace(subject):
        if _decide(subject, a, ev, view) != _decide(subject, b, ev, view):
            raise CheckFailed(f"two fresh instances decided differently on {tag_of(ev)} (seq {view.seq})")
    return f"{len(_trace(subject))} decisions equal"


def check_snapshot_restore(subject: Subject) -> str:
    trace = _trace(subject)
    for cut in (len(trace) // 3, len(trace) // 2, 2 * len(trace) // 3):
        ref = subject.make()
        for ev, view in trace[:cut]:
            _decide(subject, ref, ev, view)
        snap = ref.snapshot()
        try:
            msgspec.msgpack.encode(snap)
        except (TypeError, msgspec.EncodeError) as e:
            raise CheckFailed(f"snapshot() is not plain data: {describe(e)}") from e
        restored = subject.make()
        restored.restore(copy.deepcopy(snap))
        for ev, view in trace[cut:]:
            if _decide(subject, restored, ev, view) != _decide(subject, ref, ev, view):
                raise CheckFailed(f"restored from a snapshot at event {cut}, it decided differently on {tag_of(ev)}")
    return "3 cuts"


def check_restore_strict(subject: Subject) -> str:
    p = subject.make()
    snap = dict(p.snapshot())
    snap["__no_such_field__"] = 1
    try:
        p.restore(snap)
    except (ValueError, TypeError, msgspec.ValidationError):
        return "unknown key refused"
    raise CheckFailed("restore() accepted a snapshot key its State does not have (it would be dropped silently)")


def check_resume(subject: Subject) -> str:
    from shunter.engine.io.checkpoint import CheckpointStore

    with tempfile.TemporaryDirectory(prefix="shunter-contract-") as tmp:
        root = Path(tmp) / "checkpoints"
        first = _sim(subject, subject.make(), checkpoints=root, run={"checkpoint_every": 2, "checkpoint_keep": 10})
        _ended_ok(first, "the run to checkpoint")
        store = CheckpointStore(root)
        cuts = [p for p in store.complete() if 0 < store.verify(p).step < subject.steps]
        if not cuts:
            raise CheckFailed("the run cut no checkpoint before its end (checkpoint_every = 2)")
        mid = cuts[len(cuts) // 2]
        step = store.verify(mid).step
        trace: list[tuple[Event, EngineView]] = []
        resumed = _sim(
            subject,
            Recording(subject.make(), trace),
            resume=mid,
            checkpoints=Path(tmp) / "resumed",
            run={"checkpoint_every": 2},
        )
        _ended_ok(resumed, f"the run resumed at step {step}")
        if resumed.ended.steps != subject.steps:
            raise CheckFailed(f"resumed at step {step}, the run ended at step {resumed.ended.steps} of {subject.steps}")
        first_kind = tag_of(trace[0][0]) if trace else "none"
        if first_kind != "run.resumed":
            raise CheckFailed(f"after restore() the policy's first event was {first_kind}, not run.resumed")
    return f"resumed at step {step}, completed {subject.steps} steps"


CHECKS: dict[str, Callable[[Subject], str]] = {
    "run": check_run,
    "every_event": check_every_event,
    "deterministic": check_deterministic,
    "snapshot_restore": check_snapshot_restore,
    "restore_strict": check_restore_strict,
    "resume": check_resume,
}


def subject_for(
    spec: str, options: dict[str, Any] | None = None, *, standalone: int | None = None, hybrid: int | None = None
) -> Subject:
    """The policy ``spec`` with the first replica setup its ``check_setup`` accepts (or the one given)."""
    cls = policy_class(spec)
    make_policy(spec, options)  # options its constructor refuses: said once, before any setup is tried
    setups = [(standalone, hybrid)] if standalone is not None and hybrid is not None else SETUPS
    said = ""
    for s, h in setups:
        try:
            cls.check_setup(standalone=s, hybrid=h)
        except ValueError as e:
            said = str(e)
            continue
        subject = Subject(spec, dict(options or {}), s, h)
        try:
            subject.config()
        except ConfigError:
            continue
        return subject
    tried = ", ".join(f"{s} standalone + {h} hybrid" for s, h in setups)
    raise ValueError(f"{spec}: check_setup refused every replica setup tried ({tried}); it said: {said}")


def run_checks(subject: Subject, only: list[str] | None = None) -> list[CheckResult]:
    """Every check on ``subject``, each bounded by ``subject.time_limit_s`` of real time."""
    out = []
    for name, check in CHECKS.items():
        if only and name not in only:
            continue
        t0 = time.perf_counter()
        try:
            with deadline(subject.time_limit_s, f"check {name} of {subject.spec}"):
                detail = check(subject)
            out.append(CheckResult(name, True, detail, time.perf_counter() - t0))
        except (CheckFailed, CheckTimeout) as e:
            out.append(CheckResult(name, False, bounded(str(e)), time.perf_counter() - t0))
        except Exception as e:  # noqa: BLE001 - anything else the policy did is its failure too
            out.append(CheckResult(name, False, bounded(f"{describe(e)}"), time.perf_counter() - t0))
    return out
