"""What the outside asks a run's coordinator between two turns of its loop: the next mini-batch
for a user's training loop (``take_batch``), why there is none (``why_no_batch``), and the view
of the run the policy and the facade see (``view``).

``CoordinatorCalls`` is a mixin of ``shunter.engine.coordinator.coordinator.Coordinator``: the attributes declared
on it are the coordinator's, set in ``Coordinator.__init__``. Invariant: a direct call runs
under the loop's fault barrier (an error in it ends the run as a crash of the loop would), and
one that ended the run wakes the loop (``_WAKE``) so it returns ``RunEnded``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from shunter.engine.coordinator.batches import Batches
from shunter.engine.coordinator.buffer import SampleBuffer
from shunter.engine.coordinator.dispatcher import Dispatcher
from shunter.engine.coordinator.finale import Finale
from shunter.engine.coordinator.inflight import InFlight
from shunter.engine.coordinator.state import EngineState
from shunter.events import Batch, BufferView, EngineView, Message, RunEnded

if TYPE_CHECKING:
    from shunter.engine.coordinator.coordinator import Sink

_WAKE = object()  # wakes the loop after a direct call ended the run


class CoordinatorCalls:
    """The ``Coordinator``'s direct calls (a mixin; the attributes below are the coordinator's)."""

    ended: RunEnded | None
    state: EngineState
    buffer: SampleBuffer
    batches: Batches
    dispatcher: Dispatcher
    finale: Finale
    inflight: InFlight
    _inbox: asyncio.Queue[Message | object]
    _opened: bool
    _current: Message | None
    _stage: str | Sink

    if TYPE_CHECKING:

        def _settle(self) -> None: ...

        def _crash(self, exc: Exception) -> None: ...

    # -- a user's loop (run.trainer_driver = "user") --------------------------------------------
    def take_batch(self) -> Batch | None:
        """The next ready mini-batch for a user's loop (None if none is ready). Runs between
        two turns of the loop, under the same fault barrier."""
        if self.ended is not None or not self._opened:
            return None
        batch = None
        try:
            self._current = None
            self._stage = "take_batch"
            batch = self.batches.hand_out()
            self._settle()
        except Exception as e:  # noqa: BLE001 - the fault barrier, as in run()
            self._crash(e)
        if self.ended is not None:
            self._inbox.put_nowait(_WAKE)
        return batch

    def why_no_batch(self) -> str:
        """Why no mini-batch is ready, in the words a user needs to act on it."""
        if self.ended is not None:
            e = self.ended
            return f"the run ended ({e.reason}" + (f": {e.error})" if e.error else ")")
        if self.finale.finishing:
            return "the run is ending (total_steps reached or Stop): no new groups start"
        if self.inflight.exhausted and not self.buffer.in_flight:
            return (
                f"the dataset is exhausted (data.epochs): {self.inflight.prompts_taken} prompts taken, "
                f"{self.buffer.ready} ready groups do not fill a mini-batch"
            )
        return self.batches.why_none(self.dispatcher)

    def view(self) -> EngineView:
        b, t = self.buffer, self.state.trainer
        serving = self.dispatcher.serving_version()
        # with no replica serving, whether a replica switched in (on current weights) could start work
        gate = b.capacity(t.version if serving is None else serving) > 0
        bv = BufferView(
            ready_samples=b.ready_samples,
            ready_batches=b.ready_batches(t.version),
            in_flight_groups=b.in_flight,
            in_flight_samples=self.dispatcher.total_in_flight,
            dispatched_groups=b.dispatched,
            trained_groups=b.trained,
            dropped_groups=sum(b.dropped.values()),
            gate_open=gate and not self.finale.finishing,
            pending_resumes=len(self.inflight.resumes) + len(self.inflight.tail_resumes),
        )
        return self.state.view(bv, self.dispatcher.in_flight)
