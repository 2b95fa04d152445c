"""Policies written the way users get them wrong — each one a main path the engine must
contain (tests/contracts, tests/unit/engine/coordinator/test_loop_faults.py, the CLI tests)."""

from __future__ import annotations

import threading
import time

import msgspec

from shunter.events import EngineView, Event, Generate, PromptSpec, SamplingSpec, TrainStep
from shunter.policies import Policy, SeparatePolicy


class Raises(Policy):
    """Raises on every event (a typo in an attribute name, say)."""

    def decide(self, event: Event, view: EngineView) -> list:
        return view.bufer.ready_batches  # type: ignore[attr-defined]  # the typo


class ReturnsNone(Policy):
    def decide(self, event: Event, view: EngineView) -> list:
        if view.trainer.state == "idle":
            return [TrainStep()] if view.buffer.ready_batches else []  # type: ignore[return-value]
        return None  # type: ignore[return-value]  # forgot the return on one branch


class ReturnsBare(Policy):
    def decide(self, event: Event, view: EngineView) -> list:
        return TrainStep()  # type: ignore[return-value]  # not in a list


class ReturnsJunk(Policy):
    def decide(self, event: Event, view: EngineView) -> list:
        return [TrainStep(), "publish"]  # type: ignore[list-item]


class ReturnsOrder(Policy):
    """Tries to give a component an order itself."""

    def decide(self, event: Event, view: EngineView) -> list:
        return [Generate(group_id=0, prompt=PromptSpec(prompt_id=0, text="1>"), n=1, sampling=SamplingSpec())]


class Slow(SeparatePolicy):
    """Correct, but blocks 50 ms in every decide() (an I/O call, a sleep left in)."""

    def decide(self, event: Event, view: EngineView) -> list:
        time.sleep(0.05)
        return super().decide(event, view)


class Hangs(SeparatePolicy):
    """Loops for ever once the trainer has stepped once."""

    def decide(self, event: Event, view: EngineView) -> list:
        while view.trainer.step >= 1:
            pass
        return super().decide(event, view)


class BlockedInC(SeparatePolicy):
    """Blocks inside C once the trainer has stepped once: a lock nobody releases (a socket read,
    a native call that never returns) — the watchdog cannot interrupt it."""

    def decide(self, event: Event, view: EngineView) -> list:
        if view.trainer.step >= 1:
            threading.Event().wait()
        return super().decide(event, view)


class NoSuper(SeparatePolicy):
    """Has options and never calls super().__init__() (works: state is created on first use)."""

    def __init__(self, *, patience: int = 3) -> None:
        self.patience = patience


class OldState(msgspec.Struct):
    lent: list[str] = []


class ForgetsOnResume(Policy):
    """Written as the docs say: re-derives its replica state on RunResumed; lends like
    ``lend_when_idle`` would. Broke when setup events reached it before RunResumed."""

    State = OldState

    def decide(self, event: Event, view: EngineView) -> list:
        from shunter.events import RunResumed
        from shunter.policies.base import load_on_ready, train_or_publish

        if isinstance(event, RunResumed):
            self.state.lent = []
        return load_on_ready(event, view) + train_or_publish(event, view)
