"""``MidRunReplicas``: the replicas an ``Engine`` starts while its run goes on — ``add_replica``
(elastic capacity), ``replica_ready``, and the supervision that carries out the coordinator's
``ReplicaRestart`` (a replacement for a replica that died).

``Engine`` makes it with its ``RunLink`` (the live coordinator, the run's end), its codec and the
run's id; each call that makes a replica is given the engine's ``Launcher``. Invariant: a
replacement that cannot even be made is reported to the coordinator (``ComponentFailed`` naming
the replica it was to replace), never dropped in silence; the replicas still starting, and the
supervision, are tasks the engine cancels on ``close()`` (``cancel``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from shunter.api_link import RunLink
from shunter.engine.io.errors import EngineSetupError, RunEndedError, describe
from shunter.events import Codec, ComponentFailed, ReplicaRestart, ReplicaUp
from shunter.events.vocab import HYBRID, STANDALONE


class MidRunReplicas:
    def __init__(self, link: RunLink, codec: Codec, run_id: str) -> None:
        self.link, self.codec, self.run_id = link, codec, run_id
        self.starting: dict[str, asyncio.Task[ReplicaUp]] = {}  # replicas added mid-run, until they serve
        self.supervisor: asyncio.Task[None] | None = None  # carries out ReplicaRestart

    # -- replacing dead replicas ---------------------------------------------------------------
    def supervise(self, launcher: Any) -> None:
        """Carry out the replacements the coordinator's supervisor asks for (``ReplicaRestart``)
        for as long as this attempt runs, whether or not the caller reads ``events()``;
        ``launcher``: the engine's ``Launcher``, which makes the replacements."""
        if self.supervisor is not None:
            self.supervisor.cancel()
        self.supervisor = asyncio.get_running_loop().create_task(self._supervising(self.link.coordinator, launcher))

    async def _supervising(self, coordinator: Any, launcher: Any) -> None:
        pending: set[asyncio.Task[None]] = set()
        try:
            while True:
                try:
                    items, over = await coordinator.restarts.remote(5.0)
                except Exception:  # noqa: BLE001 - the coordinator is gone: its attempt is over
                    return
                for data in items:
                    task = asyncio.get_running_loop().create_task(self._replace(self.codec.decode(data), launcher))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                if over:
                    return
        finally:
            for task in pending:
                task.cancel()

    async def _replace(self, restart: ReplicaRestart, launcher: Any) -> None:
        """One replacement: wait out the backoff, then start a replica as ``add`` does;
        one that cannot even be made is reported (``ComponentFailed`` naming the replica it was
        to replace), so the coordinator tries again or gives the slot up."""
        await asyncio.sleep(restart.delay_s)  # the backoff itself, not a synchronisation
        try:
            rid = await self.add(launcher, restart.replica_kind, replacing=restart.replica_id)
        except RunEndedError:
            return
        except Exception as e:  # noqa: BLE001 - it could not even be made (no room, no registry): say so
            failed = ComponentFailed(
                component=restart.replica_id,
                error=describe(e),
                run_id=self.run_id,
                source="engine",
                wall_time=time.time(),
            )
            await self.link.live().ingest.remote(self.codec.encode_batch([failed]), "engine")
            return
        try:
            await self.ready(rid)
        except EngineSetupError:
            pass  # bring_up told the coordinator (ComponentFailed naming it)

    # -- adding replicas ------------------------------------------------------------------------
    async def add(self, launcher: Any, kind: str = STANDALONE, *, replacing: str = "") -> str:
        """``Engine.add_replica``: the replica registered and its actor made by ``launcher``, its
        start a task until it serves."""
        if kind not in (STANDALONE, HYBRID):
            raise ValueError(f"kind must be {STANDALONE!r} or {HYBRID!r}, got {kind!r}")
        self.link.live()
        if self.link.ended is not None:
            raise RunEndedError(self.link.ended)
        rid, h, rank, opening = await launcher.new_replica(kind, mid_run=True, replacing=replacing)
        await self.link.live().ingest.remote(self.codec.encode_batch(opening), "engine")  # its rank, at once
        opening = []
        task = asyncio.get_running_loop().create_task(launcher.bring_up(rid, h, kind, rank, opening))
        self.starting[rid] = task
        return rid

    async def ready(self, replica_id: str) -> ReplicaUp:
        """``Engine.replica_ready``: the replica added with ``add`` started and announced."""
        task = self.starting.get(replica_id)
        if task is None:
            raise KeyError(f"{replica_id!r} was not added with add_replica()")
        return await asyncio.shield(task)

    async def cancel(self) -> None:
        """At the engine's close: the supervision stops, and the replicas still starting are
        cancelled (awaited until they are)."""
        if self.supervisor is not None:
            self.supervisor.cancel()
        for task in self.starting.values():
            task.cancel()
        await asyncio.gather(*self.starting.values(), return_exceptions=True)
