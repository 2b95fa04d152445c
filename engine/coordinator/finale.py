"""``Finale``: how a run ends — one explicit state machine.

    running ──(total_steps reached | Stop)──> [cycling] ──> draining ──> publishing ──> loading
        ──> validating ──> saving ──> ended

- ``cycling`` (a ``Stop`` of an engine-driven run between two publishes): the run goes on to
  the end of the current sync cycle (at most ``trainer.parameter_sync_step - 1`` more steps,
  whose groups the staleness gate has already let start), so the stop ends at the same
  consistent cut an uninterrupted run passes through — never a half-cycle publish, which would
  put the version ahead of the step and make the gate of the resumed run let in groups that
  go stale. If the cycle cannot complete (the loop is idle with the trainer waiting), the run
  ends without publishing, and a resume starts from the last checkpoint. A second ``Stop``
  meanwhile changes nothing (an operator's second signal ends the process instead: the CLI);
- ``draining``: no new group starts; wait for the trainer to be idle;
- ``publishing``: an engine-driven run publishes the steps taken since the last publish;
- ``loading``: every replica in rollout mode loads the final weights;
- ``validating`` (``validation.every > 0``): one replica scores the final weights — if none
  is in rollout mode (``colocated`` ends with every replica asleep), one is woken for it; if
  the validating replica dies, another one validates;
- ``saving`` (``run.checkpoint_every > 0``): the final checkpoint is written and committed;
- ``ended``: ``RunEnded(reason="completed" | "stopped")``.

Invariant: each phase issues its intents once (recorded in the event log like the policy's, with
source ``coordinator``) and moves on only when the facts it waits for
have arrived (``WeightsReady``, ``WeightsLoaded`` / ``ReplicaDown``, ``ValidateEnd``,
``CheckpointSaved`` / a failed save); a fatal error ends the run from any phase
(:meth:`Coordinator.end`), and nothing is handled after ``ended``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from shunter.engine.coordinator.cuts import CheckpointCuts
from shunter.engine.coordinator.intents import Intents
from shunter.engine.coordinator.snapshot import CoordinatorSnapshot
from shunter.engine.coordinator.state import EngineState
from shunter.events import (
    Intent,
    LoadWeights,
    LoopIdle,
    Message,
    PublishWeights,
    ReplicaDown,
    SwitchToRollout,
    Validate,
    ValidateEnd,
)
from shunter.events.vocab import DOWN, ROLLOUT, SWITCHING, TRAINER, EndReason

Phase = Literal["running", "cycling", "draining", "publishing", "loading", "validating", "saving", "ended"]


class Finale:
    def __init__(
        self,
        state: EngineState,
        intents: Intents,
        issue: Callable[[Intent], None],
        cuts: CheckpointCuts,
        *,
        validate: bool,
        snapshot: Callable[[], CoordinatorSnapshot],
        end: Callable[[EndReason], None],
    ) -> None:
        self.state = state
        self.intents = intents
        self.issue = issue
        """Records an intent of the coordinator's own and carries it out (like the policy's)."""
        self.cuts = cuts
        self.validate = validate
        self.snapshot = snapshot
        self.end = end
        self.phase: Phase = "running"
        self.stop_reason = ""
        self._loads_sent = False
        self._behind: set[str] = set()  # replicas the final LoadWeights waits for
        self._validate_sent = False
        self._validated = False
        self._woken = ""
        self._half_cycle = False  # the cycle could not complete: no publish, no final checkpoint
        self._quiet = False

    @property
    def finishing(self) -> bool:
        """No new group starts (the run is past the point where it goes on as usual)."""
        return self.phase not in ("running", "cycling")

    def begin(self, stop_reason: str = "") -> None:
        """The run should end (``total_steps`` reached, or a ``Stop`` with its reason)."""
        self.stop_reason = self.stop_reason or stop_reason
        st = self.state
        if self.phase == "running" and stop_reason and st.trainer_driver == "engine" and not self._at_cut():
            self.phase = "cycling"
        elif self.phase == "cycling" and stop_reason:
            pass  # a stop repeated while the cycle completes: still no half-cycle publish
        elif self.phase in ("running", "cycling"):
            self.phase = "draining"
            st.done = True

    def _at_cut(self) -> bool:
        """The trainer is idle right after a publish (no step taken or under way since)."""
        t = self.state.trainer
        return t.state == "idle" and t.steps_since_publish == 0

    def observe(self, msg: Message) -> None:
        """Facts the current phase waits for (before the policy sees ``msg``)."""
        if self.phase == "running":
            return
        self._quiet = isinstance(msg, LoopIdle)
        if self.phase == "cycling" and self._at_cut():
            self.phase = "draining"  # the cycle's publish is in: stop here, before the next step
            self.state.done = True
        final = self.phase in ("loading", "validating") and self.state.trainer.state == "idle"
        if isinstance(msg, ValidateEnd) and final and msg.version >= self.state.trainer.version:
            self._validated = True
        elif isinstance(msg, ReplicaDown) and msg.replica_id == self.intents.validating_on:
            self._validate_sent = False  # the final validation died with its replica: redo

    def advance(self) -> None:
        """Move through the phases as far as the facts allow (called after every message)."""
        st = self.state
        while self.phase not in ("running", "ended") and st.trainer.state == "idle":
            if not self._step(st):
                return

    def _step(self, st: EngineState) -> bool:
        """One phase's work; True when it is done and the next phase may start."""
        t = st.trainer
        match self.phase:
            case "cycling":
                if not self._quiet:
                    return False  # the cycle's steps are on their way
                self._half_cycle = True  # idle with the trainer waiting: the cycle cannot complete
                self.phase = "draining"
                st.done = True
            case "draining":
                self.phase = "publishing"
                if t.steps_since_publish > 0 and st.trainer_driver == "engine" and not self._half_cycle:
                    self.issue(
                        PublishWeights(replica_ids=[r.replica_id for r in st.replicas.values() if r.mode == ROLLOUT])
                    )
                    return False
            case "publishing":
                self.phase = "loading"
            case "loading":
                if not self._loads_sent:
                    self._loads_sent = True
                    behind = [r.replica_id for r in st.replicas.values() if r.mode == ROLLOUT and r.version < t.version]
                    self._behind = set(behind)
                    if behind:
                        self.issue(LoadWeights(replica_ids=behind))
                while self._behind:  # one look per message: the first replica still behind
                    rid = next(iter(self._behind))
                    r = st.replicas.get(rid)
                    if r is not None and r.mode == ROLLOUT and r.version < t.version:
                        return False
                    self._behind.discard(rid)
                self.phase = "validating"
            case "validating":
                if not self._validating(st):
                    return False
                self.phase = "saving"
            case "saving":
                if self.cuts.final(t, self.snapshot):
                    return False
                self.phase = "ended"
                self.end("stopped" if self.stop_reason else "completed")
        return True

    def _validating(self, st: EngineState) -> bool:
        """True when the final weights are validated, or cannot be (no validation, no replica)."""
        if not self.validate or self._validated or not self.intents.validation_prompts:
            return True
        if self._validate_sent:
            return False  # its ValidateEnd (or the death of its replica) moves this on
        current = [r for r in st.replicas.values() if r.mode == ROLLOUT and r.version >= st.trainer.version]
        if not current:
            if any(r.mode == SWITCHING for r in st.replicas.values()):
                return False  # one is on its way
            if self._woken and st.replicas[self._woken].mode == DOWN:
                self._woken = ""  # it died waking up: try another
            asleep = sorted((r for r in st.replicas.values() if r.mode == TRAINER), key=lambda r: r.rank)
            if asleep and not self._woken:
                self._woken = asleep[0].replica_id
                self.issue(SwitchToRollout(replica_ids=[self._woken]))
                return False
            return True  # no replica can serve the final weights: nothing to validate on
        self._validate_sent = True
        self.issue(Validate(replica_ids=[r.replica_id for r in current]))
        return False
