"""``CheckpointCuts``: when the coordinator cuts a checkpoint, and how it commits one.

Invariants: a cut is taken only right after a publish (no optimizer step since, so the
trainer holds exactly the weights of the current version) and only one at a time; the
coordinator writes its snapshot into a staging folder first, then orders the trainer's part
(``SaveCheckpoint``, queued ahead of any later train step); ``TrainerStateSaved`` for that
folder commits it atomically (``CheckpointSaved``). A checkpoint that cannot be written or
committed is reported as ``CommandFailed``, its staging folder removed, and the previous one
stays the one to resume from; it is tried again at the next publish (the only moment the trainer
holds exactly a published version) — in the finale, at once — and after
``run.checkpoint_retries`` failed tries in a row the run ends with an error naming the folder,
the OS error and the last good checkpoint with its ``--resume`` line: a run whose checkpoints
silently stopped would lose everything since the last one at its next fault. The policy's own
state that cannot be saved ends the run at the first cut (every later cut would fail alike),
naming the policy.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from shunter.engine.coordinator import snapshot as snapshot_mod
from shunter.engine.coordinator.executor import TRAINER as TRAINER_TARGET
from shunter.engine.coordinator.executor import Executor
from shunter.engine.coordinator.state import TrainerState
from shunter.engine.io.checkpoint import CheckpointStore
from shunter.engine.io.errors import describe
from shunter.events import CheckpointSaved, CommandFailed, Event, SaveCheckpoint, TrainerStateSaved, tag_of


class CheckpointCuts:
    def __init__(
        self,
        store: CheckpointStore | None,
        every: int,
        executor: Executor,
        *,
        retries: int = 2,
        run_id: str,
        emit: Callable[[Event], object],
        fatal: Callable[[str], None] = lambda error: None,
    ) -> None:
        self.fatal = fatal
        """Ends the run: a policy whose state cannot be saved would lose every checkpoint."""
        self.store = store
        self.every = every
        self.executor = executor
        self.run_id = run_id
        self.emit = emit
        self.last_step = 0
        """Step of the last committed (or restored) checkpoint."""
        self.pending = ""
        """Staging folder of the checkpoint being written."""
        self.pending_step = 0
        """Step of the checkpoint being written, or of the last try."""
        self.reported = False
        """A failure of the coordinator's own part is emitted but not yet applied (counted)."""
        self.retries = retries
        """Failed tries in a row after which the run ends (``run.checkpoint_retries``)."""
        self.failures = 0
        """Failed tries in a row (a committed checkpoint resets it)."""
        self.final_tries = 0

    @property
    def enabled(self) -> bool:
        return self.store is not None and self.every > 0

    def maybe_cut(
        self, trainer: TrainerState, snapshot: Callable[[], snapshot_mod.CoordinatorSnapshot], *, final: bool = False
    ) -> bool:
        """Cut a checkpoint now if one is due (right after a publish); True if one was started."""
        if (
            self.store is None
            or not self.enabled
            or self.pending
            or trainer.step <= self.last_step
            or trainer.steps_since_publish
        ):
            return False
        if not final and trainer.step - self.last_step < self.every:
            return False
        self.pending_step = trainer.step
        try:
            staging = self.store.staging(trainer.step)
            (staging / snapshot_mod.SNAPSHOT_FILE).write_bytes(snapshot_mod.encode(snapshot()))
        except snapshot_mod.PolicyStateError as e:  # every later checkpoint would fail alike: stop here
            self.fatal(f"checkpoint at step {trainer.step}: {e}")
            return False
        except Exception as e:  # noqa: BLE001 - reported; fatal only after run.checkpoint_retries tries
            self._report("checkpoint.write", describe(e), self.store.staging_path(trainer.step))
            return False
        self.pending = str(staging)
        self.executor.send(TRAINER_TARGET, SaveCheckpoint(step=trainer.step, path=str(staging)))
        return True

    def commit(self, ev: TrainerStateSaved) -> None:
        if not self.pending or ev.path != self.pending or self.store is None:
            return
        self.pending = ""
        t0 = time.perf_counter()
        try:
            path, manifest = self.store.commit(Path(ev.path), run_id=self.run_id, step=ev.step, version=ev.version)
        except Exception as e:  # noqa: BLE001 - the previous checkpoint stays the one to resume from
            self._report("checkpoint.commit", describe(e), Path(ev.path))
            return
        self.last_step, self.failures = ev.step, 0
        self.emit(
            CheckpointSaved(
                step=ev.step,
                version=ev.version,
                path=str(path),
                nbytes=manifest.nbytes,
                duration_s=ev.duration_s + time.perf_counter() - t0,
            )
        )

    def failed(self, ev: CommandFailed) -> None:
        """A try failed — the trainer's part (``SaveCheckpoint``) or the coordinator's
        (``checkpoint.write`` / ``checkpoint.commit``, emitted by :meth:`_report`) — as recorded:
        counted here, where its event is applied, so the run's error comes after it in the log.
        The previous checkpoint stays usable; past ``run.checkpoint_retries`` failures in a row the
        run ends."""
        if ev.command_kind == tag_of(SaveCheckpoint):
            if not self.pending:
                return
            if self.store is not None:
                self.store.discard(self.pending)
            self.pending = ""
        self.reported = False
        self.failures += 1
        if self.failures > self.retries:
            self.fatal(self.given_up(self.pending_step, ev.error))

    def _report(self, kind: str, error: str, staging: Path) -> None:
        """The coordinator's own part of a try failed: its staging folder removed, the failure
        emitted (and counted when applied: :meth:`failed`)."""
        self.pending, self.reported = "", True
        if self.store is not None:
            self.store.discard(staging)
        self.emit(CommandFailed(command_kind=kind, target="coordinator", error=error))

    def given_up(self, step: int, error: str) -> str:
        """The run's error after ``run.checkpoint_retries`` failed tries: the folder, the OS
        error, the room left on its disk against a checkpoint's size, the last good checkpoint and
        how to go on from it. (A full disk does not always say ENOSPC: torch's writer reports it as
        ``unexpected pos``; the free space says it.)"""
        assert self.store is not None
        tries = f"{self.failures} tries in a row; run.checkpoint_retries = {self.retries}"
        text = f"checkpoint at step {step} could not be saved in {self.store.root} ({tries}): {error}"
        try:
            found = self.store.latest()
        except Exception as e:  # noqa: BLE001 - the folder itself may be unreadable now
            return f"{text}; the last good checkpoint cannot be told ({describe(e, limit=200)})"
        room = disk_room(self.store.root, found.manifest.nbytes if found is not None else 0)
        if found is None:
            return f"{text}{room}; no checkpoint of this run was saved, so there is nothing to resume from"
        return (
            f"{text}{room}; the last good checkpoint is step {found.manifest.step} ({found.path}): once the folder "
            f"is writable and its disk has room, continue with --resume {self.store.root.parent}"
        )

    def final(self, trainer: TrainerState, snapshot: Callable[[], snapshot_mod.CoordinatorSnapshot]) -> bool:
        """At the end of a run with checkpoints on: save the final state (True while it is
        being written or a failed try is being counted), tried again at once when a try fails,
        within ``run.checkpoint_retries`` (the run ends with the error past them)."""
        if self.pending or self.reported:
            return True
        if trainer.step <= self.last_step or self.final_tries > self.retries:
            return False
        self.final_tries += 1
        self.maybe_cut(trainer, snapshot, final=True)
        return bool(self.pending) or self.reported


CHECKPOINT_KINDS = frozenset({"checkpoint.write", "checkpoint.commit", tag_of(SaveCheckpoint)})
"""``CommandFailed.command_kind`` of a failed checkpoint try (the coordinator's parts, the trainer's)."""


def disk_room(folder: Path, checkpoint_bytes: int) -> str:
    """``"; its disk has 3.3 MB free, a checkpoint takes 5.9 MB: the disk is full"``-style text
    (empty when the disk cannot be asked)."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return ""
    text = f"; its disk has {free / 1e6:.1f} MB free"
    if checkpoint_bytes:
        text += f", a checkpoint takes {checkpoint_bytes / 1e6:.1f} MB"
        if free < checkpoint_bytes:
            text += ": the disk is full"
    return text
