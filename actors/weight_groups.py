"""The weight groups of a ``RayExecutor`` (collective transports ``nccl`` / ``gloo``): which
replicas take their weights over a group, the join (once per replica life), and each load as a
command pair — the replica's half beside the trainer's ``SendWeights``.

``WeightGroups`` is a part of ``shunter.actors.ray_executor.RayExecutor``, given the trainer's and
the replicas' handles (the executor's replica table), the placement facts (``ComponentPlaced``'s
places, ``ReplicaUp``'s kinds), the bounds, and two callbacks: ``deliver`` (the events the
trainer or a replica answered) and ``emit`` (the executor's own facts). Invariants: the loads of
one replica go out one at a time, so both sides see them in one order; a version the group
already carried goes without a send, so every broadcast has its receiver; both halves are
bounded, and a failed half drops the group (the next load joins a new one) and becomes an event,
never a hang.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from shunter.actors.wire import codec, root_cause
from shunter.engine.coordinator.executor import TRAINER
from shunter.events import (
    CommandFailed,
    EnterRollout,
    Event,
    InstallWeights,
    JoinWeightGroup,
    LeaveWeightGroup,
    Message,
    Order,
    SendWeights,
    WeightGroupOpened,
    tag_of,
)
from shunter.events.vocab import STANDALONE


class WeightGroups:
    """``RayExecutor``'s weight groups (``backend``: "nccl", "gloo", or "" for none)."""

    def __init__(
        self,
        backend: str,
        trainer: Any,
        replicas: dict[str, Any],
        *,
        places: dict[str, tuple[str, tuple[str, ...]]],
        kinds: dict[str, str],
        timeout_s: float,
        group_timeout_s: float,
        deliver: Callable[[list[Message]], None],
        emit: Callable[[list[Event]], None],
    ) -> None:
        self.backend = backend
        self.trainer, self.replicas = trainer, replicas
        self.places, self.kinds = places, kinds
        self.timeout_s, self.group_timeout_s = timeout_s, group_timeout_s
        self.deliver, self.emit = deliver, emit
        self._joins: dict[str, asyncio.Future[None]] = {}  # replica id -> its weight-group join
        self._carried: dict[str, int] = {}  # replica id -> the last version its current group carried
        self._loading: dict[str, asyncio.Lock] = {}  # replica id -> held while a load's pair is out

    def grouped(self, replica_id: str) -> bool:
        """Whether weights reach this replica over a weight group: every replica under gloo;
        under nccl those on another GPU than the trainer (a replica on the trainer's GPU maps
        its IPC handles — NCCL cannot put two ranks on one GPU). Without placement facts:
        the standalone ones."""
        if not self.backend:
            return False
        if self.backend == "gloo":
            return True
        mine, trainer = self.places.get(replica_id), self.places.get(TRAINER)
        if mine and trainer and mine[1] and trainer[1]:
            return mine != trainer
        return self.kinds.get(replica_id) == STANDALONE

    async def _ask(self, target: str, cmd: Order, timeout: float) -> list[Message]:
        if target == TRAINER:
            out, *_ = await asyncio.wait_for(self.trainer.control.remote(codec().encode(cmd)), timeout)
        else:
            out = await asyncio.wait_for(self.replicas[target].control.remote(codec().encode(cmd), None), timeout)
        events = codec().decode_batch(out)
        self.deliver(events)
        return events

    async def _join(self, replica_id: str) -> None:
        """The replica's weight group, joined once per replica life (concurrent loads share it)."""
        fut = self._joins.get(replica_id)
        if fut is None:
            self._carried.pop(replica_id, None)  # a new group has carried nothing
            fut = self._joins[replica_id] = asyncio.ensure_future(self._do_join(replica_id))
        try:
            await asyncio.shield(fut)
        except BaseException:
            if self._joins.get(replica_id) is fut:
                del self._joins[replica_id]
            raise

    async def _do_join(self, replica_id: str) -> None:
        bound = self.group_timeout_s + self.timeout_s
        join = JoinWeightGroup(replica_ids=[replica_id], backend=self.backend, timeout_s=self.group_timeout_s)
        opened = [e for e in await self._ask(TRAINER, join, self.timeout_s) if isinstance(e, WeightGroupOpened)]
        if not opened:
            raise RuntimeError(f"the trainer opened no weight group for {replica_id}")
        o = opened[0]
        await self._ask(
            replica_id,
            JoinWeightGroup(
                replica_ids=[replica_id], backend=o.backend, host=o.host, port=o.port, timeout_s=self.group_timeout_s
            ),
            bound,
        )

    async def _send(self, replica_id: str, handle: str) -> bool:
        """The trainer's half of a weight load over a group; failures become events."""
        cmd = SendWeights(replica_ids=[replica_id], version=handle_version(handle), handle=handle)
        try:
            await self._ask(TRAINER, cmd, self.group_timeout_s + self.timeout_s)
            return True
        except Exception as e:  # noqa: BLE001 - every failure becomes an event; the next load joins anew
            self.drop(replica_id)
            self.emit(
                [CommandFailed(command_kind=tag_of(cmd), target=TRAINER, error=f"to {replica_id}: {root_cause(e)}")]
            )
            return False

    async def load(
        self, replica_id: str, cmd: InstallWeights | EnterRollout, call: Callable[[], Awaitable[bytes]]
    ) -> bytes:
        """A load over the replica's group: the replica's half (``call``) beside the trainer's
        send, unless the group already carried this version. One at a time per replica, so
        both sides see the loads in one order; a failed half drops the group."""
        async with self._loading.setdefault(replica_id, asyncio.Lock()):
            await self._join(replica_id)
            version = handle_version(cmd.handle)
            fresh = self._carried.get(replica_id) != version
            send = asyncio.ensure_future(self._send(replica_id, cmd.handle)) if fresh else None
            try:
                out = await call()
            except BaseException:
                self.drop(replica_id)
                raise
            finally:
                sent = await send if send is not None else True
            if sent and replica_id in self._joins:
                self._carried[replica_id] = version
            return out

    def drop(self, replica_id: str) -> None:
        """Forget the replica's group here (the next load joins a new one)."""
        self._joins.pop(replica_id, None)
        self._carried.pop(replica_id, None)

    def leave(self, replica_id: str) -> None:
        self._carried.pop(replica_id, None)
        if self._joins.pop(replica_id, None) is not None:
            cmd = LeaveWeightGroup(replica_ids=[replica_id])
            self.trainer.control.remote(codec().encode(cmd))  # best effort: the trainer aborts that group


def handle_version(handle: str) -> int:
    """The version a published blob's handle names (``TrainerHost``: ``<transport>:<version>``); -1: none."""
    try:
        return int(handle.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return -1
