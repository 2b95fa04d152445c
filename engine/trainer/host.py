"""``TrainerHost``: turns trainer commands into calls on a trainer core and events back.

Invariant: one command at a time (a lock), in the order the executor sent them (each carries its
turn: Ray does not keep the order of calls to an asyncio actor, ``engine.trainer.in_order``), each
answered by its events — except the weight-
group commands (``JoinWeightGroup`` -> ``WeightGroupOpened``, ``SendWeights`` ->
``WeightsSent``, ``LeaveWeightGroup``), which touch only the published copies and run beside a
training step, so a replica's weight load never waits for one; otherwise — ``Train`` ->
``StepBegin`` + ``StepEnd``; ``Publish`` -> ``WeightsReady`` (the weight blob is returned
beside the events, never inside one; the relays ``Publish.deliver`` names get the version
first, from here, so those replicas load it without waiting on the coordinator);
``OffloadState``/``OnloadState`` -> ``Offloaded``/``Onloaded``; ``SaveCheckpoint`` ->
``TrainerStateSaved``. A ``Train`` whose user loss fails (``UserCodeError``) is answered by
``CommandFailed(user_code=...)`` and the trainer takes the next order as usual. Heavy work
runs in a thread so the host's loop stays live. The core is anything with
``train_step(samples, loss_fn_spec)``, ``publish``, ``offload``, ``onload``, ``step`` and
``version`` (and ``save(path) -> bytes written`` to take part in checkpoints) — the torch
``Trainer`` (plain methods, run in a thread), or a simulator (coroutine methods that spend
virtual time).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

from shunter.engine.io.errors import UserCodeError
from shunter.engine.trainer.in_order import InOrder
from shunter.events import (
    CommandFailed,
    Delivery,
    Event,
    JoinWeightGroup,
    LeaveWeightGroup,
    Offloaded,
    OffloadState,
    Onloaded,
    OnloadState,
    Order,
    Publish,
    SaveCheckpoint,
    SendWeights,
    Stamper,
    StepBegin,
    StepEnd,
    Train,
    TrainerStateSaved,
    WeightGroupOpened,
    WeightsReady,
    WeightsSent,
    tag_of,
)

Deliver = Callable[[int, str, Any, list[Delivery]], None]
"""(version, handle, the published payload, deliveries): see ``TrainerHost``'s ``deliver``."""


def _now() -> float:
    """Durations are measured on the running loop's clock: monotonic in real runs,
    virtual in a simulation (``shunter.bench``)."""
    return asyncio.get_running_loop().time()


class TrainerHost:
    def __init__(
        self,
        core: Any,
        stamp: Stamper,
        *,
        transport: str = "ray_object_store",
        threaded: bool = True,
        deliver: Deliver | None = None,
    ) -> None:
        """``deliver(version, handle, blob, deliveries)``: hands a version just published to the
        relays a ``Publish`` names (``Publish.deliver``), before the host answers ``WeightsReady``."""
        self.core = core
        self.stamp = stamp
        self.transport = transport
        self.threaded = threaded
        self.deliver = deliver
        self._lock = asyncio.Lock()
        self._turns = InOrder()

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        if inspect.iscoroutinefunction(fn):  # a simulated core spends (virtual) time by awaiting
            return await fn(*args)
        return await asyncio.to_thread(fn, *args) if self.threaded else fn(*args)

    async def handle(self, cmd: Order, turn: int = 0) -> tuple[list[Event], bytes | None]:
        """``turn``: the order's number among those its sender numbered (1, 2, ...): it starts
        only after the one before it has ended, whatever order they arrived in (0: as it comes;
        see ``engine.trainer.in_order``)."""
        if isinstance(cmd, JoinWeightGroup | SendWeights | LeaveWeightGroup):
            self._turns.skip(turn)  # beside a step: never waits for one, nor holds one up
            return await self._weight_group(cmd), None
        ordered = await self._turns.take(turn)
        try:
            return await self._handle(cmd)
        finally:
            if ordered:
                self._turns.release(turn)

    async def _handle(self, cmd: Order) -> tuple[list[Event], bytes | None]:
        core = self.core
        async with self._lock:
            t0 = _now()
            match cmd:
                case Train():
                    begin = self.stamp(
                        StepBegin(
                            step=core.step + 1,
                            batch_id=cmd.batch_id,
                            samples=len(cmd.samples),
                            version=core.version,
                            group_ids=sorted({s.group_id for s in cmd.samples}),
                        )
                    )
                    try:
                        metrics = await self._run(core.train_step, cmd.samples, cmd.loss_fn)
                    except UserCodeError as e:  # the user's loss: reported, the trainer stays usable
                        return [
                            self.stamp(
                                CommandFailed(
                                    command_kind=tag_of(cmd),
                                    target="trainer",
                                    error=str(e),
                                    batch_id=cmd.batch_id,
                                    user_code=e.spec,
                                )
                            )
                        ], None
                    return [
                        begin,
                        self.stamp(
                            StepEnd(step=core.step, batch_id=cmd.batch_id, duration_s=_now() - t0, metrics=metrics)
                        ),
                    ], None
                case Publish():
                    p0 = time.perf_counter()  # the parts in real seconds (the loop's clock may tick in ms)
                    blob = await self._run(core.publish)
                    p1 = time.perf_counter()
                    nbytes = getattr(core, "published_nbytes", None) or len(blob)  # a simulator models the size
                    transport = getattr(core, "transport", None) or self.transport
                    handle = f"{transport}:{core.version}"
                    if cmd.deliver and self.deliver is not None:
                        self.deliver(core.version, handle, blob, cmd.deliver)
                    parts = {k: float(v) for k, v in (getattr(core, "last_publish", None) or {}).items()}
                    if parts:  # the hop to the worker thread and back: what the core's own parts leave
                        parts["thread_s"] = max(0.0, p1 - p0 - sum(parts.values()))
                        if cmd.deliver:
                            parts["deliver_s"] = time.perf_counter() - p1
                    return [
                        self.stamp(
                            WeightsReady(
                                version=core.version,
                                handle=handle,
                                transport=transport,
                                nbytes=nbytes,
                                duration_s=_now() - t0,
                                detail=parts,
                            )
                        )
                    ], blob
                case SaveCheckpoint():
                    if not callable(getattr(core, "save", None)):
                        raise TypeError(f"{type(core).__name__} cannot save checkpoints (it has no save(path))")
                    n = await self._run(core.save, cmd.path)
                    return [
                        self.stamp(
                            TrainerStateSaved(
                                step=core.step, version=core.version, path=cmd.path, nbytes=n, duration_s=_now() - t0
                            )
                        )
                    ], None
                case OffloadState() | OnloadState():
                    off = isinstance(cmd, OffloadState)
                    n = await self._run(core.offload if off else core.onload, cmd.parts)
                    cls = Offloaded if off else Onloaded
                    return [self.stamp(cls(parts=cmd.parts, nbytes=n, duration_s=_now() - t0))], None
        raise TypeError(f"the trainer does not take {type(cmd).__name__}")

    async def _weight_group(self, cmd: JoinWeightGroup | SendWeights | LeaveWeightGroup) -> list[Event]:
        """Weight-group commands, one replica each (the executor sends them per replica)."""
        core, (rid,) = self.core, cmd.replica_ids
        t0 = _now()
        match cmd:
            case JoinWeightGroup():
                host, port = core.open_weight_group(rid)
                return [self.stamp(WeightGroupOpened(replica_id=rid, backend=cmd.backend, host=host, port=port))]
            case SendWeights():
                out = await asyncio.to_thread(core.send_weights, rid, cmd.version)
                return [
                    self.stamp(
                        WeightsSent(
                            replica_id=rid,
                            version=cmd.version,
                            nbytes=out["nbytes"],
                            buckets=out["buckets"],
                            duration_s=_now() - t0,
                        )
                    )
                ]
            case _:
                core.drop_weight_group(rid)
                return []
