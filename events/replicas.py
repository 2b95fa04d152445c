"""Facts from the replica registry and about replica liveness.

Invariant: at any time a rank is held by at most one live replica, whatever its kind
(hybrid or standalone); ``RankReleased`` precedes any reuse of that rank.
"""

from __future__ import annotations

from shunter.events.base import Event
from shunter.events.vocab import Mode, ReplicaKind, WaitOutcome


class RankAssigned(Event, frozen=True, kw_only=True, tag="registry.rank_assigned"):
    """A replica got its rank and actor name from the run's registry.

    ``registry -> Engine -> coordinator``, before the replica's actor is created."""

    replica_id: str
    replica_kind: ReplicaKind
    rank: int
    actor_name: str


class RankReleased(Event, frozen=True, kw_only=True, tag="registry.rank_released"):
    """A rank is free again (its replica is down, or the attempt ended).

    ``registry -> coordinator``, after a ``ReplicaDown`` or at the start of a resumed attempt."""

    replica_id: str
    rank: int
    reason: str
    """Free text: why."""


class ReplicaUp(Event, frozen=True, kw_only=True, tag="replica.up"):
    """A replica is started and may take orders, in ``mode``, serving ``version``.

    ``Engine -> coordinator``: in an attempt's opening (applied before ``RunStarted``; the
    policy finds it in the view) or when ``Engine.add_replica`` brought one up mid-run (then
    handed to the policy like any event)."""

    replica_id: str
    replica_kind: ReplicaKind
    rank: int
    mode: Mode
    version: int = 0
    setup_s: float = 0.0
    adopted: bool = False
    """It kept its engine from the previous attempt (a restart): ``setup_s`` is the load of the
    checkpoint's weights into it, not an engine start (``run.restart_keeps_replicas``)."""


class ReplicaDown(Event, frozen=True, kw_only=True, tag="replica.down"):
    """A replica is gone or unusable; every sample it held resumes elsewhere.

    ``executor | coordinator -> coordinator, policy``: its actor died or hung, or a weight load
    or switch on it failed (its weights or mode are unknown)."""

    replica_id: str
    reason: str
    """Free text: what happened."""


class ReplicaRestart(Event, frozen=True, kw_only=True, tag="replica.restart"):
    """A replica died and is being replaced: a new replica of the same kind starts after
    ``delay_s`` (a new actor, generation and name; the rank the registry gives, normally the
    dead one's; it loads the current weights before it serves).

    ``coordinator -> Engine, policy, sinks``: right after the ``ReplicaDown`` (or the failed
    start of a replacement, ``ComponentFailed``); the Engine starts it as ``add_replica`` does."""

    replica_id: str
    """The replica that died (its replacement gets a new id, announced by ``RankAssigned``)."""
    replica_kind: ReplicaKind
    rank: int
    attempt: int
    """1 for the first replacement of this slot within the last hour, 2 for the next …"""
    delay_s: float
    reason: str


class ReplicaGivenUp(Event, frozen=True, kw_only=True, tag="replica.given_up"):
    """A dead replica is not replaced: replacements are off (``rollout.replica_restarts = 0``)
    or its slot used them up (``attempts`` within the last hour). The run goes on with the
    replicas it has; with none left it ends with an error that says so.

    ``coordinator -> policy, sinks``: instead of a ``ReplicaRestart``."""

    replica_id: str
    replica_kind: ReplicaKind
    rank: int
    attempts: int
    reason: str


class ReplicaPending(Event, frozen=True, kw_only=True, tag="replica.pending"):
    """A replica on its way — the replacement of one that was lost, or one added — waits for
    room in the Ray cluster: ``missing`` is what it asks for that no node has free now (a lost
    node's capacity, a custom resource only some nodes offer), ``free`` what the cluster has of it.

    ``Engine -> coordinator, policy``, once, when the wait begins: the replica starts as soon as
    room appears (a node comes back, or an operator adds one: ``RankAssigned``, ``ReplicaUp``),
    or, past ``deadline_s`` (``rollout.replacement_wait_s``), counts as a start that failed
    (``ComponentFailed``, and the supervisor decides again)."""

    replica_kind: ReplicaKind
    replacing: str = ""
    """The replica it replaces ("": one added with ``Engine.add_replica``)."""
    missing: dict[str, float]
    free: dict[str, float]
    deadline_s: float


class ReplicaWaited(Event, frozen=True, kw_only=True, tag="replica.waited"):
    """The wait a ``ReplicaPending`` announced is over: room was found (``placed``: the replica is
    made now, ``RankAssigned`` and ``ReplicaUp`` follow) or ``rollout.replacement_wait_s`` passed
    first (``gave_up``: its start counts as failed, ``ComponentFailed``).

    ``Engine -> coordinator, policy``, once after each ``ReplicaPending``."""

    replica_kind: ReplicaKind
    replacing: str = ""
    """The replica it replaces ("": one added with ``Engine.add_replica``)."""
    outcome: WaitOutcome
    waited_s: float
