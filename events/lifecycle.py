"""Run and component lifecycle facts, and the error facts that keep failures visible.

Invariant: a failure anywhere (a component's setup, a policy that raises, bytes that do
not decode) becomes one of these events with its cause as text, never a silently dead
loop.
"""

from __future__ import annotations

from shunter.events.base import Event


class RunStarted(Event, frozen=True, kw_only=True, tag="run.started"):
    policy: str
    replicas: int
    trainer_driver: str = "engine"
    """``engine`` (built-in train loop) or ``user`` (the embedding program trains)."""


class RunEnded(Event, frozen=True, kw_only=True, tag="run.ended"):
    reason: str
    """``completed`` | ``stopped`` | ``error``."""
    steps: int = 0
    summary: dict[str, float] = {}
    error: str = ""
    failed_component: str = ""
    """For ``error``: the component whose death ended the run (``trainer``); the ``Engine``
    restarts such a run from its last checkpoint (``run.max_restarts``)."""


class RunResumed(Event, frozen=True, kw_only=True, tag="run.resumed"):
    """This attempt of the run starts from a checkpoint: model, optimizer, step, version,
    buffer and the prompts in flight at ``step`` are restored; the optimizer steps the
    previous attempt took after it are redone (their batches re-form from the same groups)."""

    checkpoint: str
    step: int
    version: int
    attempt: int
    reason: str = ""
    """Why the previous attempt ended (empty for a resume asked for by the user)."""


class CheckpointSaved(Event, frozen=True, kw_only=True, tag="checkpoint.saved"):
    """A checkpoint is committed (renamed into place, ``latest`` updated): a crash from
    now on resumes from here."""

    step: int
    version: int
    path: str
    nbytes: int
    duration_s: float


class ComponentReady(Event, frozen=True, kw_only=True, tag="component.ready"):
    component: str
    setup_s: float = 0.0


class ComponentPlaced(Event, frozen=True, kw_only=True, tag="component.placed"):
    """Where a component's actor runs: its placement-group bundle (-1: outside any group),
    node and the GPUs Ray gave it."""

    component: str
    bundle: int = -1
    node: str = ""
    gpu_ids: list[str] = []


class ComponentFailed(Event, frozen=True, kw_only=True, tag="component.failed"):
    component: str
    error: str


class EventRejected(Event, frozen=True, kw_only=True, tag="coordinator.event_rejected"):
    """Bytes that arrived at the coordinator and did not decode; they were dropped."""

    origin: str
    error: str
    nbytes: int = 0


class PolicyFailed(Event, frozen=True, kw_only=True, tag="policy.failed"):
    """The policy raised while deciding on an event; no command was issued for it."""

    policy: str
    on_kind: str
    error: str


class CommandFailed(Event, frozen=True, kw_only=True, tag="command.failed"):
    """A command could not be carried out; ``target`` names the component that failed."""

    command_kind: str
    target: str
    error: str
    group_id: int = -1
    """For a failed generation: the prompt group it belonged to (dropped as ``failed``)."""
