"""``CoordinatorActor``: the Ray shell around ``Coordinator``.

Invariant: the only way in is bytes decoded by type (``ingest`` for events, ``submit`` for
intents, answered with the coordinator's verdict); bytes that do not decode, and orders (only
the coordinator gives those), become an ``EventRejected`` event and are dropped, and the loop
goes on. Everything the loop handles is
written to the run's event log, logs and metrics, and kept in a feed the ``Engine`` facade
reads; if the loop ends — however it ends — ``fetch`` hands out its ``RunEnded``, so a reader
never polls a dead run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from shunter.actors.ray_executor import RayExecutor
from shunter.actors.wire import codec
from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.coordinator.assemble import build_coordinator
from shunter.engine.coordinator.relay import Relay
from shunter.engine.data.datasets import Dataset
from shunter.engine.io.errors import bounded, describe
from shunter.engine.io.records import RunSinks
from shunter.events import (
    BatchReady,
    CommandFailed,
    ComponentPlaced,
    Event,
    EventRejected,
    Intent,
    IntentRejected,
    LogRepaired,
    Message,
    PromptSpec,
    PublishWeights,
    ReplicaDown,
    ReplicaRestart,
    ReplicaUp,
    RunEnded,
    Stamper,
    StepEnd,
    Stop,
    TrainBatch,
    WeightsReady,
    tag_of,
)
from shunter.policies.registry import use_import_paths


class Waiters:
    """Futures resolved by the first handled message matching a predicate."""

    def __init__(self) -> None:
        self._w: list[tuple[Callable[[Message], bool], asyncio.Future]] = []

    def __call__(self, msg: Message) -> None:
        keep = []
        for pred, fut in self._w:
            if not fut.done() and pred(msg):
                fut.set_result(msg)
            elif not fut.done():
                keep.append((pred, fut))
        self._w = keep

    def wait_for(self, pred: Callable[[Message], bool]) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self._w.append((pred, fut))
        return fut


class CoordinatorActor:
    def __init__(
        self,
        cfg: bytes,
        run_id: str,
        trainer,
        replicas: dict,
        out_dir: str,
        registry=None,
        *,
        resume: str = "",
        attempt: int = 0,
        reason: str = "",
        skipped: dict[str, str] | None = None,
        data: tuple[Dataset, list[PromptSpec]] | None = None,
    ) -> None:
        self.cfg = msgspec.msgpack.decode(cfg, type=EngineConfig)
        use_import_paths(self.cfg.run.import_paths)
        self.run_id = run_id
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        wt, ro = self.cfg.trainer.weight_transport, self.cfg.rollout
        self.executor = RayExecutor(
            run_id,
            trainer,
            replicas,
            timeout_s=self.cfg.run.timeout_s,
            generate_timeout_s=ro.generate_timeout_s,
            weight_group=wt if wt in ("nccl", "gloo") else "",
            group_timeout_s=self.cfg.trainer.weight_group_timeout_s,
            relays=(
                {
                    "window_s": ro.report_window_s,
                    "max_events": ro.report_max_events,
                    "timeout_s": self.cfg.run.timeout_s,
                    "generate_timeout_s": ro.generate_timeout_s,
                }
                if self.cfg.run.relays != "none"
                else None
            ),
            relay_here=self.cfg.run.relays == "all",
            direct_weights=self.cfg.run.direct_weights,
        )
        self.executor.relay = Relay(  # the replicas whose streams this process holds: folded here
            "local",
            self.executor.post_through_relay,
            Stamper(run_id, "relay:local"),
            window_s=self.cfg.rollout.report_window_s,
            max_events=self.cfg.rollout.report_max_events,
        )
        self.waiters = Waiters()
        self.last_ready: WeightsReady | None = None
        self.sinks = RunSinks.open(self.out, extra=lambda: self.core.guard.metrics())
        self.log, self.metrics, self.feed = self.sinks.log, self.sinks.metrics, self.sinks.feed
        self.executor.known = self.log.remember  # a relay's report is logged as the bytes it came in
        self.user = Stamper(run_id, "user")
        self.core = build_coordinator(
            self.cfg,
            self.executor,
            run_id=run_id,
            data=data,
            sinks=[*self.sinks, self.waiters, self._release_dead, self._remember],
            checkpoints=self.out / "checkpoints" if self.cfg.run.checkpoint_every > 0 else None,
            resume=resume or None,  # a checkpoint folder, already verified by the Engine
            attempt=attempt,
            reason=reason,
            skipped=skipped,
        )
        self.registry = registry
        self._task: asyncio.Task | None = None
        self._restarts: list[bytes] = []
        self._restart_posted = asyncio.Event()

    def _remember(self, msg: Message) -> None:
        if isinstance(msg, WeightsReady):
            self.last_ready = msg
        elif isinstance(msg, ReplicaRestart):
            self._restarts.append(codec().encode(msg))
            self._restart_posted.set()

    def _release_dead(self, msg: Message) -> None:
        """A replica that is down is killed if it still lives (it holds CPUs / GPUs a replacement
        needs) and gives its rank back to the registry (RankReleased)."""
        if isinstance(msg, ReplicaDown):
            self.executor.retire(msg.replica_id)
            if self.registry is not None:
                asyncio.get_running_loop().create_task(self._release(msg.replica_id, msg.reason))

    async def _release(self, replica_id: str, reason: str) -> None:
        try:
            self.ingest(await self.registry.release.remote(replica_id, reason), "registry")
        except Exception as e:  # noqa: BLE001 - report, never crash the loop
            self.core.post(
                self.core.stamp(CommandFailed(command_kind="registry.release", target="registry", error=describe(e)))
            )

    async def start(self, initial: bytes) -> None:
        """Post the replicas' opening events (ReplicaUp, RankAssigned ...) and start the loop."""
        self.ingest(initial, "engine")
        self.executor.watch_all()
        if (fix := self.log.repaired) is not None:
            self.core.post(
                self.core.stamp(
                    LogRepaired(
                        path=str(fix.path),
                        kept_as=str(fix.kept_as),
                        frames=fix.frames,
                        whole=fix.whole,
                        damage=[bounded(d.describe(fix.path), 400) for d in fix.damage[:20]],
                    )
                )
            )
        self._task = asyncio.get_running_loop().create_task(self.core.run())

    def add_replica(self, replica_id: str, handle, opening: bytes) -> int:
        """A replica started during the run: route orders to it, then announce it."""
        self.executor.add_replica(replica_id, handle)
        return self.ingest(opening, "engine")

    def ingest(self, data: bytes, origin: str) -> int:
        try:
            msgs = codec().decode_batch(data)
        except msgspec.MsgspecError as e:
            self.core.post(self.core.stamp(EventRejected(origin=origin, error=describe(e), nbytes=len(data))))
            return 0
        for m in msgs:
            if isinstance(m, ReplicaUp):
                self.executor.kinds[m.replica_id] = m.replica_kind
            elif isinstance(m, ComponentPlaced):
                self.executor.places[m.component] = (m.node, tuple(m.gpu_ids))
                self.executor.place(m.component, m.node_id)
            self.core.post(m if isinstance(m, Event) else self.user(m))
        return len(msgs)

    async def submit(self, data: bytes) -> bytes:
        """An intent from the user (``Engine.submit``), answered once the loop has handled it
        (``Coordinator.submit``): the intent as carried out, its ``IntentRejected``, or the run's
        ``RunEnded``. Bytes that are not an intent become an ``EventRejected``, which is the answer."""
        if self.core.ended is not None:
            return codec().encode(self.core.ended)
        try:
            msg = codec().decode(data)
            if not isinstance(msg, Intent):
                raise TypeError(f"submit() takes intents, got {msg.role} {type(msg).__name__}")
        except (msgspec.MsgspecError, TypeError) as e:
            rejected = self.core.stamp(EventRejected(origin="user", error=describe(e), nbytes=len(data)))
            self.core.post(rejected)
            return codec().encode(rejected)
        verdict = self.core.submit(self.user(msg))
        waits: list[asyncio.Future] = [verdict] + ([self._task] if self._task is not None else [])
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if not verdict.done():  # the loop ended without its RunEnded reaching the coordinator's end()
            verdict.cancel()
            return codec().encode(self._result())
        return codec().encode(verdict.result())

    async def fetch(self, cursor: int, max_n: int = 4096, wait_s: float = 1.0) -> tuple[list[bytes], int, int]:
        items, cursor, missed = await self.feed.read(cursor, max_n, wait_s)
        if not items and self._task is not None and self._task.done() and not self.feed.ended:
            items = [codec().encode(self._result())]  # the loop ended without its RunEnded reaching the feed
        return items, cursor, missed

    def _result(self) -> RunEnded:
        assert self._task is not None and self._task.done()
        if self._task.cancelled():
            return RunEnded(reason="error", error="the coordinator's loop was cancelled", run_id=self.run_id)
        exc = self._task.exception()
        if exc is not None:
            return RunEnded(reason="error", error=f"the coordinator's loop died: {describe(exc)}", run_id=self.run_id)
        return self._task.result()

    async def restarts(self, wait_s: float = 5.0) -> tuple[list[bytes], bool]:
        """The replacements asked for since the last call (encoded ``ReplicaRestart``), waiting
        up to ``wait_s`` for one; and whether the run is over (the Engine's supervisor stops)."""
        if not self._restarts and self.core.ended is None:
            self._restart_posted.clear()
            try:
                await asyncio.wait_for(self._restart_posted.wait(), wait_s)
            except TimeoutError:
                pass
        out, self._restarts = self._restarts, []
        return out, self.core.ended is not None

    async def wait_ended(self) -> bytes:
        if self._task is None:
            raise RuntimeError("the run was not started")
        await asyncio.wait([self._task])
        return codec().encode(self._result())

    async def stop(self, reason: str = "stopped") -> bytes:
        if self.core.ended is None:
            self.core.post(self.user(Stop(reason=reason)))
        return await self.wait_ended()

    # -- user-driven training ----------------------------------------------------------
    async def next_batch(self, timeout_s: float) -> tuple[bytes | None, str]:
        """The next ready mini-batch (an encoded ``Batch``), or None and why there is none."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            batch = self.core.take_batch()
            if batch is not None:
                return codec().encode(batch), ""
            left = deadline - loop.time()
            if self.core.ended is not None or left <= 0:
                return None, self.core.why_no_batch()
            fut = self.waiters.wait_for(lambda m: isinstance(m, BatchReady | RunEnded))
            try:
                await asyncio.wait_for(fut, left)
            except TimeoutError:
                pass

    async def train(self, data: bytes) -> bytes:
        """Train a batch the user took; the answer is ``StepEnd``, or why not (``IntentRejected``,
        ``CommandFailed`` from the user's loss, ``RunEnded``)."""
        intent = self.user(codec().decode(data))
        if not isinstance(intent, TrainBatch):
            raise TypeError(f"train() takes trainer.train_batch, got {tag_of(intent)}")
        if self.core.ended is not None:  # nothing would ever answer
            return codec().encode(self.core.ended)
        k = intent.batch_id
        done = self.waiters.wait_for(
            lambda m: (
                (isinstance(m, StepEnd) and m.batch_id == k)
                or _answers(m, intent)
                or (isinstance(m, CommandFailed) and m.target == "trainer" and m.batch_id == k)
            )
        )
        self.core.post(intent)
        return codec().encode(await done)

    async def publish(self) -> bytes:
        """Publish; the answer is ``WeightsReady`` — the last one if nothing new was trained —
        or why not (``IntentRejected``, a failure, ``RunEnded``)."""
        if self.core.ended is not None:
            return codec().encode(self.core.ended)
        intent = self.user(PublishWeights())
        done = self.waiters.wait_for(
            lambda m: (
                isinstance(m, WeightsReady)
                or _answers(m, intent)
                or (isinstance(m, CommandFailed) and m.target == "trainer")
            )
        )
        self.core.post(intent)
        answer = await done
        if isinstance(answer, IntentRejected) and answer.reason == "nothing_new" and self.last_ready is not None:
            answer = self.last_ready
        return codec().encode(answer)

    def counters(self) -> dict[str, int]:
        return self.core.buffer.counters()

    async def close(self) -> None:
        await self.executor.close()
        self.sinks.close()


def _answers(m: Message, intent: Intent) -> bool:
    """``m`` is the refusal of ``intent``, or the end of the run."""
    if isinstance(m, RunEnded):
        return True
    return isinstance(m, IntentRejected) and m.intent_source == intent.source and m.intent_seq == intent.seq


def remote_class() -> Any:
    import ray

    return ray.remote(num_cpus=0)(CoordinatorActor)
