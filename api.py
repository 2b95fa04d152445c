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
the attempt are replaced — but the standalone replicas that still answer, which load the
checkpoint's weights in place (``run.restart_keeps_replicas``) — the registry (which outlives
attempts and keeps its table on disk) releases the others' ranks, and ``events()`` goes on
with ``RunResumed`` — the failed
attempt's ``RunEnded`` is in the event log, not in the stream. ``Engine(cfg,
resume=path)`` continues a run from a checkpoint after the whole program stopped.

The ``Engine`` builds its parts and runs the run's lifecycle (start, restarts from a checkpoint,
close); its public calls on a running run hand over to them: ``api_link.RunLink`` (the live
coordinator and the run's end, shared by the parts), ``api_replicas.MidRunReplicas``
(``add_replica``, ``replica_ready``, the replacements of dead replicas) and
``api_steering.Steering`` (``events``, ``submit``, ``wait``, ``stop``, and the user-driven
``next_batch`` / ``train`` / ``publish_weights``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from shunter.actors.pool import ReplicaPool
from shunter.api_link import RunLink
from shunter.api_replicas import MidRunReplicas
from shunter.api_steering import Steering
from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.config.load import load_config
from shunter.engine.io.checkpoint import CheckpointStore, Found, resolve
from shunter.engine.io.errors import EngineError, EngineSetupError, RestartError, bounded
from shunter.events import (
    Batch,
    Codec,
    Event,
    Intent,
    ReplicaUp,
    RunEnded,
    StepEnd,
    Verdict,
    WeightsReady,
)
from shunter.events.vocab import STANDALONE


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
        pool: ReplicaPool | None = None,
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
        not one: ``EngineSetupError``. ``pool``: a ``ReplicaPool`` the run takes its standalone
        replicas from (those started with its engine settings; new ones for the rest) and gives
        them back to at its close, engines running (``shunter.actors.pool``)."""
        self.cfg = config if isinstance(config, EngineConfig) else load_config(config)
        if train_data is not None and self.cfg.data.train_files:
            raise EngineSetupError("train_data and data.train_files are both given: use one")
        if val_data is not None and self.cfg.data.val_files:
            raise EngineSetupError("val_data and data.val_files are both given: use one")
        if val_data is not None and train_data is None and not self.cfg.data.train_files:
            raise EngineSetupError("val_data is given without training data: give train_data too")
        if environment is not None:
            from shunter.engine.data.environments import load_environment

            if self.cfg.task.environment:
                raise EngineSetupError("environment and task.environment are both given: use one")
            from shunter.engine.config.checks import check_env_timeout

            try:
                load_environment(environment)
                check_env_timeout(self.cfg.task.env_timeout_s, self.cfg.rollout.generate_timeout_s)
            except ValueError as e:  # ConfigError too: the checks task.environment gets at load
                raise EngineSetupError(str(e)) from None
        self._objects = {"train_data": train_data, "val_data": val_data, "environment": environment, "pool": pool}
        self._resume: Found | None = resolve(resume) if resume else None
        if self._resume is not None:
            self.run_id = self._resume[1].run_id
            self.out_dir = self._resume[0].parent.parent
        else:
            self.run_id = run_id or f"{self.cfg.run.name}-{uuid.uuid4().hex[:8]}"
            self.out_dir = Path(self.cfg.run.output_dir) / self.run_id
        self._restart_reason = ""
        self._codec = Codec()
        self._launch: Any = None  # actors.launch.launcher.Launcher, made in start()
        self._link = RunLink()
        self._replicas = MidRunReplicas(self._link, self._codec, self.run_id)
        self._steering = Steering(self._link, self._codec, self.cfg, self.run_id, self._restart)
        self._phase = "new"  # then "started" (or "failed" if start() raised), "closed" once close() ran

    @property
    def coordinator(self) -> Any:
        """The handle of the coordinator actor of the attempt in progress (None before ``start()``
        and after ``close()``)."""
        return self._link.coordinator

    @coordinator.setter
    def coordinator(self, handle: Any) -> None:
        self._link.coordinator = handle

    @property
    def ended(self) -> RunEnded | None:
        """The run's ``RunEnded``, set whenever the end of the run is observed."""
        return self._link.ended

    @ended.setter
    def ended(self, msg: RunEnded | None) -> None:
        self._link.ended = msg

    @property
    def attempt(self) -> int:
        """0 for the first attempt; +1 for each restart from a checkpoint."""
        return self._launch.attempt if self._launch is not None else 0

    @property
    def connecting(self) -> str:
        """The Ray cluster address the engine is reaching as it starts, while it does ('' otherwise):
        nothing of the run exists yet (``run.connect_timeout_s`` bounds it)."""
        return self._launch.site.connecting if self._launch is not None else ""

    @property
    def reaped(self) -> list[str]:
        """Processes a killed earlier driver of this run left running, ended at start."""
        return list(self._launch.site.reaped) if self._launch is not None else []

    @property
    def registry(self) -> Any:
        return self._launch.site.registry if self._launch is not None else None

    # -- lifecycle ---------------------------------------------------------------------
    def _check_run_folder(self) -> None:
        """Before anything starts: a resumed run's registry state must be its own and whole; a
        new run must not write into the records of another (same id, same folder)."""
        from shunter.engine.coordinator.ranks import RankTable, RegistryStateError

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

    def _check_data_files(self) -> None:
        """Before anything starts — the model built or its tokenizer loaded, Ray, an actor — every
        file ``data.train_files`` and ``data.val_files`` name (each glob's every match) opens, holds
        rows and has the columns a row needs, its first rows checked (``check_files``); the launcher
        reads them whole later (``actors/launch/run_data.py``). ``EngineSetupError`` names the file."""
        from shunter.engine.data.files import DataError, check_files

        try:
            for key in ("train_files", "val_files"):
                check_files(getattr(self.cfg.data, key), what=f"data.{key}")
        except DataError as e:
            raise EngineSetupError(f"the dataset cannot be used: {e}") from None

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
        from shunter.actors.launch.launcher import Launcher

        self._check_not_started()
        self._check_run_folder()
        self._check_data_files()
        self._phase = "started"
        try:
            self._launch = Launcher(self.cfg, self.run_id, self.out_dir, notice=self._link.notice, **self._objects)
            await self._launch.open()
            await self._start_attempt(self._resume, "")
        except BaseException:
            self._phase = "failed"
            raise

    async def _restart(self, reason: str, step: int = -1) -> bool:
        """The trainer or the coordinator died (at ``step``; -1: not known): start the run again
        from its last checkpoint. False (nothing done) when restarts are off, used up, or nothing
        is saved; ``RestartError`` — what was lost, when, why the restart failed, the ``--resume``
        line — when the new attempt cannot start (no room for its trainer within
        ``run.restart_wait_s``, say)."""
        run = self.cfg.run
        if run.checkpoint_every <= 0 or self.attempt >= run.max_restarts:
            return False
        found = CheckpointStore(self.out_dir / "checkpoints").latest()
        if found is None:
            return False
        await self._launch.stop_attempt(keep_replicas=self.cfg.run.restart_keeps_replicas)
        self._launch.attempt += 1
        self._resume, self._restart_reason = found, reason
        try:
            await self._start_attempt(found, reason)
        except EngineSetupError as e:
            at = f" at step {step}" if step >= 0 else ""
            raise RestartError(
                f"the run lost a component{at} ({bounded(reason, 400)}) and could not restart from its checkpoint "
                f"at step {found.manifest.step}: {e}; once that is fixed, continue it with --resume {self.out_dir}"
            ) from e
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
                await self._launch.stop_attempt(keep_replicas=self.cfg.run.restart_keeps_replicas)
                self._launch.attempt += 1
                found = CheckpointStore(self.out_dir / "checkpoints").latest() or found
                reason = f"a component died while the previous attempt started: {e}"
                self._resume, self._restart_reason = found, reason
        self._replicas.supervise(self._launch)

    async def close(self) -> None:
        """Stop the run if it is still going, and remove every actor it made."""
        if self._phase != "new":
            self._phase = "closed"
        await self._replicas.cancel()
        if self.coordinator is not None and self.ended is None:
            try:
                data = await asyncio.wait_for(self.coordinator.stop.remote("closed"), 60)
                self.ended = self._codec.decode(data)
            except Exception:  # noqa: BLE001 - closing must go on
                pass
        if self._launch is not None:
            await self._launch.close()
        self.coordinator = None

    # -- the running run (Steering) ----------------------------------------------------
    def events(self) -> AsyncIterator[Event]:
        """Typed events of the run from its start (commands on the bus are skipped), until
        ``RunEnded``; the facts a relay folded into a ``RelayReport`` come one by one, as
        the replicas emitted them. The feed keeps the last 200,000 messages; a reader that falls further
        behind gets a warning with the number it missed. When the run restarts from a
        checkpoint the stream goes on with the new attempt's events (``RunResumed`` first)."""
        return self._steering.events()  # the part's own generator: its warnings name the caller's line

    async def submit(self, intent: Intent) -> Verdict:
        """Put an intent on the bus (``SwitchToRollout``, ``Rebalance``, ``Stop`` …) and return the
        coordinator's verdict once it has handled it: carried out (``verdict.accepted``, true as a
        bool) or refused (``verdict.rejected``: the ``IntentRejected``, with its ``reason`` and
        ``detail``). What it then does (``ModeChanged`` …) arrives in ``events()``. Raises
        ``RunEndedError`` if the run ended before handling it."""
        return await self._steering.submit(intent)

    async def wait(self) -> RunEnded:
        """The run's end, restarting it from its last checkpoint when a component died."""
        return await self._steering.wait()

    async def stop(self, reason: str = "stopped") -> RunEnded:
        """End the run (the finale: final publish, load, validation, checkpoint) and return
        its ``RunEnded``."""
        return await self._steering.stop(reason)

    async def next_batch(self, timeout_s: float = 600.0) -> Batch:
        """The next ready mini-batch (whole groups); rollout keeps running meanwhile.

        Raises ``NoBatchError`` after ``timeout_s`` saying why none is ready (groups still
        generating, the staleness gate waiting for ``publish_weights()``, no replica serving),
        or ``RunEndedError`` once the run is over. Only with ``run.trainer_driver = "user"``: with
        ``"engine"`` it raises ``EngineError`` and takes nothing (the engine trains every batch)."""
        return await self._steering.next_batch(timeout_s)

    async def train(self, batch: Batch, *, loss_fn: str = "") -> StepEnd:
        """One optimizer step on ``batch`` (from :meth:`next_batch`; its ``samples`` may be
        replaced) on the trainer actor — the built-in loss, or ``loss_fn = "module:function"``
        taking a ``shunter.engine.trainer.loss.LossInput``.

        Raises ``UserCodeError`` when the loss fails (the run goes on and the batch may be
        trained again), ``IntentRefused`` for a batch already trained or never handed out,
        ``RunEndedError`` once the run is over; ``EngineError`` unless ``run.trainer_driver = "user"``."""
        return await self._steering.train(batch, loss_fn=loss_fn)

    async def publish_weights(self) -> WeightsReady | None:
        """Publish the trainer's weights as the next version and return its ``WeightsReady``.
        With no optimizer step since the last publish nothing is published: the last
        ``WeightsReady`` is returned (None before the first publish)."""
        return await self._steering.publish_weights()

    async def counters(self) -> dict[str, int]:
        return await self._steering.counters()

    # -- replicas added mid-run (MidRunReplicas) -----------------------------------------
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
        return await self._replicas.add(self._launch, kind, replacing=replacing)

    async def replica_ready(self, replica_id: str) -> ReplicaUp:
        """Wait until a replica added with :meth:`add_replica` is started and announced
        (``EngineSetupError`` if it did not start)."""
        return await self._replicas.ready(replica_id)
