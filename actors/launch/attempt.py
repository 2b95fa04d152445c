"""``Attempt``: the attempt in progress, as a ``Launcher``'s parts share it; and ``await_setup``,
how an actor's setup (or start) call is awaited.

``Launcher`` makes one ``Attempt`` for its run and gives it to its ``ReplicaLauncher``: the
launcher sets what each attempt starts with (the weights its replicas start from, its reward
workers, the trainer's node, its coordinator) and kills ``actors`` when the attempt stops; the
replica part reads the rest and adds to and removes from ``actors``. Invariant: ``actors`` holds
every actor the launcher made and has not killed (the standalone replicas kept for the next
attempt included) — what ``Launcher.stop_attempt`` kills; an actor that does not finish its
setup within ``run.timeout_s``, or fails it, is an ``EngineSetupError`` naming it and its own cause.
"""

from __future__ import annotations

import asyncio
from typing import Any

from shunter.actors.wire import root_cause
from shunter.engine.io.errors import EngineSetupError, secs


class Attempt:
    def __init__(self) -> None:
        self.actors: list[Any] = []
        """Every actor the launcher made and has not killed."""
        self.coordinator: Any = None
        self.serve: tuple[str, int] = ("", 0)
        """(model folder, weight version) new replicas start from."""
        self.reward_pool: list[Any] = []
        """The attempt's reward workers (``task.reward_workers``), shared by its replicas."""
        self.trainer_node = ""  # where hybrid replicas go (CPU configs that pick the trainer's node)


async def await_setup(component: str, ref: Any, timeout: float, *, value: bool = False) -> Any:
    """Await an actor's setup (or start) call; its time (``value``: what it returned), or
    ``EngineSetupError`` with its cause. ``timeout``: ``run.timeout_s``."""
    try:
        out = await asyncio.wait_for(ref, timeout)
        return out if value else float(out or 0.0)
    except TimeoutError:
        raise EngineSetupError(f"{component} did not finish setup within run.timeout_s = {secs(timeout)}s") from None
    except Exception as e:  # noqa: BLE001 - surface the actor's own error
        raise EngineSetupError(f"{component} failed to start: {root_cause(e)}") from e
