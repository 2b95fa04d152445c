"""``RankTable``: ranks and actor names for rollout replicas, from one pool.

Invariants (checked by :meth:`check`):

- hybrid and standalone replicas draw ranks from the same pool, so their ranks never
  collide whatever order they register in;
- ``assign`` is idempotent for the same replica id (same rank, same name);
- a released rank is reused smallest-first;
- actor names embed the run id and a generation counter that never repeats within a run,
  so a replacement replica — or a second run in the same Ray cluster — never meets
  "name already taken".

The table is plain data (``snapshot``/``restore``) so the registry actor can recover it.
"""

from __future__ import annotations

import heapq

import msgspec

KINDS = ("hybrid", "standalone")


class Lease(msgspec.Struct, frozen=True):
    replica_id: str
    kind: str
    rank: int
    actor_name: str


class RankTableState(msgspec.Struct):
    run_id: str
    leases: dict[str, Lease] = {}
    free: list[int] = []
    next_rank: int = 0
    generation: int = 0


class RankTable:
    def __init__(self, run_id: str) -> None:
        if not run_id:
            raise ValueError("RankTable needs a non-empty run_id (actor names are scoped by it)")
        self._s = RankTableState(run_id=run_id)

    def assign(self, replica_id: str, kind: str) -> Lease:
        if kind not in KINDS:
            raise ValueError(f"replica kind must be one of {KINDS}, got {kind!r}")
        held = self._s.leases.get(replica_id)
        if held is not None:
            if held.kind != kind:
                raise ValueError(f"replica {replica_id!r} already holds rank {held.rank} as {held.kind}, not {kind}")
            return held
        if self._s.free:
            rank = heapq.heappop(self._s.free)
        else:
            rank = self._s.next_rank
            self._s.next_rank += 1
        self._s.generation += 1
        name = f"shunter.{self._s.run_id}.rollout.r{rank}.g{self._s.generation}"
        lease = Lease(replica_id=replica_id, kind=kind, rank=rank, actor_name=name)
        self._s.leases[replica_id] = lease
        return lease

    def release(self, replica_id: str) -> Lease | None:
        """Free the replica's rank; None if it held none (releasing twice is harmless)."""
        lease = self._s.leases.pop(replica_id, None)
        if lease is not None:
            heapq.heappush(self._s.free, lease.rank)
        return lease

    @property
    def generation(self) -> int:
        return self._s.generation

    def get(self, replica_id: str) -> Lease | None:
        return self._s.leases.get(replica_id)

    def leases(self) -> list[Lease]:
        return sorted(self._s.leases.values(), key=lambda lease: lease.rank)

    def snapshot(self) -> bytes:
        return msgspec.msgpack.encode(self._s)

    @classmethod
    def restore(cls, data: bytes) -> RankTable:
        table = cls.__new__(cls)
        table._s = msgspec.msgpack.decode(data, type=RankTableState)
        table.check()
        return table

    def check(self) -> None:
        """Raise AssertionError if an invariant is broken."""
        ranks = [lease.rank for lease in self._s.leases.values()]
        assert len(ranks) == len(set(ranks)), f"duplicate ranks {sorted(ranks)}"
        assert not set(ranks) & set(self._s.free), "a held rank is also free"
        assert len(set(self._s.free)) == len(self._s.free), "a free rank is listed twice"
        assert set(ranks) | set(self._s.free) == set(range(self._s.next_rank)), "ranks leaked"
        names = [lease.actor_name for lease in self._s.leases.values()]
        assert len(names) == len(set(names)), "duplicate actor names"
