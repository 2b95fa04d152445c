"""``Engine``: the facade users embed — it starts the actors of one run and stops them.

    async with Engine(config) as engine:
        async for event in engine.events():
            ...

Invariants: a run owns its actors — all are named ``shunter.<run_id>.*`` in the ``shunter``
namespace, so re-runs and concurrent runs in one cluster never collide on a name — and
leaving the ``async with`` block always stops the run and kills them, on success, on
error and on cancellation. Setup failures raise :class:`EngineSetupError` naming the
component and its cause.

Errors reach the caller as typed exceptions whose text starts with the cause:
``EngineSetupError`` (a component did not start), ``UserCodeError`` (the user's own loss
failed; the run goes on), ``IntentRefused`` (the coordinator would not do what was asked, and
why), ``NoBatchError`` (no mini-batch in time, and why), ``RunEndedError`` (the run is over;
``engine.ended`` says how). ``engine.ended`` is set whenever the run's end is observed.

Recovery: with ``run.checkpoint_every > 0``, a run whose trainer or coordinator dies is
started again from its last checkpoint (up to ``run.max_restarts`` times): the actors of
the attempt are replaced, the registry (which outlives attempts and keeps its table on
disk) releases their ranks, and ``events()`` goes on with ``RunResumed`` — the failed
attempt's ``RunEnded`` is in the event log, not in the stream. ``Engine(cfg,
resume=path)`` continues a run from a checkpoint after the whole program stopped.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
import warnings
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec

from shunter.engine.checkpoint import CheckpointStore, Manifest, resolve
from shunter.engine.config import EngineConfig, load_config
from shunter.engine.errors import UserCodeError, describe
from shunter.events import (
    Batch,
    Codec,
    CommandFailed,
    ComponentFailed,
    ComponentPlaced,
    ComponentReady,
    Event,
    Intent,
    IntentRejected,
    Message,
    ReplicaUp,
    RunEnded,
    StepEnd,
    TrainBatch,
    WeightsReady,
)
from shunter.events.view import HYBRID, ROLLOUT, STANDALONE, TRAINER

NAMESPACE = "shunter"


class EngineError(RuntimeError):
    """Base of the errors the ``Engine`` raises in the caller."""


class EngineSetupError(EngineError):
    """A component failed to start; the message names it and the cause."""


class RunEndedError(EngineError):
    """The run is over (``.ended``: its ``RunEnded``); nothing more can be asked of it."""

    def __init__(self, ended: RunEnded) -> None:
        super().__init__(f"the run ended ({ended.reason}" + (f": {ended.error})" if ended.error else ")"))
        self.ended = ended


class IntentRefused(EngineError):
    """The coordinator refused an intent (``.rejected``: the ``IntentRejected``, with its reason)."""

    def __init__(self, rejected: IntentRejected) -> None:
        super().__init__(f"{rejected.intent_kind} refused ({rejected.reason}): {rejected.detail}")
        self.rejected = rejected


class NoBatchError(EngineError, TimeoutError):
    """No mini-batch became ready in time; the message says why."""


class Engine:
    def __init__(self, config: EngineConfig | str | Path, *, run_id: str | None = None,
                 resume: str | Path | None = None) -> None:
        """``resume``: a checkpoint folder, or a run folder (its newest valid checkpoint);
        the run continues under its own id and folder. Raises ``CheckpointError`` naming
        what is wrong with it."""
        self.cfg = config if isinstance(config, EngineConfig) else load_config(config)
        self._resume: tuple[Path, Manifest] | None = resolve(resume) if resume else None
        if self._resume is not None:
            self.run_id = self._resume[1].run_id
            self.out_dir = self._resume[0].parent.parent
        else:
            self.run_id = run_id or f"{self.cfg.run.name}-{uuid.uuid4().hex[:8]}"
            self.out_dir = Path(self.cfg.run.output_dir) / self.run_id
        self.attempt = 0
        self._restart_reason = ""
        self._serve = ("", 0)  # (model folder, weight version) new replicas start from
        self._codec = Codec()
        self._owns_ray = False
        self._actors: list = []
        self.coordinator = None
        self.registry = None
        self.ended: RunEnded | None = None
        self._replicas_made = 0
        self._model_dir = ""
        self._placer = None  # actors.placement.Placer when the config asks for GPUs
        self._slots: dict[str, int] = {}  # component -> its placement-group bundle
        self._starting: dict[str, asyncio.Task] = {}  # replicas added mid-run, until they serve

    def _seen(self, msg: Message) -> Message:
        """Every answer from the coordinator passes here: a ``RunEnded`` sets ``ended``."""
        if isinstance(msg, RunEnded):
            self.ended = msg
        return msg

    # -- lifecycle ---------------------------------------------------------------------
    async def __aenter__(self) -> Engine:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def start(self) -> None:
        from shunter.actors import registry

        self._model_dir = self._ensure_model()
        self._init_ray()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        from shunter.engine.placement import plan

        layout = plan(self.cfg)
        if layout is not None:
            from shunter.actors.placement import Placer

            self._placer = Placer(layout, f"shunter.{self.run_id}.placement")
            await self._placer.reserve(self.cfg.run.timeout_s)
        self.registry = registry.remote_class().options(
            name=registry.registry_name(self.run_id), namespace=NAMESPACE).remote(
            self.run_id, None, str(self.out_dir / "registry.msgpack"))
        await self._start_attempt()

    def _name(self, component: str) -> str:
        return f"shunter.{self.run_id}.{component}" + (f".{self.attempt}" if self.attempt else "")

    async def _start_attempt(self) -> None:
        """Start trainer, replicas and coordinator — from the checkpoint in ``_resume`` if any."""
        from shunter.actors import coordinator, trainer

        cfg = self.cfg
        timeout = cfg.run.timeout_s
        opening: list = []
        ckpt = self._resume[0] if self._resume else None
        if ckpt is not None:  # ranks held by replicas of an earlier attempt are free again
            opening += self._codec.decode_batch(await self.registry.release_all.remote("attempt over"))
            self._replicas_made = max(self._replicas_made, await self.registry.generation.remote())
            self._serve = (str(ckpt / "model"), self._resume[1].version)
        else:
            self._serve = (self._model_dir, 0)
        kinds = [STANDALONE] * cfg.rollout.standalone_replicas + [HYBRID] * cfg.rollout.hybrid_replicas
        replicas = {}
        for kind in kinds:
            rid, h, rank, evs = await self._new_replica(kind)
            opening += evs
            replicas[rid] = (h, kind, rank)
        tr = trainer.remote_class().options(
            name=self._name("trainer"), namespace=NAMESPACE,
            **self._resources("trainer", self._placer.trainer_slot() if self._placer else None,
                              cfg.trainer.num_gpus, cfg.trainer.num_cpus)).remote(
            self.run_id, msgspec.msgpack.encode(cfg.trainer), self._model_dir, seed=cfg.run.seed,
            temperature=cfg.rollout.temperature, init_from=str(ckpt) if ckpt else "",
            import_paths=cfg.run.import_paths)
        self._actors.append(tr)
        setups = {"trainer": tr.setup.remote(), **{rid: h.setup.remote() for rid, (h, _, _) in replicas.items()}}
        times = {}
        for comp, ref in setups.items():
            try:
                times[comp] = await asyncio.wait_for(ref, timeout)
            except TimeoutError:
                raise EngineSetupError(f"{comp} did not finish setup within run.timeout_s = {timeout}s") from None
            except Exception as e:  # noqa: BLE001 - surface the actor's own error
                cause = getattr(e, "cause", None) or e
                raise EngineSetupError(f"{comp} failed to start: {type(cause).__name__}: {cause}") from e
        now = time.time()
        opening += [ComponentReady(component=comp, setup_s=t, run_id=self.run_id, source="engine", wall_time=now)
                    for comp, t in times.items()]
        opening += await self._placed({"trainer": tr, **{rid: h for rid, (h, _, _) in replicas.items()}})
        for rid, (_, kind, rank) in replicas.items():
            opening.append(self._replica_up(rid, kind, rank, times[rid]))
        self.coordinator = coordinator.remote_class().options(name=self._name("coordinator"), namespace=NAMESPACE).remote(
            msgspec.msgpack.encode(cfg), self.run_id, tr, {rid: h for rid, (h, _, _) in replicas.items()},
            str(self.out_dir), self.registry, resume=str(ckpt) if ckpt else "", attempt=self.attempt,
            reason=self._restart_reason)
        self._actors.append(self.coordinator)
        await self.coordinator.start.remote(self._codec.encode_batch(opening))

    def _resources(self, component: str, slot, num_gpus: float, num_cpus: float) -> dict:
        if self._placer is None:
            return {"num_gpus": num_gpus, "num_cpus": num_cpus}
        self._slots[component] = slot.bundle if slot is not None else -1
        return self._placer.options(slot, num_gpus=num_gpus, num_cpus=num_cpus)

    async def _placed(self, actors: dict) -> list[ComponentPlaced]:
        """Where each actor landed (bundle, node, GPU ids), for the event log (asked of all at once)."""

        async def where(h) -> dict:
            try:
                return await asyncio.wait_for(h.where.remote(), 30)
            except Exception:  # noqa: BLE001 - informational only
                return {}

        found = await asyncio.gather(*(where(h) for h in actors.values()))
        return [ComponentPlaced(component=comp, bundle=self._slots.get(comp, -1), node=w.get("node", ""),
                                gpu_ids=w.get("gpu_ids", []), run_id=self.run_id, source="engine", wall_time=time.time())
                for comp, w in zip(actors, found, strict=True)]

    def _replica_up(self, rid: str, kind: str, rank: int, setup_s: float) -> ReplicaUp:
        return ReplicaUp(replica_id=rid, replica_kind=kind, rank=rank, mode=ROLLOUT if kind == STANDALONE else TRAINER,
                         setup_s=setup_s, version=self._serve[1], run_id=self.run_id, source="engine",
                         wall_time=time.time())

    async def _restart(self, reason: str) -> bool:
        """The trainer or the coordinator died: start the run again from its last
        checkpoint. False (nothing done) when restarts are off, used up, or nothing is saved."""
        run = self.cfg.run
        if run.checkpoint_every <= 0 or self.attempt >= run.max_restarts:
            return False
        found = CheckpointStore(self.out_dir / "checkpoints").latest()
        if found is None:
            return False
        await self._stop_attempt()
        self.attempt += 1
        self._resume, self._restart_reason = found, reason
        await self._start_attempt()
        return True

    async def _stop_attempt(self) -> None:
        import ray

        if self.coordinator is not None:
            try:
                await asyncio.wait_for(self.coordinator.close.remote(), 10)
            except Exception:  # noqa: BLE001 - it may be the one that died
                pass
        for h in reversed(self._actors):
            try:
                ray.kill(h)
            except Exception:  # noqa: BLE001
                pass
        self._actors.clear()
        self.coordinator = None

    async def _new_replica(self, kind: str):
        """Register a replica (rank + actor name from the registry) and create its actor."""
        from shunter.actors import rollout

        cfg = self.cfg
        i = self._replicas_made
        self._replicas_made += 1
        rid = f"{kind}-{i}"
        rank, name, evs = await self.registry.register.remote(rid, kind)
        binds = cfg.rollout.cpu_bind
        model_dir, version = self._serve
        slot = self._placer.replica_slot(rid, kind, name, NAMESPACE) if self._placer else None
        h = rollout.remote_class().options(name=name, namespace=NAMESPACE,
                                           **self._resources(rid, slot, cfg.rollout.num_gpus,
                                                             cfg.rollout.num_cpus)).remote(
            self.run_id, rid, model_dir, reward=cfg.task.reward, task=cfg.task.name, version=version,
            mode=ROLLOUT if kind == STANDALONE else TRAINER, seed=cfg.run.seed + rank,
            max_model_len=cfg.rollout.max_model_len, max_tokens=cfg.rollout.max_tokens,
            engine_args=cfg.rollout.engine_args, cpu_bind=binds[i % len(binds)] if binds else "nobind",
            gpu_memory_utilization=cfg.rollout.gpu_memory_utilization, enable_sleep_mode=cfg.rollout.enable_sleep_mode,
            stream_interval=cfg.rollout.stream_interval,
            weight_transfer="ipc" if cfg.trainer.weight_transport == "vllm_ipc" else "",
            import_paths=cfg.run.import_paths)
        self._actors.append(h)
        return rid, h, rank, self._codec.decode_batch(evs)

    async def add_replica(self, kind: str = STANDALONE) -> str:
        """Start one more replica while the run goes on (elastic capacity, or a replacement
        for one that died — it takes the smallest free rank). Returns its id as soon as the
        registry gave it a rank and its actor exists (milliseconds); the engine starts in the
        background — ``await engine.replica_ready(rid)`` waits for it, and ``ReplicaUp`` in
        ``events()`` says it serves (a standalone replica loads the current weights first). A
        replica that fails to start is reported as ``ComponentFailed`` and by ``replica_ready``."""
        if kind not in (STANDALONE, HYBRID):
            raise ValueError(f"kind must be {STANDALONE!r} or {HYBRID!r}, got {kind!r}")
        rid, h, rank, opening = await self._new_replica(kind)
        self._starting[rid] = asyncio.get_running_loop().create_task(self._bring_up(rid, h, kind, rank, opening))
        return rid

    async def replica_ready(self, replica_id: str) -> ReplicaUp:
        """Wait until a replica added with :meth:`add_replica` is started and announced."""
        task = self._starting.get(replica_id)
        if task is None:
            raise KeyError(f"{replica_id!r} was not added with add_replica()")
        return await asyncio.shield(task)

    async def _bring_up(self, rid: str, h, kind: str, rank: int, opening: list) -> ReplicaUp:
        try:
            setup_s = await asyncio.wait_for(h.setup.remote(), self.cfg.run.timeout_s)
        except Exception as e:  # noqa: BLE001 - name the replica and the cause, in the run's events too
            err = EngineSetupError(f"{rid} failed to start: {describe(getattr(e, 'cause', None) or e)}")
            failed = ComponentFailed(component=rid, error=str(err), run_id=self.run_id, source="engine",
                                     wall_time=time.time())
            await self.coordinator.ingest.remote(self._codec.encode_batch([failed]), "engine")
            raise err from e
        up = self._replica_up(rid, kind, rank, setup_s)
        opening += await self._placed({rid: h})
        await self.coordinator.add_replica.remote(rid, h, self._codec.encode_batch([*opening, up]))
        return up

    def _ensure_model(self) -> str:
        m = self.cfg.model
        path = Path(m.path)
        if m.build_tiny and not (path / "config.json").is_file():
            from shunter.engine.tiny_model import build_tiny_model

            build_tiny_model(path, m.build_tiny, seed=self.cfg.run.seed, sft_steps=m.sft_steps, preset=m.preset)
        if not (path / "config.json").is_file():
            raise EngineSetupError(f"model.path = {str(path)!r} holds no HF model (no config.json); "
                                   "set model.build_tiny to build the tiny model there")
        return str(path.resolve())

    def _init_ray(self) -> None:
        import ray

        if ray.is_initialized():
            return
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        kw = {"namespace": NAMESPACE, "log_to_driver": bool(os.environ.get("SHUNTER_RAY_LOGS"))}
        if self.cfg.run.ray_address:
            ray.init(address=self.cfg.run.ray_address, **kw)
        else:
            ray.init(num_cpus=self.cfg.run.num_cpus or os.cpu_count(), include_dashboard=False,
                     _node_ip_address="127.0.0.1", **kw)
        self._owns_ray = True

    async def close(self) -> None:
        import ray

        for task in self._starting.values():
            task.cancel()
        await asyncio.gather(*self._starting.values(), return_exceptions=True)
        if self.coordinator is not None and self.ended is None:
            try:
                data = await asyncio.wait_for(self.coordinator.stop.remote("closed"), 60)
                self.ended = self._codec.decode(data)
            except Exception:  # noqa: BLE001 - closing must go on
                pass
        await self._stop_attempt()
        if self.registry is not None:
            try:
                ray.kill(self.registry)
            except Exception:  # noqa: BLE001
                pass
            self.registry = None
        if self._placer is not None:
            self._placer.remove()
            self._placer = None
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False

    # -- observing and steering ---------------------------------------------------------
    async def events(self) -> AsyncIterator[Event]:
        """Typed events of the run from its start (commands on the bus are skipped), until
        ``RunEnded``. The feed keeps the last 200,000 messages; a reader that falls further
        behind gets a warning with the number it missed. When the run restarts from a
        checkpoint the stream goes on with the new attempt's events (``RunResumed`` first)."""
        from ray.exceptions import RayActorError

        cursor = 0
        while True:
            try:
                items, cursor, missed = await self.coordinator.fetch.remote(cursor, 4096, 1.0)
            except RayActorError as e:
                if await self._restart(f"coordinator died: {e}"):
                    cursor = 0
                    continue
                raise
            if missed:
                warnings.warn(f"Engine.events(): fell behind, {missed} messages were dropped from the feed "
                              "(the event log on disk has all of them)", stacklevel=2)
            restarted = False
            for b in items:
                msg = self._codec.decode(b)
                if isinstance(msg, RunEnded) and msg.run_id in ("", self.run_id):
                    if await self._recover(msg):
                        restarted = True
                        break
                    self.ended = msg
                    yield msg
                    return
                if isinstance(msg, Event):
                    yield msg
            if restarted:
                cursor = 0

    async def _recover(self, ended: RunEnded) -> bool:
        """True if the run that ended this way was restarted from its last checkpoint."""
        return bool(ended.failed_component) and await self._restart(f"{ended.failed_component} failed: {ended.error}")

    async def submit(self, intent: Intent) -> None:
        """Put an intent on the bus (``SwitchToRollout``, ``Rebalance``, ``Stop`` …); its outcome
        arrives in ``events()``."""
        if not isinstance(intent, Intent):
            raise TypeError(f"submit() takes an intent (SwitchToRollout, Stop, ...), got {type(intent).__name__}")
        if not await self.coordinator.submit.remote(self._codec.encode(intent)):
            raise ValueError(f"the coordinator rejected {intent!r}")

    async def wait(self) -> RunEnded:
        """The run's end, restarting it from its last checkpoint when a component died."""
        from ray.exceptions import RayActorError

        while True:
            try:
                ended = self._codec.decode(await self.coordinator.wait_ended.remote())
            except RayActorError as e:
                if await self._restart(f"coordinator died: {e}"):
                    continue
                raise
            if not await self._recover(ended):
                self.ended = ended
                return ended

    async def stop(self, reason: str = "stopped") -> RunEnded:
        """End the run (the finale: final publish, load, validation, checkpoint) and return
        its ``RunEnded``."""
        self.ended = self._codec.decode(await self.coordinator.stop.remote(reason))
        return self.ended

    # -- user-driven training (run.trainer_driver = "user") ------------------------------
    async def next_batch(self, timeout_s: float = 600.0) -> Batch:
        """The next ready mini-batch (whole groups); rollout keeps running meanwhile.

        Raises ``NoBatchError`` after ``timeout_s`` saying why none is ready (groups still
        generating, the staleness gate waiting for ``publish_weights()``, no replica serving),
        or ``RunEndedError`` once the run is over."""
        data, why = await self.coordinator.next_batch.remote(timeout_s)
        if data is not None:
            return self._codec.decode(data)
        if self.ended is None and why.startswith("the run ended"):
            self.ended = self._codec.decode(await self.coordinator.wait_ended.remote())
        if self.ended is not None:
            raise RunEndedError(self.ended)
        raise NoBatchError(f"no mini-batch within {timeout_s:g}s: {why}")

    async def train(self, batch: Batch, *, loss_fn: str = "") -> StepEnd:
        """One optimizer step on ``batch`` (from :meth:`next_batch`; its ``samples`` may be
        replaced) on the trainer actor — the built-in loss, or ``loss_fn = "module:function"``
        taking a ``shunter.engine.loss.LossInput``.

        Raises ``UserCodeError`` when the loss fails (the run goes on and the batch may be
        trained again), ``IntentRefused`` for a batch already trained or never handed out,
        ``RunEndedError`` once the run is over."""
        if not isinstance(batch, Batch):
            raise TypeError(f"train() takes the Batch next_batch() returned, got {type(batch).__name__}")
        intent = TrainBatch(batch_id=batch.batch_id, samples=batch.samples, loss_fn=loss_fn)
        out = self._seen(self._codec.decode(await self.coordinator.train.remote(self._codec.encode(intent))))
        match out:
            case StepEnd():
                return out
            case CommandFailed() if out.user_code:
                raise UserCodeError.from_report(out.user_code, out.error)
            case IntentRejected():
                raise IntentRefused(out)
            case RunEnded():
                raise RunEndedError(out)
        raise EngineError(f"train step failed: {getattr(out, 'error', out)}")

    async def publish_weights(self) -> WeightsReady | None:
        """Publish the trainer's weights as the next version and return its ``WeightsReady``.
        With no optimizer step since the last publish nothing is published: the last
        ``WeightsReady`` is returned (None before the first publish)."""
        out = self._seen(self._codec.decode(await self.coordinator.publish.remote()))
        match out:
            case WeightsReady():
                return out
            case IntentRejected() if out.reason == "nothing_new":
                return None
            case IntentRejected():
                raise IntentRefused(out)
            case RunEnded():
                raise RunEndedError(out)
        raise EngineError(f"publishing weights failed: {getattr(out, 'error', out)}")

    async def counters(self) -> dict[str, int]:
        return await self.coordinator.counters.remote()
