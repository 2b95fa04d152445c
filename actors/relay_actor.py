"""``RelayActor``: one per host that runs a run's replicas — the Ray shell around a ``Relay``.

What it does for the replicas of its host:

- holds their generation streams: the coordinator hands it a turn's ``Generate`` orders in one
  call (:meth:`run`) instead of one call per prompt group; the streams, their silence bound
  (``rollout.generate_timeout_s``) and the death of a replica under them are this actor's
  (its own executor, of the class it is given: the coordinator's ``RayExecutor``, the same code
  the coordinator's process runs), and come back as facts (``ReplicaDown``, ``CommandFailed``);
- folds their per-sample facts into ``RelayReport``s (``engine.coordinator.relay.Relay``) and streams them
  to the coordinator (:meth:`reports`), each message encoded once here — the coordinator's
  event log writes these bytes as they came;
- takes new weights from the trainer (:meth:`install`, ``Publish.deliver``) and gives each of
  its replicas an ``InstallWeights``, so a publish costs the trainer one call per host.

Invariants: it never decides anything (the coordinator does); every order it is handed is
answered through :meth:`reports` (its facts, or a failure naming the replica); it is pinned to
its host (node affinity, not soft) and named ``shunter.<run_id>.relay.<node>.<n>``; when it
dies the coordinator takes every replica behind it as down (they resume elsewhere), and a
replica placed on its host later gets a new relay.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import ray

from shunter.actors.wire import codec
from shunter.engine.coordinator.relay import Relay
from shunter.events import Generate, InstallWeights, Message, Stamper


class RelayActor:
    def __init__(
        self,
        run_id: str,
        name: str,
        *,
        window_s: float,
        max_events: int,
        timeout_s: float,
        generate_timeout_s: float,
        executor_class: Callable[..., Any],
    ) -> None:
        """``executor_class``: what carries this relay's calls to its replicas (``RayExecutor``,
        made here for replicas only: no trainer, no relay actors of its own)."""
        self.run_id, self.name = run_id, name
        self.executor_class = executor_class
        self.window_s, self.max_events = window_s, max_events
        self.timeout_s, self.generate_timeout_s = timeout_s, generate_timeout_s
        self.executor: Any = None
        self._out: asyncio.Queue[bytes] | None = None
        self._done = 0  # Generate calls finished since the last report batch
        self._wake: asyncio.Event | None = None

    def _ready(self) -> Any:
        """Built on first use, on the actor's event loop (asyncio objects belong to it)."""
        if self.executor is None:
            self._out, self._wake = asyncio.Queue(), asyncio.Event()
            ex = self.executor_class(
                self.run_id,
                None,
                {},
                timeout_s=self.timeout_s,
                generate_timeout_s=self.generate_timeout_s,
            )
            ex.relay = Relay(
                self.name,
                self._post,
                Stamper(self.run_id, self.name),
                window_s=self.window_s,
                max_events=self.max_events,
            )
            ex.bind(self._post)
            self.executor = ex
        return self.executor

    def _post(self, msgs: list[Message]) -> None:
        assert self._out is not None and self._wake is not None
        c = codec()
        for m in msgs:
            self._out.put_nowait(c.encode(m))
        self._wake.set()

    def _finished(self, _task: asyncio.Task[None]) -> None:
        assert self._wake is not None
        self._done += 1
        self._wake.set()

    async def reports(self) -> AsyncIterator[tuple[list[bytes], int]]:
        """What the replicas behind this relay did, as it comes: (encoded messages, Generate
        calls finished since the last item). One long call: the coordinator's executor holds it
        open for the run, and its failure is this relay's death."""
        self._ready()
        assert self._out is not None and self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            out: list[bytes] = []
            while not self._out.empty():
                out.append(self._out.get_nowait())
            done, self._done = self._done, 0
            if out or done:
                yield out, done

    def add(self, replica_id: str, handle: Any) -> None:
        """A replica of this host: its orders and answers go through here from now on."""
        self._ready().serve(replica_id, handle)

    def run(self, targets: list[str], data: bytes, handles: dict[str, Any] | None = None) -> None:
        """A turn's ``Generate`` orders for this host's replicas (``targets[i]`` takes order ``i``);
        ``handles``: replicas among them this relay may not know yet (Ray runs an async actor's
        calls in any order, so an ``add`` may come after)."""
        ex = self._ready()
        for rid, h in (handles or {}).items():
            if rid not in ex.replicas:
                self.add(rid, h)
        for target, order in zip(targets, codec().decode_batch(data), strict=True):
            task = ex.send(target, order)
            if isinstance(order, Generate) and task is not None:
                task.add_done_callback(self._finished)

    def install(self, version: int, handle: str, payload: list[Any], replica_ids: list[str]) -> None:
        """New weights from the trainer (``Publish.deliver``): each replica named gets an
        ``InstallWeights``; ``payload`` holds the published blob's ObjectRef (in a list, so Ray
        passes the reference on instead of fetching the blob here)."""
        ex = self._ready()
        if payload:
            ex.keep_weights(handle, payload[0])
        for rid in replica_ids:
            ex.send(rid, InstallWeights(version=version, handle=handle))

    async def close(self) -> None:
        if self.executor is not None:
            await self.executor.close()

    async def where(self) -> dict:
        from shunter.actors.launch.placement import where

        return where()


def remote_class() -> Any:
    return ray.remote(num_cpus=0, max_restarts=0)(RelayActor)
