"""The replicas an ``Engine`` starts while its run goes on: ``add_replica`` (elastic capacity),
``replica_ready``, and the supervision that carries out the coordinator's ``ReplicaRestart``
(a replacement for a replica that died).

``EngineReplicas`` is a mixin of ``shunter.api.Engine`` (``Engine.__init__`` sets the state its
methods use). Invariant: a replacement that cannot even be made is reported to the coordinator
(``ComponentFailed`` naming the replica it was to replace), never dropped in silence; the
replicas still starting are tasks the engine cancels on ``close()``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from shunter.engine.io.errors import EngineSetupError, RunEndedError, describe
from shunter.events import ComponentFailed, ReplicaRestart, ReplicaUp
from shunter.events.vocab import HYBRID, STANDALONE


class EngineReplicas:
    """``Engine``'s replicas added mid-run and the replacements of dead ones (a mixin)."""

    # -- replacing dead replicas ---------------------------------------------------------------
    def _supervise(self) -> None:
        """Carry out the replacements the coordinator's supervisor asks for (``ReplicaRestart``)
        for as long as this attempt runs, whether or not the caller reads ``events()``."""
        if self._supervisor is not None:
            self._supervisor.cancel()
        self._supervisor = asyncio.get_running_loop().create_task(self._supervising(self.coordinator))

    async def _supervising(self, coordinator: Any) -> None:
        pending: set[asyncio.Task[None]] = set()
        try:
            while True:
                try:
                    items, over = await coordinator.restarts.remote(5.0)
                except Exception:  # noqa: BLE001 - the coordinator is gone: its attempt is over
                    return
                for data in items:
                    task = asyncio.get_running_loop().create_task(self._replace(self._codec.decode(data)))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                if over:
                    return
        finally:
            for task in pending:
                task.cancel()

    async def _replace(self, restart: ReplicaRestart) -> None:
        """One replacement: wait out the backoff, then start a replica as ``add_replica`` does;
        one that cannot even be made is reported (``ComponentFailed`` naming the replica it was
        to replace), so the coordinator tries again or gives the slot up."""
        await asyncio.sleep(restart.delay_s)  # the backoff itself, not a synchronisation
        try:
            rid = await self.add_replica(restart.replica_kind, replacing=restart.replica_id)
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
            await self._live().ingest.remote(self._codec.encode_batch([failed]), "engine")
            return
        try:
            await self.replica_ready(rid)
        except EngineSetupError:
            pass  # bring_up told the coordinator (ComponentFailed naming it)

    async def add_replica(self, kind: str = STANDALONE, *, replacing: str = "") -> str:
        """Start one more replica while the run goes on (elastic capacity, or a replacement
        for one that died — it takes the smallest free rank). Returns its id as soon as the
        registry gave it a rank and its actor exists (milliseconds, once the cluster has room
        for it: without room it waits — ``ReplicaPending`` says for what — up to
        ``rollout.replacement_wait_s``, then raises ``EngineSetupError``); the engine starts in the
        background — ``await engine.replica_ready(rid)`` waits for it, and ``ReplicaUp`` in
        ``events()`` says it serves (a standalone replica loads the current weights first). A
        replica that fails to start is reported as ``ComponentFailed`` and by ``replica_ready``.
        ``replacing``: the replica it replaces (the supervisor's replacements name it)."""
        if kind not in (STANDALONE, HYBRID):
            raise ValueError(f"kind must be {STANDALONE!r} or {HYBRID!r}, got {kind!r}")
        self._live()
        if self.ended is not None:
            raise RunEndedError(self.ended)
        rid, h, rank, opening = await self._launch.new_replica(kind, mid_run=True, replacing=replacing)
        await self._live().ingest.remote(self._codec.encode_batch(opening), "engine")  # its rank, at once
        opening = []
        task = asyncio.get_running_loop().create_task(self._launch.bring_up(rid, h, kind, rank, opening))
        self._starting[rid] = task
        return rid

    async def replica_ready(self, replica_id: str) -> ReplicaUp:
        """Wait until a replica added with :meth:`add_replica` is started and announced
        (``EngineSetupError`` if it did not start)."""
        task = self._starting.get(replica_id)
        if task is None:
            raise KeyError(f"{replica_id!r} was not added with add_replica()")
        return await asyncio.shield(task)
