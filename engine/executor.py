"""The boundary between the pure coordinator and the components it commands.

Invariant: ``send`` never blocks and never raises — the executor carries the order out
in the background and reports every outcome, failures included, back through the
``post`` callback it was given, as events (``CommandFailed`` names the target and the
cause). The coordinator therefore never waits on a component inside its loop. Executors
carry orders only; intents never reach a component.

Targets: ``"trainer"`` or a replica id.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from shunter.events import Message, Order

TRAINER = "trainer"
Post = Callable[[list[Message]], None]


class Executor(Protocol):
    def bind(self, post: Post) -> None:
        """Called once by the coordinator before the first ``send``."""

    def send(self, target: str, command: Order) -> None: ...

    def pending(self) -> int:
        """Commands sent whose outcome has not been posted yet."""

    async def close(self) -> None: ...


class TaskExecutor:
    """Shared bookkeeping: each ``send`` runs ``_call(target, command)`` as a task whose
    outcome ``_call`` posts itself; ``pending`` counts them; ``close`` cancels them."""

    def __init__(self) -> None:
        self._post: Post | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._targets: dict[asyncio.Task[None], str] = {}

    def bind(self, post: Post) -> None:
        self._post = post

    def send(self, target: str, command: Order) -> None:
        task = asyncio.get_running_loop().create_task(self._call(target, command))
        self._tasks.add(task)
        self._targets[task] = target
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._targets.pop(task, None)

    def tasks_for(self, target: str) -> list[asyncio.Task[None]]:
        """The calls to ``target`` still running."""
        return [t for t, tgt in self._targets.items() if tgt == target]

    async def _call(self, target: str, command: Order) -> None:
        raise NotImplementedError

    def _deliver(self, events: list[Message]) -> None:
        assert self._post is not None, "bind() was not called"
        if events:  # a replica's progress beat carries none: nothing to post
            self._post(events)

    def pending(self) -> int:
        return len(self._tasks)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
