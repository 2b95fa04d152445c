"""``Coordinator``: the one consumer loop of a run, and its one fault barrier.

Every message is handled by the same numbered steps, in arrival order, by one coroutine:

    1. record   the message goes to every sink (event log, logs, metrics, feed)
    2. apply    an event changes the state (``engine/coordinator/apply.py``); an intent from a user is
                carried out (``engine/coordinator/intents.py``)
    3. decide   ``PolicyGuard`` asks the policy (``engine/coordinator/guard.py``); each intent it returns
                is recorded and carried out — while the run goes on as usual; once it
                stops, less and then not at all (``_consults``: a slow policy cannot hold up
                a stop)
    4. pump     start new groups and resume partial samples (``engine/coordinator/inflight.py``) — once
                per batch of messages that arrived together (``handle_many``), after all of them
    5. finale   once the run should end, move it towards ``RunEnded`` (``engine/coordinator/finale.py``)

A ``RelayReport`` (``engine/coordinator/relay.py``) is recorded once and its facts are then applied, decided
on and drained one by one, exactly as if each had come alone.

Events the coordinator derives on the way (``GroupDropped``, ``BatchReady``, ``IntentRejected``
…) are handled before the next message from outside.

Invariants: nothing inside the loop awaits a component (the executor reports back with
events); the policy sees ``RunStarted`` / ``RunResumed`` first — setup facts from the opening
are recorded and applied before it, never handed to the policy; and any exception anywhere
in the loop ends the run with ``RunEnded(reason="error")`` naming the stage, the message
being handled and the cause — written to every sink that still works — instead of a loop
that dies silently.

The coordinator is built from parts, each an object of its own handed the others it needs here,
once, in :meth:`Coordinator.__init__` — no part finds another any other way: the samples in
flight (``InFlight``), the mini-batches (``Batches``), the policy's guard (``PolicyGuard``), the
checkpoint cuts (``CheckpointCuts``), the intents (``Intents``), the finale (``Finale``), the
replica supervisor (``Supervisor``), the ``Applier`` that applies events to them all, and the
``Ending`` that closes the books. Between two turns of the loop it answers direct calls
(``take_batch``, ``why_no_batch``, ``view``) under the same fault barrier; a call that ended the
run wakes the loop (``_WAKE``) so it returns ``RunEnded``. A user's intent posted with ``submit``
gets its verdict once handled — carried out or refused — or the run's ``RunEnded`` if it never is.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterator

from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.coordinator import snapshot as snapshot_mod
from shunter.engine.coordinator.apply import Applier
from shunter.engine.coordinator.batches import Batches
from shunter.engine.coordinator.buffer import SampleBuffer
from shunter.engine.coordinator.cuts import CheckpointCuts
from shunter.engine.coordinator.dispatcher import Dispatcher
from shunter.engine.coordinator.ending import Ending, crash_error, stall_error
from shunter.engine.coordinator.executor import Executor
from shunter.engine.coordinator.finale import Finale
from shunter.engine.coordinator.guard import PolicyGuard
from shunter.engine.coordinator.inflight import InFlight
from shunter.engine.coordinator.intents import Intents
from shunter.engine.coordinator.state import EngineState
from shunter.engine.coordinator.supervisor import Supervisor
from shunter.engine.coordinator.tally import Tally
from shunter.engine.io.checkpoint import CheckpointStore
from shunter.engine.io.records import Sink
from shunter.events import (
    Batch,
    BufferView,
    EngineView,
    Event,
    EventRejected,
    Intent,
    LoopIdle,
    Message,
    PromptSpec,
    RelayReport,
    RunEnded,
    RunResumed,
    RunStarted,
    Stamper,
    Stop,
    tag_of,
)
from shunter.events.vocab import EndReason
from shunter.policies import Policy
from shunter.policies.base import SAMPLE_EVENTS

_WAKE = object()  # wakes the loop after a direct call ended the run


class Coordinator:
    BATCH = 256
    """At most this many queued messages are handled as one batch (one ``pump``)."""

    def __init__(
        self,
        cfg: EngineConfig,
        policy: Policy,
        executor: Executor,
        prompts: Iterator[PromptSpec],
        *,
        run_id: str,
        validation_prompts: list[PromptSpec] | None = None,
        sinks: list[Sink] | None = None,
        clock: Callable[[], float] = time.time,
        checkpoints: CheckpointStore | None = None,
        inbox: asyncio.Queue[Message | object] | None = None,
    ) -> None:
        """``inbox``: the queue messages from outside wait in (a simulation passes one that
        charges the loop's CPU time to its virtual clock); a plain ``asyncio.Queue`` by default."""
        self.cfg, self.policy, self.executor, self.clock = cfg, policy, executor, clock
        self.sinks: list[Sink] = list(sinks or [])
        self.stamp = Stamper(run_id, "coordinator", clock)
        self.policy_stamp = Stamper(run_id, "policy", clock)
        self.state = EngineState.for_run(cfg, run_id)
        self.buffer = SampleBuffer.for_run(cfg)
        self.dispatcher = Dispatcher()
        self.tally = Tally(clock)
        # the parts, each handed the others it needs — here, once (see the module docstring)
        self.inflight = InFlight(
            self.state,
            self.buffer,
            self.dispatcher,
            executor,
            prompts,
            cfg.sampling(),
            cfg.rollout.n_samples_per_prompt,
        )
        if self.state.trainer_driver == "engine":  # the run trains this many groups, no more
            self.inflight.groups_wanted = cfg.run.total_steps * cfg.groups_per_mini_batch
        self.inflight.spread_at_end = cfg.rollout.spread_at_end
        self.batches = Batches(self.buffer, self.state, self.emit)
        self.guard = PolicyGuard(
            self.policy,
            emit=self.emit,
            max_failures=cfg.run.policy_max_failures,
            budget_ms=cfg.run.policy_budget_ms,
            timeout_s=cfg.run.policy_timeout_s,
        )
        self.cuts = CheckpointCuts(
            checkpoints,
            cfg.run.checkpoint_every,
            executor,
            retries=cfg.run.checkpoint_retries,
            run_id=self.state.run_id,
            emit=self.emit,
            fatal=lambda error: self.end("error", error=error),
        )
        self.intents = Intents(
            self.state,
            self.dispatcher,
            self.batches,
            executor,
            self.inflight,
            emit=self.emit,
            stop=self.stop,
            loss_fn=cfg.trainer.loss_fn,
            validation_prompts=list(validation_prompts or []),
            group_size=cfg.rollout.n_samples_per_prompt,
        )
        self.finale = Finale(
            self.state,
            self.intents,
            self.issue,
            self.cuts,
            validate=cfg.validation.every > 0,
            snapshot=self.snapshot,
            end=self.end,
        )
        self.supervisor = Supervisor(
            self.state, restarts=cfg.rollout.replica_restarts, backoff_s=cfg.rollout.replica_restart_backoff_s
        )
        self.applier = Applier(
            cfg,
            self.state,
            self.buffer,
            self.dispatcher,
            self.inflight,
            self.batches,
            self.intents,
            self.cuts,
            self.finale,
            self.tally,
            self.supervisor,
            emit=self.emit,
            end=self.end,
            snapshot=self.snapshot,
        )
        self.ending = Ending(
            self.state,
            self.buffer,
            self.batches,
            self.inflight,
            self.tally,
            self.guard,
            self.sinks,
            self.stamp,
        )
        self.ended: RunEnded | None = None
        self._inbox: asyncio.Queue[Message | object] = inbox if inbox is not None else asyncio.Queue()
        self._derived: deque[Event] = deque()
        self._opened = False
        self._resumed: RunResumed | None = None
        self._stage: str | Sink = "open"
        self._current: Message | None = None
        self._idle = False
        self._stop_posted = False
        self._verdicts: dict[tuple[str, int], asyncio.Future[Message]] = {}  # (source, seq) -> its verdict (submit)
        executor.bind(self.post_many)

    # -- inputs ----------------------------------------------------------------------------
    def post(self, msg: Message) -> None:
        if msg.__class__ is Stop:  # known at once, handled in its turn: the backlog before it hurries
            self._stop_posted = True
        self._inbox.put_nowait(msg)

    def post_many(self, msgs: list[Message]) -> None:
        for m in msgs:
            self._inbox.put_nowait(m)

    def emit(self, event: Event) -> Event:
        """An event the coordinator itself derived; handled before the next inbox item. Returns
        it as stamped."""
        stamped = self.stamp(event)
        self._derived.append(stamped)
        return stamped

    def submit(self, intent: Intent) -> asyncio.Future[Message]:
        """Post a user's intent (stamped by the caller); the future holds the verdict once the
        loop has handled it: the intent itself if it was carried out, its ``IntentRejected`` if
        it was refused, or the ``RunEnded`` of a run that ended before handling it."""
        verdict: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        if self.ended is not None:
            verdict.set_result(self.ended)
            return verdict
        self._verdicts[(intent.source, intent.seq)] = verdict
        self.post(intent)
        return verdict

    def issue(self, intent: Intent) -> None:
        """An intent of the coordinator's own (the finale's): recorded and carried out like the policy's."""
        intent = self.stamp(intent)
        self._record(intent)
        self.intents.carry_out(intent)

    def stop(self, reason: str) -> None:
        """End the run (a ``Stop`` intent): nothing new starts; the finale takes over."""
        self.finale.begin(reason or "stopped")

    # -- the loop ------------------------------------------------------------------------------
    async def run(self) -> RunEnded:
        try:
            self._open()
            stall = self.cfg.run.stall_timeout_s
            while self.ended is None:
                if self._inbox.empty() and self.executor.pending() == 0 and not self._idle:
                    self._idle = True  # once per quiet period: the policy may act on the view
                    self.emit(LoopIdle(in_flight=self.dispatcher.total_in_flight))
                    self._settle()
                    continue
                if self._inbox.empty():
                    try:
                        first = await asyncio.wait_for(self._inbox.get(), stall)
                    except TimeoutError:
                        self._stalled(stall)
                        continue
                else:  # no timer needed (an inbox may still make the loop wait: the simulator's charges time)
                    first = await self._inbox.get()
                batch = [first]
                while len(batch) < self.BATCH and not self._inbox.empty():
                    batch.append(self._inbox.get_nowait())
                msgs = [m for m in batch if isinstance(m, Message)]
                if msgs:
                    self._idle = False
                    self.handle_many(msgs)
        except Exception as e:  # noqa: BLE001 - the one fault barrier: any error ends the run, said so
            self._crash(e)
        assert self.ended is not None
        return self.ended

    def _open(self) -> None:
        """Setup facts (replicas up, ranks, placement) are recorded and applied; then the policy
        sees the run begin — ``RunResumed`` for an attempt from a checkpoint, else ``RunStarted``."""
        while not self._inbox.empty():
            msg = self._inbox.get_nowait()
            if isinstance(msg, Message):
                self._step(msg)
            self._drain()
        opening = self._resumed or RunStarted(
            policy=self.guard.name, replicas=len(self.state.replicas), trainer_driver=self.state.trainer_driver
        )
        self._opened = True
        self.emit(opening)
        if self._resumed is not None:
            self.applier.restored()
        self._settle()

    def handle(self, msg: Message) -> None:
        """One message from outside, then everything it derived, then the finale."""
        self.handle_many([msg])

    def handle_many(self, msgs: list[Message]) -> None:
        """Messages that arrived together, in order: each is recorded, applied and decided on,
        with everything it derived, before the next; new work starts once, after the last
        (``pump`` sees the capacity all of them freed), then the finale."""
        for msg in msgs:
            self._step(msg)
            if self._derived:
                self._drain(pump=False)
            if self.ended is not None:
                return
        self._pump()
        self._settle()

    def _settle(self) -> None:
        while self.ended is None:
            if self._derived:
                self._drain()
            if not self._opened or self.ended is not None or self.finale.phase == "running":
                return
            self._stage = "finale"
            self.finale.advance()
            if not self._derived:
                return

    def _drain(self, pump: bool = True) -> None:
        """Handle the events derived so far, and what they derive in turn; then (``pump``) start
        new work, and handle what that derived. Bounded: one message can derive about one event
        per sample and group it touches; far more is a feedback loop."""
        limit = 10_000 + 10 * (self.dispatcher.total_in_flight + self.buffer.in_flight + self.buffer.ready)
        handled = 0
        while self._derived and self.ended is None:
            while self._derived and self.ended is None:
                handled += 1
                if handled > limit:
                    raise RuntimeError(
                        f"livelock: one message derived more than {limit} events (the last {tag_of(self._derived[0])})"
                    )
                self._step(self._derived.popleft())
            if pump:
                self._pump()

    def _step(self, msg: Message) -> None:
        self._current = msg
        self._record(msg)
        if msg.__class__ is RelayReport:
            self._report(msg)
        elif isinstance(msg, Intent):
            self._stage = "intent"
            refused = self.intents.carry_out(msg)
            verdict = self._verdicts.pop((msg.source, msg.seq), None) if self._verdicts else None
            if verdict is not None and not verdict.done():
                verdict.set_result(refused or msg)
        elif isinstance(msg, Event):
            self._stage = "apply"
            self.applier.apply(msg)
            if self._opened and self.ended is None and self._consults(msg):
                self._decide(msg)
        else:  # an order can only come from this side of the bus
            self.emit(
                EventRejected(
                    origin=msg.source or "unknown",
                    error=f"{tag_of(msg)} is an order; only the coordinator gives orders (submit intents)",
                )
            )

    def _report(self, report: RelayReport) -> None:
        """A relay's report: each fact it carries is applied, shown to the policy and followed
        by what it derived, as if it had come alone (it was recorded with the report)."""
        for ev in report.events:
            self._current = ev
            self._stage = "apply"
            self.applier.apply(ev)
            if self._opened and self.ended is None and self._consults(ev):
                self._decide(ev)
            if self._derived:
                self._drain(pump=False)
            if self.ended is not None:
                return

    def _pump(self) -> None:
        if self._opened and not self.finale.finishing and self.ended is None:
            self._stage = "pump"
            self.inflight.pump()
            if self.inflight.exhausted and self._out_of_data():
                self.finale.begin()  # the dataset's epochs are done: the run ends as completed

    def _out_of_data(self) -> bool:
        """No prompt left, none generating, no batch to train: an engine-driven run has nothing
        more to do (a user's loop hears it from ``next_batch``)."""
        b, t = self.buffer, self.state.trainer
        return (
            self.state.trainer_driver == "engine"
            and not b.in_flight
            and b.ready_batches(t.version) == 0
            and t.state == "idle"
            and self.batches.training is None
        )

    def _consults(self, event: Event) -> bool:
        """Whether the policy is asked about ``event``: while the run goes on as usual; once a
        ``Stop`` was posted (still queued behind a backlog) and in a stop's last cycle
        (``cycling``) not about single samples (the run is about to take no new group; the
        batches they complete come as ``BatchReady``); once the finale issues the last intents
        itself (``finishing``) not at all — so a slow policy, behind on a backlog of events,
        cannot hold up a stop."""
        phase = self.finale.phase
        if phase == "running" and not self._stop_posted:
            return True
        return phase in ("running", "cycling") and not isinstance(event, SAMPLE_EVENTS)

    def _decide(self, event: Event) -> None:
        self._stage = "decide"
        if not self.guard.wants(event):
            return
        for intent in self.guard.decide(event, self.view()):
            intent = self.policy_stamp(intent)
            self._record(intent)
            self._stage = "intent"
            self.intents.carry_out(intent)
        if self.guard.fatal:
            self._drain()  # the policy's last failure reaches the sinks before the end
            self.end("error", error=self.guard.fatal)

    def _record(self, msg: Message) -> None:
        for sink in self.sinks:
            self._stage = sink  # named only if it raises (formatting a name per message costs)
            sink(msg)

    # -- checkpoints -------------------------------------------------------------------------
    def snapshot(self) -> snapshot_mod.CoordinatorSnapshot:
        """The coordinator's state at this cut (see ``shunter.engine.coordinator.snapshot``)."""
        return snapshot_mod.take(self.state, self.buffer, self.inflight, self.policy, self.tally)

    def restore(
        self,
        snap: snapshot_mod.CoordinatorSnapshot,
        *,
        checkpoint: str = "",
        attempt: int = 1,
        reason: str = "",
        skipped: dict[str, str] | None = None,
    ) -> None:
        """Continue a run from a snapshot (before :meth:`run`): the buffer, the samples in
        flight (they resume from their prefixes), the prompt stream, the policy's state."""
        snapshot_mod.restore(snap, self.state, self.buffer, self.inflight, self.policy, self.tally)
        self.cuts.last_step = snap.step
        if self.state.trainer_driver == "engine" and snap.step >= self.cfg.run.total_steps:
            self.finale.begin()  # saved at the very end: only the finale is left
        self._resumed = RunResumed(
            checkpoint=checkpoint,
            step=snap.step,
            version=snap.version,
            attempt=attempt,
            reason=reason,
            skipped=skipped or {},
        )

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

    # -- the end ------------------------------------------------------------------------------
    def end(
        self, reason: EndReason, error: str = "", failed_component: str = "", fault: str = "", *, careful: bool = False
    ) -> None:
        """End the run: what is in flight is dropped and ``RunEnded`` reaches every sink
        (``Ending``), once. ``careful``: after a crash — a sink or a check that fails is skipped."""
        if self.ended is not None:
            return
        self.finale.phase = "ended"
        self.ended = self.ending.end(reason, error, failed_component, fault, careful=careful)
        for verdict in self._verdicts.values():  # intents never handled: the run's end is their answer
            if not verdict.done():
                verdict.set_result(self.ended)
        self._verdicts.clear()

    def summary(self) -> dict[str, float]:
        return self.ending.summary()

    def _crash(self, exc: Exception) -> None:
        error, fault = crash_error(exc, self._stage, self._current)
        self.end("error", error=error, fault=fault, careful=True)

    def _stalled(self, stall: float) -> None:
        quiet = self.executor.pending() == 0 and self._inbox.empty() and not self.supervisor.busy
        if self.state.trainer_driver == "engine" and quiet:
            self.end("error", error=stall_error(self.view(), stall))
