"""``ReplicaRegistryActor``: the single owner of a run's ``RankTable``.

Invariant: all rank changes go through this one actor, whose synchronous methods Ray runs
one at a time, so concurrent registrations are atomic; the
actor is named per run (``shunter.<run_id>.registry``), so two runs in one cluster never
share or collide with it. Every change is returned as an event for the bus.
"""

from __future__ import annotations

import ray

from shunter.actors.wire import encode_events
from shunter.engine.ranks import RankTable
from shunter.events import RankAssigned, RankReleased, Stamper


class ReplicaRegistryActor:
    def __init__(self, run_id: str, snapshot: bytes | None = None) -> None:
        self.table = RankTable.restore(snapshot) if snapshot else RankTable(run_id)
        self.stamp = Stamper(run_id, "registry")

    def register(self, replica_id: str, kind: str) -> tuple[int, str, bytes]:
        """Assign (idempotently) a rank and actor name; returns (rank, name, events)."""
        before = self.table.get(replica_id)
        lease = self.table.assign(replica_id, kind)
        events = [] if before else [self.stamp(RankAssigned(replica_id=replica_id, replica_kind=kind, rank=lease.rank,
                                                            actor_name=lease.actor_name))]
        return lease.rank, lease.actor_name, encode_events(events)

    def release(self, replica_id: str, reason: str) -> bytes:
        lease = self.table.release(replica_id)
        if lease is None:
            return encode_events([])
        return encode_events([self.stamp(RankReleased(replica_id=replica_id, rank=lease.rank, reason=reason))])

    def leases(self) -> list[tuple[str, str, int, str]]:
        return [(x.replica_id, x.kind, x.rank, x.actor_name) for x in self.table.leases()]

    def snapshot(self) -> bytes:
        return self.table.snapshot()

    def check(self) -> bool:
        self.table.check()
        return True


def registry_name(run_id: str) -> str:
    return f"shunter.{run_id}.registry"


def remote_class():
    return ray.remote(num_cpus=0)(ReplicaRegistryActor)
