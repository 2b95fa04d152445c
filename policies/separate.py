"""``separate``: the seed's behaviour (verl #6790).

Standalone replicas generate continuously; hybrid replicas stay with the trainer. The
trainer trains whenever a mini-batch is ready and publishes every
``parameter_sync_step`` steps; new weights go to the rollout replicas at once.

Option: a straggler lane (``tail_replicas``, ``tail_max_in_flight``, ``tail_after_s``; see
``LaneOptions``): the highest-ranked standalone replicas take only the oldest samples, moved
there from the others, so a long tail decodes in small batches while the rest of the fleet
starts fresh groups.
"""

from __future__ import annotations

import msgspec

from shunter.events import EngineView, Event, Intent
from shunter.policies.base import (
    SAMPLE_EVENTS,
    LaneOptions,
    LaneState,
    Policy,
    ValidationState,
    load_on_ready,
    straggler_lane,
    train_or_publish,
    validate_when_due,
)


class SeparateState(msgspec.Struct):
    validation: ValidationState = msgspec.field(default_factory=ValidationState)
    lane: LaneState = msgspec.field(default_factory=LaneState)


class SeparatePolicy(Policy):
    name = "separate"
    State = SeparateState
    ignores = SAMPLE_EVENTS  # acts on batches (BatchReady), steps, weights and modes
    lane: LaneOptions = LaneOptions()  # no lane; a subclass that never calls super().__init__() has it too

    def __init__(self, *, tail_replicas: int = 0, tail_max_in_flight: int = 16, tail_after_s: float = 0.0) -> None:
        super().__init__()
        self.lane = LaneOptions(
            replicas=int(tail_replicas), max_in_flight=int(tail_max_in_flight), after_s=float(tail_after_s)
        )

    @classmethod
    def check_setup(cls, *, standalone: int, hybrid: int) -> None:
        if standalone < 1:
            raise ValueError(
                f"needs at least one standalone replica (rollout.standalone_replicas = {standalone}); "
                "hybrid replicas stay with the trainer under this policy"
            )

    def decide(self, event: Event, view: EngineView) -> list[Intent]:
        return (
            straggler_lane(event, view, self.lane, self.state.lane)
            + load_on_ready(event, view)
            + train_or_publish(event, view)
            + validate_when_due(event, view, self.state.validation)
        )
