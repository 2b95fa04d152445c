"""Facts from the replica registry and about replica liveness.

Invariant: at any time a rank is held by at most one live replica, whatever its kind
(hybrid or standalone); ``RankReleased`` precedes any reuse of that rank.
"""

from __future__ import annotations

from shunter.events.base import Event
from shunter.events.vocab import Mode, ReplicaKind


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


class ReplicaDown(Event, frozen=True, kw_only=True, tag="replica.down"):
    """A replica is gone or unusable; every sample it held resumes elsewhere.

    ``executor | coordinator -> coordinator, policy``: its actor died or hung, or a weight load
    or switch on it failed (its weights or mode are unknown)."""

    replica_id: str
    reason: str
    """Free text: what happened."""
