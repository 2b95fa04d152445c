"""``RunningRequests``: the table of the requests running on one replica, and the cuts made
through it. ``RolloutCore`` holds it and hands it to its sample runner (which adds and removes
each request), its weights-and-modes part (which cuts every request, or marks them at a swap in
place) and its validation (which draws request numbers); it is given the replica's backend,
which it aborts requests on.

Invariants:

- a request is in the table from just before its ``generate`` until that call returns, and
  the table is drained exactly when it is empty: a cut waits for that, so it returns once every
  request it aborted has handed back its tokens;
- a request's state is "" while it runs, else why it is being cut: a request is cut once (a
  second cut passes it over), and its sample reads the reason when its ``generate`` returns;
- request numbers (``ids``) never repeat within one engine: the counter outlives a sample loop
  that is stopped and renewed (``actors.rollout_worker``).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from typing import Literal

from shunter.engine.replica.backend import Backend

Running = Literal["", "weights_update", "reclaimed", "rebalanced", "shutdown"]
"""A running request's state: "" while it runs, else why it is being cut."""


class RunningRequests:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.ids: itertools.count[int] = itertools.count()  # request numbers
        self._running: dict[str, Running] = {}  # request id -> abort reason ("" while running)
        self._group_of: dict[str, int] = {}  # request id -> prompt group
        self._request_of: dict[str, str] = {}  # sample id -> its running request
        self._marks: dict[str, list[tuple[int, int]]] = {}  # request id -> (tokens made before, new version)
        self._drained = asyncio.Event()
        self._drained.set()

    def add(self, rid: str, group_id: int, sample_id: str) -> None:
        """Request ``rid`` of sample ``sample_id`` (of prompt group ``group_id``) starts running."""
        self._running[rid] = ""
        self._group_of[rid] = group_id
        self._request_of[sample_id] = rid
        self._drained.clear()

    def remove(self, rid: str, sample_id: str) -> tuple[Running, list[tuple[int, int]]]:
        """Request ``rid`` returned: why it was cut ("" if it was not) and its swap-in-place marks."""
        reason = self._running.pop(rid, "")
        self._group_of.pop(rid, None)
        self._request_of.pop(sample_id, None)
        marks = self._marks.pop(rid, [])
        if not self._running:
            self._drained.set()
        return reason, marks

    def count(self) -> int:
        """How many requests are running."""
        return len(self._running)

    def mark(self, made: Mapping[str, int], version: int) -> None:
        """The weights were swapped in place: each running request's tokens after the ``made[rid]``
        it had made are ``version``'s."""
        for rid in self._running:
            self._marks.setdefault(rid, []).append((int(made.get(rid, 0)), version))

    async def cut(self, reason: Running) -> int:
        """Abort every running request with ``reason`` and wait until all have returned."""
        ids = [rid for rid, r in self._running.items() if not r]
        for rid in ids:
            self._running[rid] = reason
        if ids:
            await self.backend.abort(ids)
        await self._drained.wait()
        return len(ids)

    async def shed(self, count: int) -> None:
        """Cut whole prompt groups, most recently started first, until ``count`` running
        samples are cut; their partials come back through their own ``generate`` calls."""
        groups: dict[int, list[str]] = {}
        for rid, reason in self._running.items():
            if not reason:
                groups.setdefault(self._group_of.get(rid, -1), []).append(rid)
        cut: list[str] = []
        for gid in sorted(groups, reverse=True):
            if len(cut) >= count:
                break
            cut += groups[gid]
        for rid in cut:
            self._running[rid] = "rebalanced"
        if cut:
            await self.backend.abort(cut)

    async def cut_samples(self, sample_ids: list[str]) -> None:
        """Cut the named samples (those still running here); their partials come back through
        their own ``generate`` calls as ``SampleAborted(reason="rebalanced")``."""
        cut = [
            rid for sid in sample_ids if (rid := self._request_of.get(sid)) is not None and not self._running.get(rid)
        ]
        for rid in cut:
            self._running[rid] = "rebalanced"
        if cut:
            await self.backend.abort(cut)
