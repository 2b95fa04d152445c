"""``CoordinatorActor``: the Ray shell around ``Coordinator``.

Invariant: the only way in is bytes decoded by type (``ingest`` for events, ``submit`` for
commands); bytes that do not decode become an ``EventRejected`` event and are dropped,
and the loop goes on. Everything the loop handles is written to the run's event log,
logs and metrics, and kept in a feed the ``Engine`` facade reads.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec

from shunter.actors.executor import RayExecutor
from shunter.actors.wire import codec
from shunter.engine import config as config_mod
from shunter.engine import snapshot
from shunter.engine.checkpoint import CheckpointStore
from shunter.engine.coordinator import Coordinator
from shunter.engine.records import EventLog, Feed, LogSink, MetricsSink, make_logger
from shunter.engine.tasks import load_task
from shunter.events import (
    Command,
    CommandFailed,
    ComponentPlaced,
    Event,
    EventRejected,
    Message,
    PromptSpec,
    PublishWeights,
    ReplicaDown,
    ReplicaUp,
    RunEnded,
    Stamper,
    StepEnd,
    Stop,
    TrainStep,
    WeightsReady,
)
from shunter.policies import make_policy


class Waiters:
    """Futures resolved by the first handled message matching a predicate."""

    def __init__(self) -> None:
        self._w: list[tuple[object, asyncio.Future]] = []

    def __call__(self, msg: Message) -> None:
        keep = []
        for pred, fut in self._w:
            if not fut.done() and pred(msg):
                fut.set_result(msg)
            elif not fut.done():
                keep.append((pred, fut))
        self._w = keep

    def wait_for(self, pred) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self._w.append((pred, fut))
        return fut


class CoordinatorActor:
    def __init__(self, cfg: bytes, run_id: str, trainer, replicas: dict, out_dir: str, registry=None, *,
                 resume: str = "", attempt: int = 0, reason: str = "") -> None:
        self.cfg = msgspec.msgpack.decode(cfg, type=config_mod.EngineConfig)
        self.run_id = run_id
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        wt = self.cfg.trainer.weight_transport
        self.executor = RayExecutor(run_id, trainer, replicas, timeout_s=self.cfg.run.timeout_s,
                                    generate_timeout_s=self.cfg.rollout.generate_timeout_s,
                                    weight_group=wt if wt in ("nccl", "gloo") else "",
                                    group_timeout_s=self.cfg.trainer.weight_group_timeout_s)
        self.feed = Feed()
        self.waiters = Waiters()
        self.log = EventLog(self.out / "events.bin")
        self.metrics = MetricsSink(self.out / "metrics.jsonl", self.out / "tensorboard")
        self.user = Stamper(run_id, "user")
        task = load_task(self.cfg.task.name)
        prompts = (PromptSpec(prompt_id=i, text=p.text, answer=p.answer)
                   for i, p in enumerate(task.train_prompts(self.cfg.run.seed)))
        val = [PromptSpec(prompt_id=-1 - i, text=p.text, answer=p.answer)
               for i, p in enumerate(task.validation_prompts(self.cfg.validation.prompts, self.cfg.run.seed))]
        self.core = Coordinator(
            self.cfg, make_policy(self.cfg.run.policy, self.cfg.run.policy_options), self.executor, prompts,
            run_id=run_id, validation_prompts=val,
            sinks=[self.log, LogSink(make_logger(self.out / "run.log")), self.metrics, self.feed, self.waiters,
                   self._release_dead],
            checkpoints=(CheckpointStore(self.out / "checkpoints", keep=self.cfg.run.checkpoint_keep)
                         if self.cfg.run.checkpoint_every > 0 else None),
        )
        if resume:  # a checkpoint folder, already verified by the Engine
            snap = snapshot.decode((Path(resume) / snapshot.SNAPSHOT_FILE).read_bytes())
            self.core.restore(snap, checkpoint=resume, attempt=attempt, reason=reason)
        self.registry = registry
        self._task: asyncio.Task | None = None

    def _release_dead(self, msg: Message) -> None:
        """A replica that is down gives its rank back to the registry (RankReleased)."""
        if isinstance(msg, ReplicaDown) and self.registry is not None:
            asyncio.get_running_loop().create_task(self._release(msg.replica_id, msg.reason))

    async def _release(self, replica_id: str, reason: str) -> None:
        try:
            self.ingest(await self.registry.release.remote(replica_id, reason), "registry")
        except Exception as e:  # noqa: BLE001 - report, never crash the loop
            self.core.post(self.core.stamp(CommandFailed(command_kind="registry.release", target="registry",
                                                         error=f"{type(e).__name__}: {e}")))

    async def start(self, initial: bytes) -> None:
        """Post the replicas' opening events (ReplicaUp, RankAssigned ...) and start the loop."""
        self.ingest(initial, "engine")
        self._task = asyncio.get_running_loop().create_task(self.core.run())

    def add_replica(self, replica_id: str, handle, opening: bytes) -> int:
        """A replica started during the run: route commands to it, then announce it."""
        self.executor.add_replica(replica_id, handle)
        return self.ingest(opening, "engine")

    def ingest(self, data: bytes, origin: str) -> int:
        try:
            msgs = codec().decode_batch(data)
        except msgspec.MsgspecError as e:
            self.core.post(self.core.stamp(EventRejected(origin=origin, error=str(e), nbytes=len(data))))
            return 0
        for m in msgs:
            if isinstance(m, ReplicaUp):
                self.executor.kinds[m.replica_id] = m.replica_kind
            elif isinstance(m, ComponentPlaced):
                self.executor.places[m.component] = (m.node, tuple(m.gpu_ids))
            self.core.post(m if isinstance(m, Event) else self.user(m))
        return len(msgs)

    def submit(self, data: bytes) -> bool:
        try:
            msg = codec().decode(data)
            if not isinstance(msg, Command):
                raise TypeError(f"submit() takes commands, got event {type(msg).__name__}")
        except (msgspec.MsgspecError, TypeError) as e:
            self.core.post(self.core.stamp(EventRejected(origin="user", error=str(e), nbytes=len(data))))
            return False
        self.core.post(self.user(msg))
        return True

    async def fetch(self, cursor: int, max_n: int = 4096, wait_s: float = 1.0) -> tuple[list[bytes], int, int]:
        return await self.feed.read(cursor, max_n, wait_s)

    async def wait_ended(self) -> bytes:
        if self._task is None:
            raise RuntimeError("the run was not started")
        ended = await asyncio.shield(self._task)
        return codec().encode(ended)

    async def stop(self, reason: str = "stopped") -> bytes:
        if self.core.ended is None:
            self.core.post(self.user(Stop(reason=reason)))
        return await self.wait_ended()

    # -- user-driven training ----------------------------------------------------------
    async def next_batch(self, timeout_s: float) -> bytes | None:
        """The next ready mini-batch as an encoded ``TrainStep`` (samples filled), or None."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.core.ended is None:
            batch = self.core.next_batch()
            if batch is not None:
                return codec().encode(TrainStep(batch_id=batch.batch_id, samples=batch.samples))
            if loop.time() >= deadline:
                return None
            await asyncio.sleep(0.02)
        return None

    async def train(self, step: bytes) -> bytes:
        cmd = codec().decode(step)
        done = self.waiters.wait_for(lambda m: isinstance(m, StepEnd | RunEnded) or _failed(m, "trainer"))
        self.core.post(self.user(cmd))
        return codec().encode(await done)

    async def publish(self) -> bytes:
        done = self.waiters.wait_for(lambda m: isinstance(m, WeightsReady | RunEnded) or _failed(m, "trainer"))
        self.core.post(self.user(PublishWeights()))
        return codec().encode(await done)

    def counters(self) -> dict[str, int]:
        return self.core.buffer.counters()

    async def close(self) -> None:
        await self.executor.close()
        self.log.close()
        self.metrics.close()


def _failed(m: Message, target: str) -> bool:
    return isinstance(m, CommandFailed) and m.target == target


def remote_class():
    import ray

    return ray.remote(num_cpus=0)(CoordinatorActor)
