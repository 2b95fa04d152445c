"""``WeightsAndModes``: one replica's weight loads and serving-mode switches. ``RolloutCore``
holds it and hands ``load_weights`` / ``switch_to_trainer`` / ``switch_to_rollout`` orders to
it; it is given the replica's id, backend and stamper, its ``weight_update`` setting, the
serving state it writes (``serving.Serving``: version, mode, the open gate, evicting, and the
lock a validation holds), the running requests it cuts or marks (``running.RunningRequests``)
and the open generation streams, which beat while their samples wait on a load
(``heartbeat.OpenStreams``).

Invariants:

- one weight load at a time, in arrival order (``_weights``), and none under a validation
  (``serving.stable``), so a held-out score is one version's;
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

from shunter.engine.replica.backend import Backend
from shunter.engine.replica.clock import now
from shunter.engine.replica.heartbeat import OpenStreams
from shunter.engine.replica.running import RunningRequests
from shunter.engine.replica.serving import Serving
from shunter.events import Event, ModeChanged, Stamper, WeightsLoaded
from shunter.events.vocab import ROLLOUT, TRAINER, WeightUpdate


class WeightsAndModes:
    def __init__(
        self,
        replica_id: str,
        backend: Backend,
        stamp: Stamper,
        weight_update: WeightUpdate,
        serving: Serving,
        requests: RunningRequests,
        streams: OpenStreams,
    ) -> None:
        pause = getattr(backend, "pause", None)
        if weight_update == "keep" and not (callable(pause) and getattr(backend, "keeps_kv", True)):
            raise TypeError(
                f"rollout.weight_update = 'keep' needs a backend that can pause its requests with their KV "
                f"cache; {type(backend).__name__} cannot (use 'abort')"
            )
        self.replica_id = replica_id
        self.backend = backend
        self.stamp = stamp
        self.weight_update = weight_update
        self.serving = serving
        self.requests = requests
        self.streams = streams
        self._pending_weights: tuple[int, bytes] | None = None
        self._weights = asyncio.Lock()  # one weight load at a time, in arrival order (a group's bytes too)

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
        if version <= self.serving.version:
            await self._consume(blob)
            return [self.stamp(WeightsLoaded(replica_id=self.replica_id, version=self.serving.version, duration_s=0.0))]
        if blob is None:
            raise LookupError(f"no weights payload for version {version} (its handle is gone)")
        if self.serving.mode != ROLLOUT:  # asleep: load on wake
            await self._consume(blob)
            self._pending_weights = (version, blob)
            return []
        t0, arrived = now(), self.stamp.clock()
        await self.serving.stable.acquire()  # a validation in progress finishes on the weights it began with
        self.serving.open.clear()
        try:
            t1 = now()
            # every stream's samples wait for the load (cut, or paused): it is their progress, bounded
            # by its own command's timeout (run.timeout_s), so their streams beat meanwhile
            with self.streams.waiting():
                cut, kept, t2 = await self._swap(version, blob)
        finally:
            self.serving.open.set()
            self.serving.stable.release()
        t3 = now()
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
            self.stamp(
                WeightsLoaded(
                    replica_id=self.replica_id, version=version, duration_s=t3 - t0, interrupted=cut, detail=detail
                )
            )
        ]

    async def _swap(self, version: int, blob: bytes) -> tuple[int, int, float]:
        """The weights swapped, running requests cut first or kept paused; returns how many were
        cut, how many kept, and when the cut was done."""
        if self.weight_update == "keep":
            return 0, await self._swap_in_place(version, blob), now()
        cut = await self.requests.cut("weights_update")
        t2 = now()
        await self.backend.load_weights(blob)
        self.serving.version = version
        return cut, 0, t2

    async def _swap_in_place(self, version: int, blob: bytes) -> int:
        """Pause the running requests with their KV cache, swap the weights, let them go on;
        each request's tokens from here on are ``version``'s. Returns how many were kept."""
        made = await getattr(self.backend, "pause")()  # noqa: B009 - optional in the protocol
        try:
            await self.backend.load_weights(blob)
            self.serving.version = version
            self.requests.mark(made, version)
        finally:
            await getattr(self.backend, "resume")(self.serving.version)  # noqa: B009
        return self.requests.count()

    async def switch_to_trainer(self, sleep_level: int) -> list[Event]:
        t0 = now()
        self.serving.evicting = True
        try:
            await self.requests.cut("reclaimed")
            t1 = now()
            used = self._memory()
            await self.backend.sleep(sleep_level)
            freed = used - self._memory()
            self.serving.mode = TRAINER
        finally:
            self.serving.evicting = False
        t2 = now()
        return [
            self.stamp(
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
        t0 = now()
        used = self._memory()
        await self.backend.wake_up()
        taken = self._memory() - used
        t1 = now()
        async with self._weights:
            pending, self._pending_weights = self._pending_weights, None
            sent = blob  # the order's own payload (its bytes may be on their way over a weight group)
            if blob is None and pending is not None:
                version, blob = pending
            if blob is not None and version > self.serving.version:
                await self.backend.load_weights(blob)
                self.serving.version = version
            elif sent is not None:
                await self._consume(sent)
        t2 = now()
        previous, self.serving.mode = self.serving.mode, ROLLOUT
        return [
            self.stamp(
                ModeChanged(
                    replica_id=self.replica_id,
                    mode=ROLLOUT,
                    previous=previous,
                    duration_s=t2 - t0,
                    detail={
                        "wake_s": t1 - t0,
                        "load_s": t2 - t1,
                        "version": float(self.serving.version),
                        "memory_taken_bytes": float(taken),
                    },
                )
            )
        ]
