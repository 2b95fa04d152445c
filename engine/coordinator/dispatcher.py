"""``Dispatcher``: balances generation over the replicas currently in rollout mode.

Invariants: a request goes only to a replica that is in the dispatcher (in rollout mode), in
the lane asked for, and has room (``in_flight + n <= capacity``); among those, the least
loaded wins (ties: lowest rank). Replicas are in one of two lanes: ``bulk`` (new prompt groups
and resumes) or ``tail`` (the straggler lane of ``Consolidate``: only samples moved there, at
its own, smaller capacity). ``in_flight`` counts samples, never goes negative, and a removed
replica keeps its count until its samples come back (finished or aborted) or it is forgotten.
It also knows the weight version each of its replicas serves, so the newest version being
served is a lookup over the few distinct versions, not a scan of the replicas. Every
operation is O(log replicas) or better, but for ``set_tail`` (a policy's rare reassignment).
"""

from __future__ import annotations

import heapq
from collections import Counter
from typing import Literal

Lane = Literal["bulk", "tail"]
LANES: tuple[Lane, ...] = ("bulk", "tail")


class Dispatcher:
    def __init__(self) -> None:
        self._base: dict[str, int] = {}  # capacity as added (the bulk lane's)
        self._capacity: dict[str, int] = {}  # capacity now (the lane's)
        self._rank: dict[str, int] = {}
        self._lane: dict[str, Lane] = {}
        self._in_flight: dict[str, int] = {}
        self.total_in_flight = 0
        self._caps: dict[Lane, Counter[int]] = {lane: Counter() for lane in LANES}  # capacity -> replicas
        self._heaps: dict[Lane, list[tuple[int, int, str]]] = {lane: [] for lane in LANES}  # stale entries skipped
        self._version: dict[str, int] = {}
        self._versions: Counter[int] = Counter()  # weight version -> replicas serving it
        self._tail: set[str] = set()
        self._tail_capacity = 0

    def add(self, replica_id: str, *, rank: int, capacity: int, version: int = 0) -> None:
        self.remove(replica_id)
        self._base[replica_id] = capacity
        self._rank[replica_id] = rank
        self._version[replica_id] = version
        self._versions[version] += 1
        self._in_flight.setdefault(replica_id, 0)
        self._place(replica_id, "tail" if replica_id in self._tail else "bulk")

    def _place(self, rid: str, lane: Lane) -> None:
        old = self._lane.get(rid)
        if old is not None:
            self._count_cap(old, self._capacity[rid], -1)
        cap = self._tail_capacity if lane == "tail" else self._base[rid]
        self._lane[rid], self._capacity[rid] = lane, cap
        self._count_cap(lane, cap, +1)
        self._push(rid)

    def _count_cap(self, lane: Lane, cap: int, d: int) -> None:
        c = self._caps[lane]
        c[cap] += d
        if not c[cap]:
            del c[cap]

    def _push(self, rid: str) -> None:
        lane = self._lane.get(rid)
        if lane is None:
            return
        h = self._heaps[lane]
        heapq.heappush(h, (self._in_flight[rid], self._rank[rid], rid))
        if len(h) > 4 * len(self._capacity) + 64:  # drop stale entries now and then
            self._rebuild(lane)

    def set_tail(self, replica_ids: list[str], capacity: int) -> None:
        """The straggler lane is now ``replica_ids`` (those dispatching now, and any that join
        later), each taking at most ``capacity`` samples; every other replica is bulk."""
        self._tail, self._tail_capacity = set(replica_ids), capacity
        for rid in list(self._lane):
            self._place(rid, "tail" if rid in self._tail else "bulk")
        for lane in LANES:  # the old entries carry old lanes
            self._rebuild(lane)

    def _rebuild(self, lane: Lane) -> None:
        h = [(self._in_flight[r], self._rank[r], r) for r, ln in self._lane.items() if ln == lane]
        heapq.heapify(h)
        self._heaps[lane] = h

    def lane(self, replica_id: str) -> Lane | None:
        return self._lane.get(replica_id)

    def has_tail(self) -> bool:
        return bool(self._caps["tail"])

    def remove(self, replica_id: str) -> None:
        """Stop sending to the replica (its in-flight count stays until they come back)."""
        cap = self._capacity.pop(replica_id, None)
        if cap is not None:
            self._count_cap(self._lane.pop(replica_id), cap, -1)
            self._count_out(self._version.pop(replica_id))
            del self._base[replica_id]
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

    def size(self) -> int:
        """Replicas serving (in any lane)."""
        return len(self._capacity)

    def active(self) -> list[str]:
        return sorted(self._capacity, key=self._rank.__getitem__)

    def pick(self, n: int, lane: Lane = "bulk", at_least: int = 0) -> str | None:
        """The replica of ``lane`` that should take ``n`` more samples, or None if none has room.
        ``at_least``: only a replica serving that weight version or newer (a resume keeps its
        group's level: see :meth:`InFlight.pump`) — O(replicas) when the least loaded is older."""
        h = self._heaps[lane]
        while h:
            load, rank, rid = h[0]
            if self._lane.get(rid) != lane or self._in_flight[rid] != load:
                heapq.heappop(h)  # stale
                continue
            room = load + n <= self._capacity[rid]
            if room and self._version[rid] >= at_least:
                return rid
            if not room and len(self._caps[lane]) <= 1:
                return None  # equal capacities: if the least loaded has no room, none has
            break
        # unequal capacities (a bigger replica might still have room) or an older least loaded
        fits = [
            (self._in_flight[r], self._rank[r], r)
            for r, c in self._capacity.items()
            if self._lane[r] == lane and self._in_flight[r] + n <= c and self._version[r] >= at_least
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

    def tail_room(self) -> int:
        """Free slots in the straggler lane (O(lane), a few replicas)."""
        return sum(max(0, self._tail_capacity - self._in_flight[r]) for r in self._tail if self._lane.get(r) == "tail")
