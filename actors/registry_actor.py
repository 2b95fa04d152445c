"""``ReplicaRegistryActor``: the single owner of a run's ``RankTable``.

Invariants: all rank changes go through this one actor, whose synchronous methods Ray runs
one at a time, so concurrent registrations are atomic; the actor is named per run
(``shunter.<run_id>.registry``), so two runs in one cluster never share or collide with it.
Every change is returned as an event for the bus, and — when the actor has a
``state_path`` — written to disk atomically before the call returns, so a registry that
Ray restarts after a crash (``max_restarts=-1``; its calls are idempotent and retried)
comes back with the same table, and a run resumed later sees the ranks it held. A state file
that is damaged or another run's is refused (``RankTable.load``), never silently replaced.
"""

from __future__ import annotations

from pathlib import Path

import ray

from shunter.actors.wire import encode_events
from shunter.engine.coordinator.ranks import RankTable
from shunter.engine.io.checkpoint import write_atomic
from shunter.events import RankAssigned, RankReleased, Stamper


class ReplicaRegistryActor:
    def __init__(self, run_id: str, snapshot: bytes | None = None, state_path: str = "") -> None:
        self.path = Path(state_path) if state_path else None
        saved = RankTable.load(self.path, run_id) if self.path is not None else None  # a restart, or a resumed run
        if saved is None and snapshot is not None:
            saved = RankTable.restore(snapshot, run_id)
        self.table = saved if saved is not None else RankTable(run_id)
        self.stamp = Stamper(run_id, "registry")
        self._save()

    def _save(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, self.table.snapshot())

    def register(self, replica_id: str, kind: str, actor_name: str = "") -> tuple[int, str, bytes]:
        """Assign (idempotently) a rank and actor name (``actor_name``: the one its actor has
        already, a pooled replica's); returns (rank, name, events)."""
        before = self.table.get(replica_id)
        lease = self.table.assign(replica_id, kind, actor_name)
        self._save()
        events = (
            []
            if before
            else [
                self.stamp(
                    RankAssigned(replica_id=replica_id, replica_kind=kind, rank=lease.rank, actor_name=lease.actor_name)
                )
            ]
        )
        return lease.rank, lease.actor_name, encode_events(events)

    def release(self, replica_id: str, reason: str) -> bytes:
        lease = self.table.release(replica_id)
        if lease is None:
            return encode_events([])
        self._save()
        return encode_events([self.stamp(RankReleased(replica_id=replica_id, rank=lease.rank, reason=reason))])

    def release_all(self, reason: str, keep: list[str] | None = None) -> bytes:
        """Release every lease but those of ``keep`` (the replicas of an attempt that is over,
        but those the next attempt adopted)."""
        kept = set(keep or ())
        events = [
            self.stamp(RankReleased(replica_id=x.replica_id, rank=x.rank, reason=reason))
            for x in self.table.leases()
            if x.replica_id not in kept and self.table.release(x.replica_id)
        ]
        self._save()
        return encode_events(events)

    def leases(self) -> list[tuple[str, str, int, str]]:
        return [(x.replica_id, x.kind, x.rank, x.actor_name) for x in self.table.leases()]

    def generation(self) -> int:
        """Leases handed out so far in this run (replica ids are numbered past it)."""
        return self.table.generation

    def snapshot(self) -> bytes:
        return self.table.snapshot()

    def check(self) -> bool:
        self.table.check()
        return True


def registry_name(run_id: str) -> str:
    return f"shunter.{run_id}.registry"


def remote_class():
    return ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(ReplicaRegistryActor)
