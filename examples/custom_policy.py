"""An out-of-tree policy: select it with ``run.policy = "examples.custom_policy:EagerLendPolicy"``
(import strings resolve from the config file's folder and the working directory), and check it
with ``shunter check-policy examples.custom_policy:EagerLendPolicy``.

It behaves like ``separate`` but lends every hybrid replica to rollout as soon as the
trainer is idle with nothing to train, without weighing the switch cost, and takes them
back as soon as a mini-batch is ready. It shows the three things a policy author writes:
a state Struct (so snapshot/restore work), ``check_setup``, and ``decide``.
"""

from __future__ import annotations

import msgspec

from shunter.events import EngineView, Event, Intent, SwitchToRollout, SwitchToTrainer
from shunter.events.vocab import HYBRID, ROLLOUT, TRAINER
from shunter.policies import Policy
from shunter.policies.base import load_on_ready, train_or_publish


class EagerLendState(msgspec.Struct):
    lent: bool = False
    lends: int = 0


class EagerLendPolicy(Policy):
    name = "eager_lend"
    State = EagerLendState

    @classmethod
    def check_setup(cls, *, standalone: int, hybrid: int) -> None:
        if standalone < 1:
            raise ValueError("needs a standalone replica")

    def decide(self, event: Event, view: EngineView) -> list[Intent]:
        intents = load_on_ready(event, view)
        hybrids = view.ids(kind=HYBRID)
        if self.state.lent:
            lent = view.ids(kind=HYBRID, mode=ROLLOUT)
            if view.buffer.ready_batches > 0 or view.done:
                if lent:
                    intents.append(SwitchToTrainer(replica_ids=lent))
                if len(view.ids(kind=HYBRID, mode=TRAINER)) == len(hybrids):
                    self.state.lent = False  # all back: fall through and train
            if self.state.lent:
                return intents
        if view.ids(kind=HYBRID, mode=TRAINER) != hybrids:
            return intents  # a switch is still under way
        intents += train_or_publish(event, view)
        idle = view.trainer.state == "idle" and view.buffer.ready_batches == 0 and not view.done
        if not intents and idle and hybrids and view.buffer.gate_open and view.trainer_driver == "engine":
            self.state.lent = True
            self.state.lends += 1
            intents.append(SwitchToRollout(replica_ids=hybrids))
        return intents
