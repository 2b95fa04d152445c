"""The boundary between the pure coordinator and the components it commands.

Invariant: ``send`` never blocks and never raises — the executor carries the command out
in the background and reports every outcome, failures included, back through the
``post`` callback it was given, as events (``CommandFailed`` names the target and the
cause). The coordinator therefore never waits on a component inside its loop.

Targets: ``"trainer"`` or a replica id.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from shunter.events import Command, Message

TRAINER = "trainer"
Post = Callable[[list[Message]], None]


class Executor(Protocol):
    def bind(self, post: Post) -> None:
        """Called once by the coordinator before the first ``send``."""

    def send(self, target: str, command: Command) -> None: ...

    def pending(self) -> int:
        """Commands sent whose outcome has not been posted yet."""

    async def close(self) -> None: ...
