"""``RunLink``: the ``Engine``'s link to its run — the coordinator of the attempt in progress, and
the run's end once seen.

``Engine`` makes one and shares it with its parts (``api_replicas.MidRunReplicas``,
``api_steering.Steering``); the engine sets ``coordinator`` as each attempt starts and clears it
at ``close()`` (``Engine.coordinator`` and ``Engine.ended`` are these two). Invariants: a call on a
run that is not started, or ended and closed, raises (``live``) instead of an ``AttributeError`` on
a missing handle; every answer from the coordinator that ends the run sets ``ended`` (``seen``);
what the engine tells its readers while no coordinator runs (a restart waiting for room:
``trainer.pending``) is kept in ``notices`` until read (``take_notices``), and the copy the next
coordinator records is known as already told (``told``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from shunter.engine.io.errors import EngineError, RunEndedError
from shunter.events import Event, Message, RunEnded, tag_of


class RunLink:
    def __init__(self) -> None:
        self.coordinator: Any = None
        self.ended: RunEnded | None = None
        self.notices: list[Event] = []
        self._noticed: asyncio.Event | None = None
        self._told: set[tuple[str, float]] = set()

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

    # -- what the engine tells while no coordinator runs --------------------------------------
    def notice(self, ev: Event) -> None:
        """``ev`` for the readers of ``Engine.events()`` (the launcher calls it)."""
        self.notices.append(ev)
        if self._noticed is not None:
            self._noticed.set()

    async def next_notice(self) -> None:
        """Returns when a notice is waiting to be read."""
        if self._noticed is None:
            self._noticed = asyncio.Event()
        if not self.notices:
            self._noticed.clear()
            await self._noticed.wait()

    def take_notices(self) -> list[Event]:
        """The notices not read yet (each remembered as told)."""
        out, self.notices = self.notices, []
        self._told.update((tag_of(ev), ev.wall_time) for ev in out)
        return out

    def told(self, ev: Event) -> bool:
        """``ev`` is the coordinator's record of a notice already read."""
        return bool(self._told) and (tag_of(ev), ev.wall_time) in self._told
