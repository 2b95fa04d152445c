"""``RankTable``: ranks and actor names for rollout replicas, from one pool.

Invariants (checked by :meth:`check`):

- hybrid and standalone replicas draw ranks from the same pool, so their ranks never
  collide whatever order they register in;
- a replica holds one rank whatever its width: a tensor-parallel replica
  (``rollout.tensor_parallel_size``) is one engine with one weight group (a trainer-replica
  pair, its first TP rank joining) and its TP ranks meet in vLLM's own group, never in a
  world the ranks here number;
- ``assign`` is idempotent for the same replica id (same rank, same name);
- a released rank is reused smallest-first;
- actor names embed the run id and a generation counter that never repeats within a run,
  so a replacement replica — or a second run in the same Ray cluster — never meets
  "name already taken" (a replica taken from a ``ReplicaPool`` keeps the name, unique too, that
  the run which made it gave it).

The table is plain data (``snapshot``/``restore``) so the registry actor can recover it.
A saved table is taken back only whole and only by its own run (:meth:`RankTable.load`): an
empty, undecodable, foreign or inconsistent state file raises ``RegistryStateError`` naming
the file, the cause and the way out — never a silent fresh table, which would hand out the
ranks and names of replicas that may still hold them. The checks are explicit raises, so
``python -O`` keeps them.
"""

from __future__ import annotations

import heapq
from pathlib import Path

import msgspec

KINDS = ("hybrid", "standalone")

RECOVERY = (
    "if no replica of this run is alive (after a stop or a crash of the whole run, none is), "
    "move the file aside and resume: the registry starts an empty table"
)


class RegistryStateError(ValueError):
    """A saved rank table that cannot be trusted; the message names the file, why, and what to do."""


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

    def assign(self, replica_id: str, kind: str, actor_name: str = "") -> Lease:
        """The replica's lease (idempotent); ``actor_name``: the name its actor already has (a
        replica taken from a ``ReplicaPool`` keeps the name the run that made it gave it)."""
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
        name = actor_name or f"shunter.{self._s.run_id}.rollout.r{rank}.g{self._s.generation}"
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
    def restore(cls, data: bytes, run_id: str | None = None) -> RankTable:
        """The table of a snapshot; ``RegistryStateError`` if it is empty, undecodable, of another
        run than ``run_id`` (when given) or inconsistent."""
        if not data:
            raise RegistryStateError("the saved rank table is empty (0 bytes)")
        try:
            state = msgspec.msgpack.decode(data, type=RankTableState)
        except msgspec.MsgspecError as e:
            raise RegistryStateError(f"the saved rank table does not decode: {e}") from None
        if run_id is not None and state.run_id != run_id:
            raise RegistryStateError(f"the saved rank table belongs to run {state.run_id!r}, not {run_id!r}")
        table = cls.__new__(cls)
        table._s = state
        table.check()
        return table

    @classmethod
    def load(cls, path: str | Path, run_id: str) -> RankTable | None:
        """The table saved at ``path`` for ``run_id``; None if there is no file."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return cls.restore(data, run_id)
        except RegistryStateError as e:
            raise RegistryStateError(f"{path}: {e}; {RECOVERY}") from None

    def check(self) -> None:
        """Raise ``RegistryStateError`` if an invariant is broken."""
        s = self._s
        ranks = [lease.rank for lease in s.leases.values()]
        names = [lease.actor_name for lease in s.leases.values()]
        broken = [
            (len(ranks) != len(set(ranks)), f"duplicate ranks {sorted(ranks)}"),
            (bool(set(ranks) & set(s.free)), "a held rank is also free"),
            (len(set(s.free)) != len(s.free), "a free rank is listed twice"),
            (set(ranks) | set(s.free) != set(range(s.next_rank)), "ranks leaked"),
            (len(names) != len(set(names)), "duplicate actor names"),
            (any(lease.kind not in KINDS for lease in s.leases.values()), "a lease of an unknown kind"),
            (any(k != lease.replica_id for k, lease in s.leases.items()), "a lease filed under another replica"),
            (s.generation < len(s.leases), "fewer generations than leases"),
        ]
        if why := [w for bad, w in broken if bad]:
            raise RegistryStateError(f"the rank table is inconsistent: {'; '.join(why)}")
