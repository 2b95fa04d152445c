"""``Batches``: mini-batches from the buffer to the trainer, each trained at most once.

Invariants:

- one ``BatchReady`` per mini-batch that becomes formable, in taking order (:meth:`announce`);
- a batch leaves the buffer once (:meth:`take`); groups the staleness rule drops on the way
  are reported (``GroupDropped(reason="stale")``);
- a batch handed to a user's loop can be trained once: :meth:`trainable` refuses an unknown
  batch id and one already trained; a step that failed in the user's own loss leaves its
  batch trainable again (:meth:`failed`);
- at most one batch is on the trainer at a time (:attr:`training`).
"""

from __future__ import annotations

from collections.abc import Callable

from shunter.engine.coordinator.buffer import SampleBuffer
from shunter.engine.coordinator.dispatcher import Dispatcher
from shunter.engine.coordinator.state import EngineState
from shunter.events import Batch, BatchReady, Event, GroupDropped
from shunter.events.vocab import RejectReason


class Batches:
    def __init__(self, buffer: SampleBuffer, state: EngineState, emit: Callable[[Event], object]) -> None:
        self.buffer = buffer
        self.state = state
        self.emit = emit
        self.announced = 0
        self.handed: dict[int, Batch] = {}
        """Batches given to a user's loop and not trained yet."""
        self.trained: dict[int, int] = {}
        """batch id -> the optimizer step that trained it."""
        self.training: Batch | None = None

    def announce(self) -> None:
        """One ``BatchReady`` per mini-batch that became formable since the last call."""
        version = self.state.trainer.version
        if self.buffer.most_batches() <= self.announced or self.buffer.ready_batches(version) <= self.announced:
            return  # nothing new (a count, or the plan kept since the buffer last changed)
        for k, groups in enumerate(self.buffer.formable(skip=self.announced, version=version), start=self.announced):
            self.announced += 1
            min_v = min(g.min_version for g in groups)
            self.emit(
                BatchReady(
                    batch_id=self.buffer.batches_taken + k,
                    samples=sum(len(g.samples) for g in groups),
                    groups=len(groups),
                    min_version=min_v,
                    max_staleness=version - min_v,
                )
            )

    def take(self) -> Batch | None:
        """The next mini-batch out of the buffer (None if none is ready)."""
        batch, dropped = self.buffer.take(self.state.trainer.version)
        for g in dropped:
            self.emit(GroupDropped(group_id=g.group_id, reason="stale", samples=len(g.samples)))
        if batch is not None:
            self.announced = max(0, self.announced - 1)
        return batch

    def hand_out(self) -> Batch | None:
        """The next mini-batch for a user's loop; it stays known until trained."""
        batch = self.take()
        if batch is not None:
            self.handed[batch.batch_id] = batch
        return batch

    def trainable(self, batch_id: int) -> tuple[RejectReason, str] | None:
        """Why ``batch_id`` cannot be trained now (None: it can)."""
        if batch_id in self.trained:
            return "already_trained", f"batch {batch_id} was trained at step {self.trained[batch_id]}"
        if batch_id not in self.handed:
            return "unknown_batch", f"batch {batch_id} was never handed out by next_batch()"
        return None

    def begin(self, batch: Batch) -> None:
        self.training = batch
        self.handed.pop(batch.batch_id, None)

    def done(self, batch_id: int, step: int) -> None:
        self.trained[batch_id] = step
        if self.training is not None and self.training.batch_id == batch_id:
            self.training = None

    def untrained(self) -> list[Batch]:
        """Batches out of the buffer that no optimizer step trained (handed to a user, or on the
        trainer when the run ended)."""
        out = list(self.handed.values())
        if self.training is not None:
            out.append(self.training)
        return out

    def failed(self, batch_id: int) -> None:
        """The step on ``batch_id`` failed in the user's code: the user may train it again."""
        if self.training is not None and self.training.batch_id == batch_id:
            self.handed[batch_id] = self.training
            self.training = None

    def why_none(self, dispatcher: Dispatcher) -> str:
        """Why no mini-batch is ready while the run goes on, in the words a user acts on."""
        b, t = self.buffer, self.state.trainer
        if not dispatcher.active() and not b.in_flight:
            return (
                "no replica is serving rollout (all asleep beside the trainer or down): switch one with "
                "SwitchToRollout or add one with add_replica()"
            )
        serving = dispatcher.serving_version()
        v = t.version if serving is None else serving
        if b.capacity(v) <= 0 and not b.in_flight:
            return (
                f"the staleness gate is closed: {b.dispatched - sum(b.dropped.values())} groups started, the "
                f"most the gate allows on version {v} ({_gate_field(b)}); it opens when weights "
                f"are published (publish_weights() after training; {t.steps_since_publish} steps since version "
                f"{t.version})"
            )
        return (
            f"{b.in_flight} prompt groups are still generating ({b.ready_samples} of "
            f"{self.state.ppo_mini_batch_size} samples of the next mini-batch are ready)"
        )


def _gate_field(b: SampleBuffer) -> str:
    """The setting that bounds the gate, as the user wrote it."""
    if b.admit_staleness < b.max_staleness:
        return f"rollout.admit_staleness = {b.admit_staleness}"
    return f"rollout.max_staleness = {b.max_staleness}"
