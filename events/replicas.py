"""Facts from the replica registry and about replica liveness.

Invariant: at any time a rank is held by at most one live replica, whatever its kind
(hybrid or standalone); ``RankReleased`` precedes any reuse of that rank.
"""

from __future__ import annotations

from shunter.events.base import Event


class RankAssigned(Event, frozen=True, kw_only=True, tag="registry.rank_assigned"):
    replica_id: str
    replica_kind: str
    """``hybrid`` | ``standalone``."""
    rank: int
    actor_name: str


class RankReleased(Event, frozen=True, kw_only=True, tag="registry.rank_released"):
    replica_id: str
    rank: int
    reason: str


class ReplicaUp(Event, frozen=True, kw_only=True, tag="replica.up"):
    replica_id: str
    replica_kind: str
    rank: int
    mode: str
    version: int = 0
    setup_s: float = 0.0


class ReplicaDown(Event, frozen=True, kw_only=True, tag="replica.down"):
    replica_id: str
    reason: str
