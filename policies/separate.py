"""``separate``: the seed's behaviour (verl #6790).

Standalone replicas generate continuously; hybrid replicas stay with the trainer. The
trainer trains whenever a mini-batch is ready and publishes every
``parameter_sync_step`` steps; new weights go to the rollout replicas at once.
"""

from __future__ import annotations

import msgspec

from shunter.events import EngineView, Event, Intent
from shunter.policies.base import (
    SAMPLE_EVENTS,
    Policy,
    ValidationState,
    load_on_ready,
    train_or_publish,
    validate_when_due,
)


class SeparateState(msgspec.Struct):
    validation: ValidationState = msgspec.field(default_factory=ValidationState)


class SeparatePolicy(Policy):
    name = "separate"
    State = SeparateState
    ignores = SAMPLE_EVENTS  # acts on batches (BatchReady), steps, weights and modes

    @classmethod
    def check_setup(cls, *, standalone: int, hybrid: int) -> None:
        if standalone < 1:
            raise ValueError(
                f"needs at least one standalone replica (rollout.standalone_replicas = {standalone}); "
                "hybrid replicas stay with the trainer under this policy"
            )

    def decide(self, event: Event, view: EngineView) -> list[Intent]:
        return (
            load_on_ready(event, view)
            + train_or_publish(event, view)
            + validate_when_due(event, view, self.state.validation)
        )
