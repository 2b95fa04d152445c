"""The policy protocol and the behaviour every built-in shares.

A policy is a plain object:

- ``decide(event, view) -> list[Intent]`` — synchronous, no I/O, the same intents for the
  same sequence of (event, view) pairs. The coordinator waits for every call to return (a
  user's policy runs on a thread of its own, the built-ins on the coordinator's loop): every
  millisecond it takes delays every replica's next request (``run.policy_budget_ms`` warns past
  a budget).
  It may raise or return junk: the coordinator reports it (``PolicyFailed``) and carries on,
  until ``run.policy_max_failures`` failures in a row end the run.
- all mutable state in ``self.state``, an instance of the class attribute ``State`` (a
  msgspec Struct), so ``snapshot()`` / ``restore()`` round-trip it exactly and a resumed run
  continues the policy where it stopped. ``restore()`` refuses keys its ``State`` does not
  have (a renamed field must not be forgotten silently).
- options as keyword arguments of ``__init__`` (``run.policy_options``); calling
  ``super().__init__()`` is optional — ``self.state`` is created on first use.
- ``check_setup(standalone=, hybrid=)`` raises ``ValueError`` for replica setups it cannot run
  (checked when the config is loaded).
- ``ignores``: event types the policy never acts on (``SAMPLE_EVENTS`` for a policy that acts
  on batches and steps, not on single samples), declared by the class itself, not inherited.
  ``decide`` is not called on them and the coordinator builds no view for them — on a busy
  fleet most events are per sample, so this keeps a policy's cost per event near zero at
  thousands of replicas.

What a policy sees: ``RunStarted`` (or ``RunResumed`` after ``restore()``) first — the opening's
replicas are already in ``view.replicas`` — then every event the coordinator handles, except
those about the policy itself (``PolicyFailed``, ``PolicySlow``, ``IntentRejected``). A resumed
attempt's replicas are new and in their starting modes (standalone serving, hybrid on the
trainer): derive anything about replicas from the view.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import msgspec

from shunter.events import (
    Consolidate,
    EngineView,
    Event,
    Intent,
    LoadWeights,
    ModeChanged,
    PublishWeights,
    ReplicaDown,
    ReplicaUp,
    RunResumed,
    RunStarted,
    SampleAborted,
    SampleBegin,
    SampleEnd,
    SampleResumed,
    StepEnd,
    TrainStep,
    Validate,
    WeightsLoaded,
    WeightsReady,
)
from shunter.events.vocab import DOWN, ROLLOUT, STANDALONE


class NoState(msgspec.Struct):
    """The ``State`` of a policy that keeps none."""


SAMPLE_EVENTS: tuple[type[Event], ...] = (SampleBegin, SampleResumed, SampleEnd, SampleAborted)
"""The per-sample events: a batch that they complete is announced by ``BatchReady``."""


class Policy:
    """Base class: override ``decide``; keep mutable state in ``self.state``."""

    name: ClassVar[str] = ""
    """Its name in logs and ``RunStarted`` (the class name if empty)."""
    State: ClassVar[type[msgspec.Struct]] = NoState
    """A msgspec Struct holding all its mutable state: ``self.state`` is one, created on first
    use; ``snapshot()`` / ``restore()`` save and load it with every checkpoint."""
    ignores: ClassVar[tuple[type[Event], ...]] = ()
    """Event types ``decide`` is never called on (and no view is built for). Declared per class,
    not inherited: a subclass sees every event unless it declares its own."""

    def __init__(self, **options: Any) -> None:
        """Options are keyword arguments (``run.policy_options``); calling ``super().__init__()``
        is optional."""
        if options:
            raise TypeError(f"{type(self).__name__} takes no options, got {sorted(options)}")

    @property
    def state(self) -> Any:
        """The policy's mutable state (an instance of ``State``), created on first use."""
        st = self.__dict__.get("_state")
        if st is None:
            st = self.__dict__["_state"] = self.State()
        return st

    @state.setter
    def state(self, value: Any) -> None:
        self.__dict__["_state"] = value

    @classmethod
    def check_setup(cls, *, standalone: int, hybrid: int) -> None:
        """Raise ValueError if the policy cannot run with these replicas."""

    def decide(self, event: Event, view: EngineView) -> list[Intent]:
        """The intents to carry out after ``event`` (already applied: ``view`` shows the state
        after it); ``[]`` to do nothing. Synchronous, no I/O, deterministic."""
        raise NotImplementedError(f"{type(self).__name__} does not implement decide(event, view)")

    def snapshot(self) -> dict[str, Any]:
        """The state as plain data, saved with a checkpoint."""
        out = msgspec.to_builtins(self.state)
        if not isinstance(out, dict):
            raise TypeError(f"{type(self).__name__}.State must be a msgspec Struct, got {type(self.state).__name__}")
        return out

    def restore(self, state: dict[str, Any]) -> None:
        """Replace the state with a snapshot; ValueError naming keys the ``State`` lacks."""
        unknown = unknown_keys(state, type(self.state))
        if unknown:
            raise ValueError(
                f"{type(self).__name__}.restore(): the snapshot has keys its State does not know: "
                f"{', '.join(unknown)} (renamed or removed fields?)"
            )
        self.state = msgspec.convert(state, type(self.state))


def unknown_keys(data: Any, struct: type, path: str = "") -> list[str]:
    """Keys in ``data`` (plain builtins) that ``struct`` (and its nested Structs) do not have."""
    if not (isinstance(data, dict) and isinstance(struct, type) and issubclass(struct, msgspec.Struct)):
        return []
    out: list[str] = []
    fields = {f.encode_name: f for f in msgspec.structs.fields(struct)}
    for key, value in data.items():
        f = fields.get(key)
        if f is None:
            out.append(f"{path}{key}")
        elif isinstance(f.type, type) and issubclass(f.type, msgspec.Struct):
            out += unknown_keys(value, f.type, f"{path}{key}.")
    return out


def checked_ignores(cls: type) -> tuple[type[Event], ...]:
    """``ignores`` as declared by ``cls`` itself, checked: a tuple of event classes — ValueError
    naming the policy otherwise (a typo must not silently make a policy deaf, or fail later on
    the loop). Not inherited: a subclass of ``SeparatePolicy`` that reacts to samples in its own
    ``decide`` must see them without knowing its parent ignored them."""
    ign = cls.__dict__.get("ignores", ())
    if not isinstance(ign, tuple) or not all(isinstance(t, type) and issubclass(t, Event) for t in ign):
        raise ValueError(
            f"policy {cls.__module__}.{cls.__qualname__}: ignores must be a tuple of event classes "
            f"(e.g. SAMPLE_EVENTS), got {ign!r}"
        )
    return ign


# -- shared building blocks (pure functions of event + view) --------------------------


def train_or_publish(event: Event, view: EngineView) -> list[Intent]:
    """Engine-driven training: publish when a sync cycle is complete (the replicas in rollout
    load it straight from the trainer), else train the next ready mini-batch when the trainer
    is idle."""
    if view.trainer_driver != "engine" or view.done or view.trainer.state != "idle":
        return []
    if view.trainer.steps_since_publish >= view.parameter_sync_step:  # serving replicas get it straight away
        return [PublishWeights(replica_ids=view.ids(mode=ROLLOUT))]
    if view.buffer.ready_batches > 0:
        return [TrainStep()]
    return []


def load_on_ready(event: Event, view: EngineView) -> list[Intent]:
    """New weights go to every replica in rollout mode at once (the others load when they
    switch to rollout)."""
    if isinstance(event, WeightsReady):
        ids = view.ids(mode=ROLLOUT)
        if ids:
            return [LoadWeights(version=event.version, replica_ids=ids)]
    return []


class ValidationState(msgspec.Struct):
    """What ``validate_when_due`` remembers: keep one in the policy's ``State``."""

    validated: int = -1
    """The last block of ``validate_every`` optimizer steps that was validated."""


def validate_when_due(event: Event, view: EngineView, state: ValidationState) -> list[Intent]:
    """Validate the weights of version 0, then the first published version at or after
    every ``validate_every`` optimizer steps, as soon as a replica in rollout mode serves it
    (after a load, or a switch to rollout — ``colocated`` serves new weights only that way), on
    such a replica."""
    every = view.validate_every
    if every <= 0 or view.done:
        return []
    version = view.trainer.version
    block = version * view.parameter_sync_step // every
    if block <= state.validated:
        return []
    if isinstance(event, RunStarted | RunResumed | WeightsLoaded | ModeChanged | StepEnd):
        current = [r.replica_id for r in view.replicas if r.mode == ROLLOUT and r.version >= version]
        if current:
            state.validated = block
            return [Validate(replica_ids=current)]
    return []


def option_flag(name: str, value: object) -> bool:
    """A policy option that is a boolean: ``true`` / ``false`` in TOML or JSON, nothing else —
    ``bool("false")`` is True, so a quoted ``"false"`` would turn the option on without a word."""
    if isinstance(value, bool):
        return value
    raise ValueError(f"{name} must be true or false, got {value!r}")


def option_number(name: str, value: object, *, at_least: float | None = None, above: float | None = None) -> float:
    """A policy option that is a finite number: a TOML / JSON integer or float, nothing else — a
    quoted ``"4"`` is refused as ``option_flag`` refuses ``"false"``, and so are NaN, infinity
    and a value below the option's range."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if at_least is not None and value < at_least:
        raise ValueError(f"{name} must be at least {at_least:g}, got {value!r}")
    if above is not None and value <= above:
        raise ValueError(f"{name} must be above {above:g}, got {value!r}")
    return float(value)


def option_sleep_level(value: object) -> int:
    """``sleep_level``: vLLM's sleep levels are 1 (weights offloaded, KV cache freed) and 2 (both
    freed); anything else would reach vLLM unchecked."""
    if isinstance(value, bool) or value not in (1, 2):
        raise ValueError(f"sleep_level must be 1 or 2 (vLLM's sleep levels), got {value!r}")
    return int(value)


def live_ids(view: EngineView, kind: str) -> list[str]:
    """Replicas of ``kind`` that are not down, in rank order."""
    return [r.replica_id for r in view.replicas if r.kind == kind and r.mode != DOWN]


class LaneOptions(msgspec.Struct, frozen=True, kw_only=True):
    """A straggler lane (``Consolidate``): ``replicas`` standalone replicas (the highest ranks)
    that take only samples that have generated for ``after_s`` seconds, ``max_in_flight`` each
    (0 replicas: no lane)."""

    replicas: int = 0
    max_in_flight: int = 16
    after_s: float = 0.0

    def __post_init__(self) -> None:
        if self.replicas < 0 or self.max_in_flight < 1 or self.after_s < 0:
            raise ValueError(
                f"straggler lane: tail_replicas >= 0, tail_max_in_flight >= 1 and tail_after_s >= 0, got {self}"
            )


class LaneState(msgspec.Struct):
    """What ``straggler_lane`` remembers: keep one in the policy's ``State``."""

    tail: list[str] = []
    """The replicas of the straggler lane as last asked for."""


def straggler_lane(event: Event, view: EngineView, opts: LaneOptions, state: LaneState) -> list[Intent]:
    """Keep the ``opts.replicas`` highest-ranked standalone replicas in rollout as the straggler
    lane — asked for when the run (re)starts and again whenever those replicas change (one went
    down, a replacement came up) — as long as at least one other replica is left to start new
    groups."""
    if opts.replicas <= 0 or not isinstance(event, RunStarted | RunResumed | ReplicaUp | ReplicaDown | ModeChanged):
        return []
    live = sorted((r for r in view.replicas if r.kind == STANDALONE and r.mode == ROLLOUT), key=lambda r: r.rank)
    tail = [r.replica_id for r in live[-opts.replicas :]] if len(live) > opts.replicas else []
    if tail == state.tail and not isinstance(event, RunStarted | RunResumed):
        return []
    state.tail = tail
    return [Consolidate(replica_ids=tail, max_in_flight=opts.max_in_flight, after_s=opts.after_s)]
