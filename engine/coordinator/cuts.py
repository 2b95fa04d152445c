"""``CheckpointCuts``: when the coordinator cuts a checkpoint, and how it commits one.

Invariants: a cut is taken only right after a publish (no optimizer step since, so the
trainer holds exactly the weights of the current version) and only one at a time; the
coordinator writes its snapshot into a staging folder first, then orders the trainer's part
(``SaveCheckpoint``, queued ahead of any later train step); ``TrainerStateSaved`` for that
folder commits it atomically (``CheckpointSaved``). A checkpoint that cannot be written or
committed is reported as ``CommandFailed`` and the previous one stays the one to resume from —
except when the policy's own state cannot be saved: that would lose every checkpoint of the
run, so the run ends at the first cut, naming the policy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from shunter.engine.coordinator import snapshot as snapshot_mod
from shunter.engine.coordinator.executor import TRAINER as TRAINER_TARGET
from shunter.engine.coordinator.executor import Executor
from shunter.engine.coordinator.state import TrainerState
from shunter.engine.io.checkpoint import CheckpointStore
from shunter.engine.io.errors import describe
from shunter.events import CheckpointSaved, CommandFailed, Event, SaveCheckpoint, TrainerStateSaved


class CheckpointCuts:
    def __init__(
        self,
        store: CheckpointStore | None,
        every: int,
        executor: Executor,
        *,
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
        self.final_tried = False

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
        try:
            staging = self.store.staging(trainer.step)
            (staging / snapshot_mod.SNAPSHOT_FILE).write_bytes(snapshot_mod.encode(snapshot()))
        except snapshot_mod.PolicyStateError as e:  # every later checkpoint would fail alike: stop here
            self.fatal(f"checkpoint at step {trainer.step}: {e}")
            return False
        except Exception as e:  # noqa: BLE001 - a checkpoint that cannot be written is reported, not fatal
            self.emit(CommandFailed(command_kind="checkpoint.write", target="coordinator", error=describe(e)))
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
            self.emit(CommandFailed(command_kind="checkpoint.commit", target="coordinator", error=describe(e)))
            return
        self.last_step = ev.step
        self.emit(
            CheckpointSaved(
                step=ev.step,
                version=ev.version,
                path=str(path),
                nbytes=manifest.nbytes,
                duration_s=ev.duration_s + time.perf_counter() - t0,
            )
        )

    def failed(self) -> None:
        """The trainer could not write its part: the previous checkpoint stays usable."""
        self.pending = ""

    def final(self, trainer: TrainerState, snapshot: Callable[[], snapshot_mod.CoordinatorSnapshot]) -> bool:
        """At the end of a run with checkpoints on: save the final state once (True while it
        is being written)."""
        if self.pending:
            return True
        if self.final_tried or trainer.step <= self.last_step:
            return False
        self.final_tried = True
        return self.maybe_cut(trainer, snapshot, final=True)
