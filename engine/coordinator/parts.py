"""The parts of a run's coordinator and how they are wired: the groups in flight
(``InFlight``), the mini-batches (``Batches``), the policy's guard, the checkpoint cuts, the
intents, the finale, the replica supervisor and the ``Applier`` that applies events to them all.

``CoordinatorParts`` is a mixin of ``shunter.engine.coordinator.coordinator.Coordinator``: the attributes declared
on it are the coordinator's, set in ``Coordinator.__init__`` before ``_wire`` runs. Invariant:
each part is handed the others it needs (and the coordinator's ``emit`` / ``end`` / ``stop``) here,
once, when the coordinator is built; no part finds another any other way.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.coordinator import snapshot as snapshot_mod
from shunter.engine.coordinator.apply import Applier
from shunter.engine.coordinator.batches import Batches
from shunter.engine.coordinator.buffer import SampleBuffer
from shunter.engine.coordinator.cuts import CheckpointCuts
from shunter.engine.coordinator.dispatcher import Dispatcher
from shunter.engine.coordinator.executor import Executor
from shunter.engine.coordinator.finale import Finale
from shunter.engine.coordinator.guard import PolicyGuard
from shunter.engine.coordinator.inflight import InFlight
from shunter.engine.coordinator.intents import Intents
from shunter.engine.coordinator.state import EngineState
from shunter.engine.coordinator.supervisor import Supervisor
from shunter.engine.coordinator.tally import Tally
from shunter.engine.io.checkpoint import CheckpointStore
from shunter.events import Event, Intent, PromptSpec
from shunter.events.vocab import EndReason
from shunter.policies import Policy


class CoordinatorParts:
    """The ``Coordinator``'s parts (a mixin; the attributes below are the coordinator's)."""

    cfg: EngineConfig
    policy: Policy
    executor: Executor
    state: EngineState
    buffer: SampleBuffer
    dispatcher: Dispatcher
    tally: Tally

    if TYPE_CHECKING:

        def emit(self, event: Event) -> None: ...

        def issue(self, intent: Intent) -> None: ...

        def stop(self, reason: str) -> None: ...

        def end(
            self,
            reason: EndReason,
            error: str = "",
            failed_component: str = "",
            fault: str = "",
            *,
            careful: bool = False,
        ) -> None: ...

        def snapshot(self) -> snapshot_mod.CoordinatorSnapshot: ...

    def _wire(
        self, prompts: Iterator[PromptSpec], validation_prompts: list[PromptSpec], checkpoints: CheckpointStore | None
    ) -> None:
        """The loop's parts, each holding what it needs of the others (see the module docstring)."""
        cfg, executor = self.cfg, self.executor
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
            validation_prompts=validation_prompts,
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
