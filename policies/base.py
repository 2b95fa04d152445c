"""The policy protocol and the behaviour every built-in shares.

Invariant: a policy is a plain object — ``decide(event, view) -> list[Command]`` is
synchronous, does no I/O, and returns the same commands for the same sequence of
(event, view) pairs. All of its mutable state lives in ``self.state``, a msgspec Struct,
so ``snapshot()``/``restore()`` round-trip it exactly and a restarted coordinator resumes
the policy where it stopped. A resumed attempt opens with ``RunResumed`` (after
``restore()``) instead of ``RunStarted``: the replicas are new and in their starting modes
(standalone serving, hybrid on the trainer), so state about replicas must be re-derived
from the view then.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from shunter.events import (
    Command,
    EngineView,
    Event,
    LoadWeights,
    PublishWeights,
    RunResumed,
    RunStarted,
    StepEnd,
    TrainStep,
    Validate,
    WeightsLoaded,
    WeightsReady,
)
from shunter.events.view import DOWN, ROLLOUT


class NoState(msgspec.Struct):
    pass


class Policy:
    """Base class: override ``decide``; keep state in ``self.state``."""

    name: ClassVar[str] = ""
    State: ClassVar[type[msgspec.Struct]] = NoState

    def __init__(self, **options: Any) -> None:
        if options:
            raise TypeError(f"{type(self).__name__} takes no options, got {sorted(options)}")
        self.state = self.State()

    @classmethod
    def check_setup(cls, *, standalone: int, hybrid: int) -> None:
        """Raise ValueError if the policy cannot run with these replicas."""

    def decide(self, event: Event, view: EngineView) -> list[Command]:
        raise NotImplementedError

    def snapshot(self) -> dict:
        return msgspec.to_builtins(self.state)

    def restore(self, state: dict) -> None:
        self.state = msgspec.convert(state, type(self.state))


# -- shared building blocks (pure functions of event + view) --------------------------


def train_or_publish(event: Event, view: EngineView) -> list[Command]:
    """Engine-driven training: publish when a sync cycle is complete, else train the next
    ready mini-batch when the trainer is idle."""
    if view.trainer_driver != "engine" or view.done or view.trainer.state != "idle":
        return []
    if view.trainer.steps_since_publish >= view.parameter_sync_step:
        return [PublishWeights()]
    if view.buffer.ready_batches > 0:
        return [TrainStep()]
    return []


def load_on_ready(event: Event, view: EngineView) -> list[Command]:
    """New weights go to every replica in rollout mode at once (the others load when they
    switch to rollout)."""
    if isinstance(event, WeightsReady):
        ids = view.ids(mode=ROLLOUT)
        if ids:
            return [LoadWeights(version=event.version, replica_ids=ids)]
    return []


class ValidationState(msgspec.Struct):
    validated: int = -1
    """The last block of ``validate_every`` optimizer steps that was validated."""


def validate_when_due(event: Event, view: EngineView, state: ValidationState) -> list[Command]:
    """Validate the weights of version 0, then the first published version at or after
    every ``validate_every`` optimizer steps, once the rollout replicas serve it."""
    every = view.validate_every
    if every <= 0 or view.done:
        return []
    version = view.trainer.version
    block = version * view.parameter_sync_step // every
    if block <= state.validated:
        return []
    if isinstance(event, RunStarted | RunResumed | WeightsLoaded | StepEnd):
        serving = [r for r in view.replicas if r.mode == ROLLOUT]
        if serving and all(r.version >= version for r in serving):
            state.validated = block
            return [Validate()]
    return []


def live_ids(view: EngineView, kind: str) -> list[str]:
    return [r.replica_id for r in sorted(view.replicas, key=lambda r: r.rank) if r.kind == kind and r.mode != DOWN]
