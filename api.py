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
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from shunter.engine.checkpoint import CheckpointStore, Found, resolve
from shunter.engine.config import EngineConfig, load_config
from shunter.engine.errors import (
    EngineError,
    EngineSetupError,
    IntentRefused,
    NoBatchError,
    RunEndedError,
    UserCodeError,
    describe,
)
from shunter.events import (
    Batch,
    Codec,
    CommandFailed,
    ComponentFailed,
    Event,
    Intent,
    IntentRejected,
    Message,
    RelayReport,
    ReplicaRestart,
    ReplicaUp,
    RunEnded,
    StepEnd,
    TrainBatch,
    WeightsReady,
)
from shunter.events.vocab import HYBRID, STANDALONE

__all__ = [
    "Engine",
    "EngineError",
    "EngineSetupError",
    "IntentRefused",
    "NoBatchError",
    "RunEndedError",
    "UserCodeError",
]


class Engine:
    def __init__(
        self,
        config: EngineConfig | str | Path,
        *,
        run_id: str | None = None,
        resume: str | Path | None = None,
        train_data: Sequence[Mapping[str, Any]] | None = None,
        val_data: Sequence[Mapping[str, Any]] | None = None,
        environment: type | None = None,
    ) -> None:
        """``resume``: a checkpoint folder, or a run folder (its newest valid checkpoint);
        the run continues under its own id and folder. Raises ``CheckpointError`` naming
        what is wrong with it.

        ``train_data`` / ``val_data``: the prompts as objects — dicts in verl's layout (``prompt``,
        ``data_source``, ``reward_model.ground_truth``, ``extra_info``), checked and filtered as
        ``data.train_files`` / ``data.val_files`` rows are (a bad row: ``EngineSetupError`` at
        ``start()`` naming ``train_data[i]`` and the field; held-out rows come from ``val_data``, not
        ``data.val_files``, when the training rows are objects). ``environment``: an environment
        class (multi-turn rollouts; or its spec string) instead of ``task.environment``; the
        replicas get it pickled, so a class defined in the user's script works. A class that is
        not one: ``EngineSetupError``."""
        self.cfg = config if isinstance(config, EngineConfig) else load_config(config)
        if train_data is not None and self.cfg.data.train_files:
            raise EngineSetupError("train_data and data.train_files are both given: use one")
        if val_data is not None and self.cfg.data.val_files:
            raise EngineSetupError("val_data and data.val_files are both given: use one")
        if val_data is not None and train_data is None and not self.cfg.data.train_files:
            raise EngineSetupError("val_data is given without training data: give train_data too")
        if environment is not None:
            from shunter.engine.environments import load_environment

            if self.cfg.task.environment:
                raise EngineSetupError("environment and task.environment are both given: use one")
            from shunter.engine.config import check_env_timeout

            try:
                load_environment(environment)
                check_env_timeout(self.cfg.task.env_timeout_s, self.cfg.rollout.generate_timeout_s)
            except ValueError as e:  # ConfigError too: the checks task.environment gets at load
                raise EngineSetupError(str(e)) from None
        self._objects = {"train_data": train_data, "val_data": val_data, "environment": environment}
        self._resume: Found | None = resolve(resume) if resume else None
        if self._resume is not None:
            self.run_id = self._resume[1].run_id
            self.out_dir = self._resume[0].parent.parent
        else:
            self.run_id = run_id or f"{self.cfg.run.name}-{uuid.uuid4().hex[:8]}"
            self.out_dir = Path(self.cfg.run.output_dir) / self.run_id
        self._restart_reason = ""
        self._codec = Codec()
        self._launch: Any = None  # actors.launch.Launcher, made in start()
        self.coordinator: Any = None
        self.ended: RunEnded | None = None
        self._starting: dict[str, asyncio.Task[ReplicaUp]] = {}  # replicas added mid-run, until they serve
        self._supervisor: asyncio.Task[None] | None = None  # carries out ReplicaRestart
        self._phase = "new"  # then "started" (or "failed" if start() raised), "closed" once close() ran

    @property
    def attempt(self) -> int:
        """0 for the first attempt; +1 for each restart from a checkpoint."""
        return self._launch.attempt if self._launch is not None else 0

    @property
    def reaped(self) -> list[str]:
        """Processes a killed earlier driver of this run left running, ended at start."""
        return list(self._launch.reaped) if self._launch is not None else []

    @property
    def registry(self) -> Any:
        return self._launch.registry if self._launch is not None else None

    def _live(self) -> Any:
        """The coordinator's handle; ``EngineError`` before ``start()``, ``RunEndedError`` after
        the run ended and the engine was closed."""
        if self.coordinator is None:
            if self.ended is not None:
                raise RunEndedError(self.ended)
            raise EngineError(
                "the engine is not started: use `async with Engine(cfg) as engine:` (or `await engine.start()`)"
            )
        return self.coordinator

    def _seen(self, msg: Message) -> Message:
        """Every answer from the coordinator passes here: a ``RunEnded`` sets ``ended``."""
        if isinstance(msg, RunEnded):
            self.ended = msg
        return msg

    # -- lifecycle ---------------------------------------------------------------------
    def _check_run_folder(self) -> None:
        """Before anything starts: a resumed run's registry state must be its own and whole; a
        new run must not write into the records of another (same id, same folder)."""
        from shunter.engine.ranks import RankTable, RegistryStateError

        if self._resume is not None:
            try:
                RankTable.load(self.out_dir / "registry.msgpack", self.run_id)
            except RegistryStateError as e:
                raise EngineSetupError(f"cannot resume run {self.run_id}: {e}") from None
            return
        d = self.out_dir
        held = [
            name
            for name, holds in (
                ("events.bin", lambda p: p.is_file() and p.stat().st_size > 0),
                ("checkpoints", lambda p: p.is_dir() and any(p.iterdir())),
                ("registry.msgpack", lambda p: p.is_file()),
            )
            if holds(d / name)
        ]
        if held:
            raise EngineSetupError(
                f"run folder {self.out_dir} already holds run {self.run_id!r} ({', '.join(held)}): continue it "
                f"with `shunter run CONFIG --resume {self.out_dir}` (Engine(cfg, resume=...)) if it "
                "saved a checkpoint, or choose another run id (or move the folder aside); nothing there was changed"
            )

    async def __aenter__(self) -> Engine:
        self._check_not_started()  # before the try: a second entry must not close the running engine
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check_not_started(self) -> None:
        """An engine starts once: ``EngineError`` if ``start()`` already ran (the running engine is
        left as it is) or the engine is closed."""
        if self._phase == "started":
            raise EngineError(
                "the engine is already started: `async with Engine(cfg) as engine:` starts it, so do not "
                "also call `await engine.start()` (nor enter the `async with` twice); the running engine is unchanged"
            )
        if self._phase == "failed":
            raise EngineError("the engine's start failed (its error was raised then): close() it and make a new Engine")
        if self._phase == "closed":
            raise EngineError(
                "the engine is closed and cannot start again: make a new Engine (Engine(cfg, resume=RUN_FOLDER) "
                "continues this run from its last checkpoint)"
            )

    async def start(self) -> None:
        """Start the run's actors (``async with Engine(cfg) as engine:`` calls it). An engine starts
        once: a second call raises ``EngineError`` and leaves the running engine as it is."""
        from shunter.actors.launch import Launcher

        self._check_not_started()
        self._check_run_folder()
        self._phase = "started"
        try:
            self._launch = Launcher(self.cfg, self.run_id, self.out_dir, **self._objects)
            await self._launch.open()
            await self._start_attempt(self._resume, "")
        except BaseException:
            self._phase = "failed"
            raise

    async def _restart(self, reason: str) -> bool:
        """The trainer or the coordinator died: start the run again from its last
        checkpoint. False (nothing done) when restarts are off, used up, or nothing is saved."""
        run = self.cfg.run
        if run.checkpoint_every <= 0 or self.attempt >= run.max_restarts:
            return False
        found = CheckpointStore(self.out_dir / "checkpoints").latest()
        if found is None:
            return False
        await self._launch.stop_attempt()
        self._launch.attempt += 1
        self._resume, self._restart_reason = found, reason
        await self._start_attempt(found, reason)
        return True

    async def _start_attempt(self, found: Found | None, reason: str) -> None:
        """Start an attempt. One that resumes from a checkpoint and loses a component while it
        starts (a kill landing during a restart or a resume) is started again from the newest
        checkpoint, within ``run.max_restarts``; any other failure to start is raised."""
        from ray.exceptions import RayActorError

        while True:
            try:
                self.coordinator = await self._launch.start_attempt(found, reason)
                break
            except EngineSetupError as e:
                died = isinstance(e.__cause__, RayActorError)
                if found is None or not died or self._launch.attempt >= self.cfg.run.max_restarts:
                    raise
                await self._launch.stop_attempt()
                self._launch.attempt += 1
                found = CheckpointStore(self.out_dir / "checkpoints").latest() or found
                reason = f"a component died while the previous attempt started: {e}"
                self._resume, self._restart_reason = found, reason
        self._supervise()

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

    async def close(self) -> None:
        """Stop the run if it is still going, and remove every actor it made."""
        if self._phase != "new":
            self._phase = "closed"
        if self._supervisor is not None:
            self._supervisor.cancel()
        for task in self._starting.values():
            task.cancel()
        await asyncio.gather(*self._starting.values(), return_exceptions=True)
        if self.coordinator is not None and self.ended is None:
            try:
                data = await asyncio.wait_for(self.coordinator.stop.remote("closed"), 60)
                self.ended = self._codec.decode(data)
            except Exception:  # noqa: BLE001 - closing must go on
                pass
        if self._launch is not None:
            await self._launch.close()
        self.coordinator = None

    # -- observing and steering ---------------------------------------------------------
    async def events(self) -> AsyncIterator[Event]:
        """Typed events of the run from its start (commands on the bus are skipped), until
        ``RunEnded``; the facts a relay folded into a ``RelayReport`` come one by one, as
        the replicas emitted them. The feed keeps the last 200,000 messages; a reader that falls further
        behind gets a warning with the number it missed. When the run restarts from a
        checkpoint the stream goes on with the new attempt's events (``RunResumed`` first)."""
        from ray.exceptions import RayActorError

        cursor = 0
        while True:
            try:
                items, cursor, missed = await self._live().fetch.remote(cursor, 4096, 1.0)
            except RayActorError as e:
                if await self._restart(f"coordinator died: {e}"):
                    cursor = 0
                    continue
                raise
            if missed:
                warnings.warn(
                    f"Engine.events(): fell behind, {missed} messages were dropped from the feed "
                    "(the event log on disk has all of them)",
                    stacklevel=2,
                )
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
                if msg.__class__ is RelayReport:  # the facts a relay folded, one by one
                    for ev in msg.events:  # type: ignore[attr-defined]
                        yield ev
                elif isinstance(msg, Event):
                    yield msg
            if restarted:
                cursor = 0

    async def _recover(self, ended: RunEnded) -> bool:
        """True if the run that ended this way was restarted from its last checkpoint."""
        return bool(ended.failed_component) and await self._restart(ended.error)

    async def submit(self, intent: Intent) -> None:
        """Put an intent on the bus (``SwitchToRollout``, ``Rebalance``, ``Stop`` …); its outcome
        arrives in ``events()``."""
        if not isinstance(intent, Intent):
            raise TypeError(f"submit() takes an intent (SwitchToRollout, Stop, ...), got {type(intent).__name__}")
        if isinstance(intent, TrainBatch):
            self._live()
            self._user_driven("submit(TrainBatch(...))")
        if self.ended is not None:
            raise RunEndedError(self.ended)
        if not await self._live().submit.remote(self._codec.encode(intent)):
            raise ValueError(f"the coordinator rejected {intent!r}")

    async def wait(self) -> RunEnded:
        """The run's end, restarting it from its last checkpoint when a component died."""
        from ray.exceptions import RayActorError

        while True:
            try:
                ended = self._codec.decode(await self._live().wait_ended.remote())
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
        if self.ended is not None:
            return self.ended
        self.ended = self._codec.decode(await self._live().stop.remote(reason))
        return self.ended

    # -- user-driven training (run.trainer_driver = "user") ------------------------------
    def _user_driven(self, call: str) -> None:
        """``EngineError`` when the engine drives the trainer: its policy takes every ready batch,
        so a batch taken (or trained) by the user as well would be lost to the run's books."""
        if self.cfg.run.trainer_driver != "user":
            raise EngineError(
                f"{call} is for a run whose training loop is yours: this run has "
                f'run.trainer_driver = "{self.cfg.run.trainer_driver}", so the engine takes and trains every '
                'batch itself; set run.trainer_driver = "user" to take batches with next_batch() and train them '
                "with train() (nothing was taken from the run)"
            )

    async def next_batch(self, timeout_s: float = 600.0) -> Batch:
        """The next ready mini-batch (whole groups); rollout keeps running meanwhile.

        Raises ``NoBatchError`` after ``timeout_s`` saying why none is ready (groups still
        generating, the staleness gate waiting for ``publish_weights()``, no replica serving),
        or ``RunEndedError`` once the run is over. Only with ``run.trainer_driver = "user"``: with
        ``"engine"`` it raises ``EngineError`` and takes nothing (the engine trains every batch)."""
        live = self._live()
        self._user_driven("next_batch()")
        data, why = await live.next_batch.remote(timeout_s)
        if data is not None:
            return msgspec.msgpack.decode(data, type=Batch)
        if self.ended is None and why.startswith("the run ended"):
            self.ended = self._codec.decode(await self._live().wait_ended.remote())
        if self.ended is not None:
            raise RunEndedError(self.ended)
        raise NoBatchError(f"no mini-batch within {timeout_s:g}s: {why}")

    async def train(self, batch: Batch, *, loss_fn: str = "") -> StepEnd:
        """One optimizer step on ``batch`` (from :meth:`next_batch`; its ``samples`` may be
        replaced) on the trainer actor — the built-in loss, or ``loss_fn = "module:function"``
        taking a ``shunter.engine.loss.LossInput``.

        Raises ``UserCodeError`` when the loss fails (the run goes on and the batch may be
        trained again), ``IntentRefused`` for a batch already trained or never handed out,
        ``RunEndedError`` once the run is over; ``EngineError`` unless ``run.trainer_driver = "user"``."""
        if not isinstance(batch, Batch):
            raise TypeError(f"train() takes the Batch next_batch() returned, got {type(batch).__name__}")
        loss_fn = _loss_spec(loss_fn)
        self._live()
        self._user_driven("train()")
        if self.ended is not None:
            raise RunEndedError(self.ended)
        intent = TrainBatch(batch_id=batch.batch_id, samples=batch.samples, loss_fn=loss_fn)
        out = self._seen(self._codec.decode(await self._live().train.remote(self._codec.encode(intent))))
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
        out = self._seen(self._codec.decode(await self._live().publish.remote()))
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
        return await self._live().counters.remote()


def _loss_spec(loss_fn: object) -> str:
    """``loss_fn`` as the ``"module:function"`` the trainer actor imports: a string as given, or
    a function defined at module level in an importable module (not ``__main__``)."""
    if isinstance(loss_fn, str):
        return loss_fn
    module, name = getattr(loss_fn, "__module__", None), getattr(loss_fn, "__qualname__", "")
    if callable(loss_fn) and module and module != "__main__" and "<" not in name:
        return f"{module}:{name}"
    raise TypeError(
        f"loss_fn takes a 'module:function' string (the trainer runs in its own process and imports "
        f"it); got {loss_fn!r}"
        + (
            " — a function defined in __main__ cannot be imported there: put it in a module next to your script"
            if module == "__main__"
            else ""
        )
    )
