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


class ComponentReady(Event, frozen=True, kw_only=True, tag="component.ready"):
    component: str
    setup_s: float = 0.0


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
