"""``Ending``: how a run's coordinator ends it — what is still in flight is dropped, the run's
summary is taken, and ``RunEnded`` reaches every sink; and the words of the two ends the loop
reports itself, a crash (:func:`crash_error`) and a stall (:func:`stall_error`).

The coordinator holds one ``Ending``, given the parts whose books it closes (state, buffer,
batches, in-flight samples, tally, guard) and the sinks with the coordinator's stamp; it calls
:meth:`Ending.end` once, when the run is over.

Invariants: ``RunEnded`` is delivered once, after a ``GroupDropped(reason="run_end")`` for every
group still in flight or taken and never trained; in careful mode (after a crash) a sink or a
check that fails is skipped and named in the ``RunEnded`` error, so the end reaches every sink
that still works.
"""

from __future__ import annotations

import traceback
from collections import Counter
from typing import TypeVar

from shunter.engine.coordinator.batches import Batches
from shunter.engine.coordinator.buffer import SampleBuffer
from shunter.engine.coordinator.guard import PolicyGuard
from shunter.engine.coordinator.inflight import InFlight
from shunter.engine.coordinator.state import EngineState
from shunter.engine.coordinator.tally import Tally
from shunter.engine.io.errors import bounded, describe
from shunter.engine.io.records import Sink, sink_name
from shunter.events import EngineView, Event, GroupDropped, Message, RunEnded, Stamper, tag_of
from shunter.events.vocab import EndReason

E = TypeVar("E", bound=Event)


class Ending:
    """Closes a run's books and delivers its ``RunEnded`` (see the module docstring)."""

    def __init__(
        self,
        state: EngineState,
        buffer: SampleBuffer,
        batches: Batches,
        inflight: InFlight,
        tally: Tally,
        guard: PolicyGuard,
        sinks: list[Sink],
        stamp: Stamper,
    ) -> None:
        self.state, self.buffer, self.batches, self.inflight = state, buffer, batches, inflight
        self.tally, self.guard, self.sinks, self.stamp = tally, guard, sinks, stamp

    def end(
        self, reason: EndReason, error: str = "", failed_component: str = "", fault: str = "", *, careful: bool = False
    ) -> RunEnded:
        """Drop what is still in flight (``GroupDropped(reason="run_end")``) and deliver
        ``RunEnded``, which it returns. ``careful``: after a crash — a sink or a check that fails
        is skipped and named."""
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
        return self._deliver(ended, careful, notes)

    def _deliver(self, event: E, careful: bool, notes: list[str]) -> E:
        ev = self.stamp(event)
        for sink in self.sinks:
            try:
                sink(ev)
            except Exception as e:  # noqa: BLE001 - careful mode: the other sinks still get it
                if not careful:
                    raise
                note = f"sink {sink_name(sink)} also failed: "
                if not any(n.startswith(note) for n in notes):  # once a sink: a full disk fails every event alike
                    notes.append(note + describe(e, limit=200))
        return ev

    def summary(self) -> dict[str, float]:
        """The run's totals (``RunEnded.summary``)."""
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


def crash_error(exc: Exception, stage: str | Sink, current: Message | None) -> tuple[str, str]:
    """A crash of the loop in words: (the ``RunEnded`` error — the stage, the message being
    handled, the cause and where it was raised; the ``fault`` — the stage and the message)."""
    on = f"{tag_of(current)} (seq {current.seq} from {current.source or '?'})" if current is not None else "the opening"
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
    named = stage if isinstance(stage, str) else f"sink:{sink_name(stage)}"
    return f"coordinator loop failed in {named} while handling {on}: {describe(exc)}{where}", f"{named} on {on}"


def stall_error(v: EngineView, stall_s: float) -> str:
    """A stall in words: nothing in flight and no message for ``stall_s`` — what the run was waiting in."""
    modes = Counter(r.mode for r in v.replicas)
    return (
        f"stalled: nothing in flight and no message for {stall_s:.0f}s (run.stall_timeout_s) — the "
        f"policy asked for nothing more: trainer {v.trainer.state} at step {v.trainer.step} (version "
        f"{v.trainer.version}, {v.trainer.steps_since_publish} steps since), {v.buffer.ready_batches} "
        f"mini-batches ready, staleness gate {'open' if v.buffer.gate_open else 'closed'}, replicas "
        + ", ".join(f"{n} {m}" for m, n in sorted(modes.items()))
    )
