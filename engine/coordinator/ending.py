"""How a run's coordinator ends it: ``end`` (drop what is in flight, emit ``RunEnded`` with the
run's summary), the report of a crash in the loop (``_crash``: the stage, the message, the cause)
and the report of a stall (``_stalled``).

``CoordinatorEnd`` is a mixin of ``shunter.engine.coordinator.coordinator.Coordinator``: the attributes declared on
it are the coordinator's, set in ``Coordinator.__init__``. Invariants: ``RunEnded`` is emitted
once, after a ``GroupDropped(reason="run_end")`` for every group still in flight or taken and
never trained; in careful mode (after a crash) a sink or a check that fails is skipped and named
in the ``RunEnded`` error, so the end reaches every sink that still works.
"""

from __future__ import annotations

import asyncio
import traceback
from collections import Counter
from typing import TYPE_CHECKING, TypeVar

from shunter.engine.coordinator.batches import Batches
from shunter.engine.coordinator.buffer import SampleBuffer
from shunter.engine.coordinator.executor import Executor
from shunter.engine.coordinator.finale import Finale
from shunter.engine.coordinator.guard import PolicyGuard
from shunter.engine.coordinator.inflight import InFlight
from shunter.engine.coordinator.state import EngineState
from shunter.engine.coordinator.supervisor import Supervisor
from shunter.engine.coordinator.tally import Tally
from shunter.engine.io.errors import bounded, describe
from shunter.events import EngineView, Event, GroupDropped, Message, RunEnded, Stamper, tag_of
from shunter.events.vocab import EndReason

if TYPE_CHECKING:
    from shunter.engine.coordinator.coordinator import Sink

E = TypeVar("E", bound=Event)


def _sink_name(sink: Sink) -> str:
    return getattr(sink, "__qualname__", None) or type(sink).__name__


class CoordinatorEnd:
    """The ``Coordinator``'s end (a mixin; the attributes below are the coordinator's)."""

    ended: RunEnded | None
    state: EngineState
    buffer: SampleBuffer
    batches: Batches
    finale: Finale
    guard: PolicyGuard
    inflight: InFlight
    tally: Tally
    supervisor: Supervisor
    executor: Executor
    sinks: list[Sink]
    stamp: Stamper
    _inbox: asyncio.Queue[Message | object]
    _current: Message | None
    _stage: str | Sink

    if TYPE_CHECKING:

        def view(self) -> EngineView: ...

    def _stalled(self, stall: float) -> None:
        quiet = self.executor.pending() == 0 and self._inbox.empty() and not self.supervisor.busy
        if self.state.trainer_driver == "engine" and quiet:
            v = self.view()
            modes = Counter(r.mode for r in v.replicas)
            self.end(
                "error",
                error=f"stalled: nothing in flight and no message for {stall:.0f}s (run.stall_timeout_s) — the "
                f"policy asked for nothing more: trainer {v.trainer.state} at step {v.trainer.step} (version "
                f"{v.trainer.version}, {v.trainer.steps_since_publish} steps since), {v.buffer.ready_batches} "
                f"mini-batches ready, staleness gate {'open' if v.buffer.gate_open else 'closed'}, replicas "
                + ", ".join(f"{n} {m}" for m, n in sorted(modes.items())),
            )

    # -- the end -------------------------------------------------------------------------------
    def end(
        self, reason: EndReason, error: str = "", failed_component: str = "", fault: str = "", *, careful: bool = False
    ) -> None:
        """Drop what is still in flight (``GroupDropped(reason="run_end")``) and emit
        ``RunEnded``. ``careful``: after a crash — a sink or a check that fails is skipped."""
        if self.ended is not None:
            return
        self.finale.phase = "ended"
        notes: list[str] = []
        for b in self.batches.untrained():  # taken, never trained: they count as dropped
            self.buffer.forfeit(len(b.group_ids))
            for gid in b.group_ids:
                self._deliver(
                    GroupDropped(group_id=gid, reason="run_end", samples=self.state.n_samples_per_prompt),
                    careful,
                    notes,
                )
        for g in self.buffer.drop_all("run_end"):
            self._deliver(GroupDropped(group_id=g.group_id, reason="run_end", samples=len(g.samples)), careful, notes)
        try:
            self.buffer.check()
            summary = self.summary()
        except Exception as e:  # noqa: BLE001 - only reached while ending after a crash
            if not careful:
                raise
            notes.append(f"the books did not balance: {describe(e)}")
            summary = {}
        text = bounded("; ".join([error, *notes]) if notes else error)
        ended = RunEnded(
            reason=reason,
            steps=self.state.trainer.step,
            summary=summary,
            error=text,
            failed_component=failed_component,
            fault=fault,
        )
        self.ended = self._deliver(ended, careful, notes)

    def _deliver(self, event: E, careful: bool, notes: list[str]) -> E:
        ev = self.stamp(event)
        for sink in self.sinks:
            try:
                sink(ev)
            except Exception as e:  # noqa: BLE001 - careful mode: the other sinks still get it
                if not careful:
                    raise
                notes.append(f"sink {_sink_name(sink)} also failed: {describe(e, limit=200)}")
        return ev

    def _crash(self, exc: Exception) -> None:
        msg = self._current
        on = f"{tag_of(msg)} (seq {msg.seq} from {msg.source or '?'})" if msg is not None else "the opening"
        frames = traceback.extract_tb(exc.__traceback__)
        where = (
            f" at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
        )
        stage = self._stage if isinstance(self._stage, str) else f"sink:{_sink_name(self._stage)}"
        fault = f"{stage} on {on}"
        self.end(
            "error",
            error=f"coordinator loop failed in {stage} while handling {on}: {describe(exc)}{where}",
            fault=fault,
            careful=True,
        )

    def summary(self) -> dict[str, float]:
        t = self.state.trainer
        extra = {"coordinator/policy_failures": float(self.guard.failures)} if self.guard.failures else {}
        if self.inflight.moved:
            extra["rollout/moved_to_lane"] = float(self.inflight.moved)
        if self.inflight.spread:
            extra["rollout/spread_at_end"] = float(self.inflight.spread)
        data_metrics = getattr(self.inflight.prompts, "metrics", None)  # a dataset's stream
        if callable(data_metrics):
            extra.update(data_metrics())
        return self.tally.summary(steps=t.step, version=t.version, buffer=self.buffer.counters(), extra=extra)
