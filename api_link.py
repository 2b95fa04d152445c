"""``RunLink``: the ``Engine``'s link to its run — the coordinator of the attempt in progress, and
the run's end once seen.

``Engine`` makes one and shares it with its parts (``api_replicas.MidRunReplicas``,
``api_steering.Steering``); the engine sets ``coordinator`` as each attempt starts and clears it
at ``close()`` (``Engine.coordinator`` and ``Engine.ended`` are these two). Invariants: a call on a
run that is not started, or ended and closed, raises (``live``) instead of an ``AttributeError`` on
a missing handle; every answer from the coordinator that ends the run sets ``ended`` (``seen``).
"""

from __future__ import annotations

from typing import Any

from shunter.engine.io.errors import EngineError, RunEndedError
from shunter.events import Message, RunEnded


class RunLink:
    def __init__(self) -> None:
        self.coordinator: Any = None
        self.ended: RunEnded | None = None

    def live(self) -> Any:
        """The coordinator's handle; ``EngineError`` before ``start()``, ``RunEndedError`` after
        the run ended and the engine was closed."""
        if self.coordinator is None:
            if self.ended is not None:
                raise RunEndedError(self.ended)
            raise EngineError(
                "the engine is not started: use `async with Engine(cfg) as engine:` (or `await engine.start()`)"
            )
        return self.coordinator

    def seen(self, msg: Message) -> Message:
        """Every answer from the coordinator passes here: a ``RunEnded`` sets ``ended``."""
        if isinstance(msg, RunEnded):
            self.ended = msg
        return msg
