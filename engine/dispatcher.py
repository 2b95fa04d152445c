"""``Dispatcher``: balances generation over the replicas currently in rollout mode.

Invariants: a request goes only to a replica that is in the dispatcher (in rollout mode)
and has room (``in_flight + n <= capacity``); among those, the least loaded wins (ties:
lowest rank). ``in_flight`` counts samples, never goes negative, and a removed replica
keeps its count until its samples come back (finished or aborted) or it is forgotten.
It also knows the weight version each of its replicas serves, so the newest version being
served is a lookup over the few distinct versions, not a scan of the replicas. Every
operation is O(log replicas) or better.
"""

from __future__ import annotations

import heapq
from collections import Counter


class Dispatcher:
    def __init__(self) -> None:
        self._capacity: dict[str, int] = {}
        self._rank: dict[str, int] = {}
        self._in_flight: dict[str, int] = {}
        self.total_in_flight = 0
        self._caps: Counter[int] = Counter()  # capacity -> replicas with it
        self._heap: list[tuple[int, int, str]] = []  # (load, rank, id); stale entries skipped
        self._version: dict[str, int] = {}
        self._versions: Counter[int] = Counter()  # weight version -> replicas serving it

    def add(self, replica_id: str, *, rank: int, capacity: int, version: int = 0) -> None:
        self.remove(replica_id)
        self._capacity[replica_id] = capacity
        self._caps[capacity] += 1
        self._rank[replica_id] = rank
        self._version[replica_id] = version
        self._versions[version] += 1
        self._in_flight.setdefault(replica_id, 0)
        self._push(replica_id)

    def _push(self, rid: str) -> None:
        if rid in self._capacity:
            heapq.heappush(self._heap, (self._in_flight[rid], self._rank[rid], rid))
            if len(self._heap) > 4 * len(self._capacity) + 64:  # drop stale entries now and then
                self._heap = [(self._in_flight[r], self._rank[r], r) for r in self._capacity]
                heapq.heapify(self._heap)

    def remove(self, replica_id: str) -> None:
        """Stop sending to the replica (its in-flight count stays until they come back)."""
        cap = self._capacity.pop(replica_id, None)
        if cap is not None:
            self._caps[cap] -= 1
            if not self._caps[cap]:
                del self._caps[cap]
            self._count_out(self._version.pop(replica_id))
        self._rank.pop(replica_id, None)

    def _count_out(self, version: int) -> None:
        self._versions[version] -= 1
        if not self._versions[version]:
            del self._versions[version]

    def set_version(self, replica_id: str, version: int) -> None:
        """The replica now serves weights of ``version`` (ignored if it is not dispatching)."""
        old = self._version.get(replica_id)
        if old is not None and old != version:
            self._count_out(old)
            self._version[replica_id] = version
            self._versions[version] += 1

    def serving_version(self) -> int | None:
        """The newest weight version among the replicas taking requests (None: none does)."""
        return max(self._versions) if self._versions else None

    def forget(self, replica_id: str) -> None:
        """The replica is gone: drop it and its count."""
        self.remove(replica_id)
        self.total_in_flight -= self._in_flight.pop(replica_id, 0)

    def __contains__(self, replica_id: str) -> bool:
        return replica_id in self._capacity

    def active(self) -> list[str]:
        return sorted(self._capacity, key=self._rank.__getitem__)

    def pick(self, n: int) -> str | None:
        """The replica that should take ``n`` more samples, or None if none has room."""
        h = self._heap
        while h:
            load, rank, rid = h[0]
            if rid not in self._capacity or self._in_flight[rid] != load:
                heapq.heappop(h)  # stale
                continue
            if load + n <= self._capacity[rid]:
                return rid
            break
        if len(self._caps) <= 1:
            return None  # equal capacities: if the least loaded has no room, none has
        # unequal capacities: a bigger replica might still have room
        fits = [
            (self._in_flight[r], self._rank[r], r) for r, c in self._capacity.items() if self._in_flight[r] + n <= c
        ]
        return min(fits)[2] if fits else None

    def started(self, replica_id: str, n: int) -> None:
        if replica_id in self._in_flight:
            self._in_flight[replica_id] += n
            self.total_in_flight += n
            self._push(replica_id)

    def finished(self, replica_id: str, n: int = 1) -> None:
        if replica_id in self._in_flight:
            n = min(n, self._in_flight[replica_id])
            self._in_flight[replica_id] -= n
            self.total_in_flight -= n
            self._push(replica_id)

    def in_flight(self, replica_id: str) -> int:
        return self._in_flight.get(replica_id, 0)

    def free_slots(self) -> int:
        return sum(max(0, c - self._in_flight[r]) for r, c in self._capacity.items())
