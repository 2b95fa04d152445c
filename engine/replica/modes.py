"""One replica's weight loads and serving-mode switches (``RolloutCore``'s part; the core
provides the state declared below).

Invariants:

- one weight load at a time, in arrival order (``_weights``), and none under a validation
  (``_stable``), so a held-out score is one version's;
- ``weight_update = "abort"``: every running request is cut and hands back its prefix before
  the weights change, so no request mixes two versions; ``"keep"``: the requests are paused
  with their KV cache, the weights swapped and each request's tokens from the pause on are
  marked with the new version;
- weights that arrive while the replica is asleep (``trainer`` mode) are received (a weight
  group's bytes must be taken when the trainer sends them) and installed when it wakes;
- a switch to the trainer cuts every request first: their samples leave whole, as partials.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Literal, TypeVar

from shunter.engine.replica.backend import Backend
from shunter.events import Event, ModeChanged, WeightsLoaded
from shunter.events.vocab import ROLLOUT, TRAINER, ServingMode, WeightUpdate

E = TypeVar("E", bound=Event)
Running = Literal["", "weights_update", "reclaimed", "rebalanced", "shutdown"]
"""A running request's state: "" while it runs, else why it is being cut."""


def _now() -> float:
    """Durations are measured on the running loop's clock: monotonic in real runs,
    virtual in a simulation (``shunter.bench``)."""
    return asyncio.get_running_loop().time()


class WeightsAndModes:
    backend: Backend
    replica_id: str
    version: int
    mode: ServingMode
    weight_update: WeightUpdate
    _weights: asyncio.Lock
    _stable: asyncio.Lock
    _open: asyncio.Event
    _pending_weights: tuple[int, bytes] | None
    _running: dict[str, Running]
    _marks: dict[str, list[tuple[int, int]]]
    _evicting: bool
    _req: itertools.count[int]

    def _stamp(self, e: E) -> E:
        raise NotImplementedError

    def _wall(self) -> float:
        """The wall clock events are stamped with (virtual in a simulation)."""
        raise NotImplementedError

    async def _cut(self, reason: Running) -> int:
        raise NotImplementedError

    def _streams_wait(self) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    async def _consume(self, blob: bytes | None) -> None:
        """Weights sent over this replica's weight group arrive whatever the replica does with
        them (the trainer is sending them now): receive them into the group's buffer."""
        receives = getattr(self.backend, "receives", None)
        if blob is not None and receives is not None and receives(blob):
            await getattr(self.backend, "receive_weights")(blob)  # noqa: B009 - optional in the protocol

    async def load_weights(self, version: int, blob: bytes | None) -> list[Event]:
        async with self._weights:
            return await self._load_weights(version, blob)

    async def _load_weights(self, version: int, blob: bytes | None) -> list[Event]:
        if version <= self.version:
            await self._consume(blob)
            return [self._stamp(WeightsLoaded(replica_id=self.replica_id, version=self.version, duration_s=0.0))]
        if blob is None:
            raise LookupError(f"no weights payload for version {version} (its handle is gone)")
        if self.mode != ROLLOUT:  # asleep: load on wake
            await self._consume(blob)
            self._pending_weights = (version, blob)
            return []
        t0, arrived = _now(), self._wall()
        await self._stable.acquire()  # a validation in progress finishes on the weights it began with
        self._open.clear()
        try:
            t1 = _now()
            # every stream's samples wait for the load (cut, or paused): it is their progress, bounded
            # by its own command's timeout (run.timeout_s), so their streams beat meanwhile
            with self._streams_wait():
                cut, kept, t2 = await self._swap(version, blob)
        finally:
            self._open.set()
            self._stable.release()
        t3 = _now()
        detail = {"wait_s": t1 - t0, "abort_s": t2 - t1, "load_s": t3 - t2, "arrived_at": arrived}
        if self.weight_update == "keep":
            detail["kept"] = float(kept)
        detail.update(
            {
                f"backend_{k}": float(v)
                for k, v in (getattr(self.backend, "last_load", None) or {}).items()
                if isinstance(v, int | float)
            }
        )
        return [
            self._stamp(
                WeightsLoaded(
                    replica_id=self.replica_id, version=version, duration_s=t3 - t0, interrupted=cut, detail=detail
                )
            )
        ]

    async def _swap(self, version: int, blob: bytes) -> tuple[int, int, float]:
        """The weights swapped, running requests cut first or kept paused; returns how many were
        cut, how many kept, and when the cut was done."""
        if self.weight_update == "keep":
            return 0, await self._swap_in_place(version, blob), _now()
        cut = await self._cut("weights_update")
        t2 = _now()
        await self.backend.load_weights(blob)
        self.version = version
        return cut, 0, t2

    async def _swap_in_place(self, version: int, blob: bytes) -> int:
        """Pause the running requests with their KV cache, swap the weights, let them go on;
        each request's tokens from here on are ``version``'s. Returns how many were kept."""
        made = await getattr(self.backend, "pause")()  # noqa: B009 - optional in the protocol
        try:
            await self.backend.load_weights(blob)
            self.version = version
            for rid in self._running:
                self._marks.setdefault(rid, []).append((int(made.get(rid, 0)), version))
        finally:
            await getattr(self.backend, "resume")(self.version)  # noqa: B009
        return len(self._running)

    async def switch_to_trainer(self, sleep_level: int) -> list[Event]:
        t0 = _now()
        self._evicting = True
        try:
            await self._cut("reclaimed")
            t1 = _now()
            used = self._memory()
            await self.backend.sleep(sleep_level)
            freed = used - self._memory()
            self.mode = TRAINER
        finally:
            self._evicting = False
        t2 = _now()
        return [
            self._stamp(
                ModeChanged(
                    replica_id=self.replica_id,
                    mode=TRAINER,
                    previous=ROLLOUT,
                    duration_s=t2 - t0,
                    detail={
                        "abort_s": t1 - t0,
                        "sleep_s": t2 - t1,
                        "sleep_level": float(sleep_level),
                        "memory_freed_bytes": float(freed),
                    },
                )
            )
        ]

    def _memory(self) -> int:
        """Device memory in use, where the backend can tell (GPU); else 0."""
        fn = getattr(self.backend, "device_memory_used", None)
        return fn() if callable(fn) else 0

    async def switch_to_rollout(self, version: int, blob: bytes | None) -> list[Event]:
        t0 = _now()
        used = self._memory()
        await self.backend.wake_up()
        taken = self._memory() - used
        t1 = _now()
        async with self._weights:
            pending, self._pending_weights = self._pending_weights, None
            sent = blob  # the order's own payload (its bytes may be on their way over a weight group)
            if blob is None and pending is not None:
                version, blob = pending
            if blob is not None and version > self.version:
                await self.backend.load_weights(blob)
                self.version = version
            elif sent is not None:
                await self._consume(sent)
        t2 = _now()
        previous, self.mode = self.mode, ROLLOUT
        return [
            self._stamp(
                ModeChanged(
                    replica_id=self.replica_id,
                    mode=ROLLOUT,
                    previous=previous,
                    duration_s=t2 - t0,
                    detail={
                        "wake_s": t1 - t0,
                        "load_s": t2 - t1,
                        "version": float(self.version),
                        "memory_taken_bytes": float(taken),
                    },
                )
            )
        ]
