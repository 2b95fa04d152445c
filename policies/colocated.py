"""``colocated``: the synchronous baseline every async claim is measured against.

Schedule (slime's ``train.py`` / verl's sync trainer): all replicas are hybrid; generate a
whole train batch -> put rollout to sleep (and onload the trainer) -> train
``parameter_sync_step`` mini-batches -> publish -> offload the trainer -> wake rollout
with the new weights -> generate again. Nothing overlaps. Run it with
``rollout.max_staleness = 0`` so the gate admits exactly one train batch per version.
"""

from __future__ import annotations

import msgspec

from shunter.events import (
    EngineView,
    Event,
    Intent,
    Offload,
    Onload,
    PublishWeights,
    RunResumed,
    RunStarted,
    SwitchToRollout,
    SwitchToTrainer,
    TrainStep,
    WeightsReady,
)
from shunter.events.vocab import HYBRID, ROLLOUT, TRAINER
from shunter.policies.base import (
    Policy,
    ValidationState,
    live_ids,
    option_flag,
    option_sleep_level,
    validate_when_due,
)


class ColocatedState(msgspec.Struct):
    phase: str = "start"
    """``start`` -> ``rollout`` -> ``to_trainer`` -> ``train`` -> ``publish`` -> ``rollout`` ..."""
    validation: ValidationState = msgspec.field(default_factory=ValidationState)


class ColocatedPolicy(Policy):
    name = "colocated"
    State = ColocatedState

    def __init__(self, *, offload_optimizer: bool = True, sleep_level: int = 1) -> None:
        super().__init__()
        self.offload_optimizer = option_flag("offload_optimizer", offload_optimizer)
        self.sleep_level = option_sleep_level(sleep_level)

    @classmethod
    def check_setup(cls, *, standalone: int, hybrid: int) -> None:
        if hybrid < 1 or standalone:
            raise ValueError(
                f"runs every replica on trainer resources: needs rollout.hybrid_replicas >= 1 "
                f"(got {hybrid}) and rollout.standalone_replicas = 0 (got {standalone})"
            )

    def decide(self, event: Event, view: EngineView) -> list[Intent]:
        st = self.state
        hybrids = live_ids(view, HYBRID)
        cmds: list[Intent] = validate_when_due(event, view, st.validation)
        if view.done:
            return cmds
        if isinstance(event, RunResumed) or (st.phase == "start" and isinstance(event, RunStarted)):
            st.phase = "rollout"
            cmds += self._to_rollout(hybrids)
        elif st.phase == "rollout":
            full = view.buffer.ready_batches >= view.parameter_sync_step
            settled = set(hybrids) <= set(view.ids(mode=ROLLOUT))  # a switch still under way: next event
            if full and settled and view.trainer_driver == "engine":
                st.phase = "to_trainer"
                cmds.append(SwitchToTrainer(replica_ids=hybrids, sleep_level=self.sleep_level))
                if self.offload_optimizer:
                    cmds.append(Onload(parts=["optimizer"]))
        elif st.phase == "to_trainer" and set(hybrids) <= set(view.ids(mode=TRAINER)):
            st.phase = "train"
        if st.phase == "train" and view.trainer.state == "idle":
            if view.trainer.steps_since_publish >= view.parameter_sync_step:
                st.phase = "publish"
                return cmds + [PublishWeights()]
            if view.buffer.ready_batches > 0:
                cmds.append(TrainStep())
        elif st.phase == "publish" and isinstance(event, WeightsReady):
            st.phase = "rollout"
            cmds += self._to_rollout(hybrids)
        return cmds

    def _to_rollout(self, hybrids: list[str]) -> list[Intent]:
        cmds: list[Intent] = [Offload(parts=["optimizer"])] if self.offload_optimizer else []
        return cmds + [SwitchToRollout(replica_ids=hybrids)]
