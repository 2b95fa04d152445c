"""The weight groups of a ``RayExecutor`` (its part, collective transports ``nccl`` / ``gloo``):
which replicas take their weights over a group, the join (once per replica life), and each load
as a command pair — the replica's half beside the trainer's ``SendWeights``.

``WeightGroups`` is a mixin of ``shunter.actors.executor.RayExecutor`` (``RayExecutor.__init__``
sets the state its methods use). Invariants: the loads of one replica go out one at a time, so
both sides see them in one order; a version the group already carried goes without a send, so
every broadcast has its receiver; both halves are bounded, and a failed half drops the group
(the next load joins a new one) and becomes an event, never a hang.
"""

from __future__ import annotations

import asyncio

from shunter.actors.wire import codec, root_cause
from shunter.engine.coordinator.executor import TRAINER
from shunter.events import (
    CommandFailed,
    EnterRollout,
    InstallWeights,
    JoinWeightGroup,
    LeaveWeightGroup,
    SendWeights,
    WeightGroupOpened,
    tag_of,
)
from shunter.events.vocab import STANDALONE


class WeightGroups:
    """``RayExecutor``'s weight groups (a mixin)."""

    # -- weight groups (collective transports) ----------------------------------------------
    def _grouped(self, replica_id: str) -> bool:
        """Whether weights reach this replica over a weight group: every replica under gloo;
        under nccl those on another GPU than the trainer (a replica on the trainer's GPU maps
        its IPC handles — NCCL cannot put two ranks on one GPU). Without placement facts:
        the standalone ones."""
        if not self.weight_group:
            return False
        if self.weight_group == "gloo":
            return True
        mine, trainer = self.places.get(replica_id), self.places.get(TRAINER)
        if mine and trainer and mine[1] and trainer[1]:
            return mine != trainer
        return self.kinds.get(replica_id) == STANDALONE

    async def _ask(self, target: str, cmd, timeout: float) -> list:
        if target == TRAINER:
            out, *_ = await asyncio.wait_for(self.trainer.control.remote(codec().encode(cmd)), timeout)
        else:
            out = await asyncio.wait_for(self.replicas[target].control.remote(codec().encode(cmd), None), timeout)
        events = codec().decode_batch(out)
        self._deliver(events)
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
        join = JoinWeightGroup(replica_ids=[replica_id], backend=self.weight_group, timeout_s=self.group_timeout_s)
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
        cmd = SendWeights(replica_ids=[replica_id], version=_version(handle), handle=handle)
        try:
            await self._ask(TRAINER, cmd, self.group_timeout_s + self.timeout_s)
            return True
        except Exception as e:  # noqa: BLE001 - every failure becomes an event; the next load joins anew
            self._drop_group(replica_id)
            self._emit(
                [CommandFailed(command_kind=tag_of(cmd), target=TRAINER, error=f"to {replica_id}: {root_cause(e)}")]
            )
            return False

    async def _grouped_load(self, replica_id: str, cmd: InstallWeights | EnterRollout, call) -> bytes:
        """A load over the replica's group: the replica's half (``call``) beside the trainer's
        send, unless the group already carried this version. One at a time per replica, so
        both sides see the loads in one order; a failed half drops the group."""
        async with self._loading.setdefault(replica_id, asyncio.Lock()):
            await self._join(replica_id)
            version = _version(cmd.handle)
            fresh = self._carried.get(replica_id) != version
            send = asyncio.ensure_future(self._send(replica_id, cmd.handle)) if fresh else None
            try:
                out = await call()
            except BaseException:
                self._drop_group(replica_id)
                raise
            finally:
                sent = await send if send is not None else True
            if sent and replica_id in self._joins:
                self._carried[replica_id] = version
            return out

    def _drop_group(self, replica_id: str) -> None:
        """Forget the replica's group here (the next load joins a new one)."""
        self._joins.pop(replica_id, None)
        self._carried.pop(replica_id, None)

    def _leave(self, replica_id: str) -> None:
        self._carried.pop(replica_id, None)
        if self._joins.pop(replica_id, None) is not None:
            cmd = LeaveWeightGroup(replica_ids=[replica_id])
            self.trainer.control.remote(codec().encode(cmd))  # best effort: the trainer aborts that group


def _version(handle: str) -> int:
    try:
        return int(handle.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return -1
