"""The boundary between the pure coordinator and the components it commands.

Invariant: ``send`` never blocks and never raises — the executor carries the order out
in the background and reports every outcome, failures included, back through the
``post`` callback it was given, as events (``CommandFailed`` names the target and the
cause). The coordinator therefore never waits on a component inside its loop. Executors
carry orders only; intents never reach a component.

A failed call takes one path whichever executor carried it: ``engine/coordinator/failures.py``.

Targets: ``"trainer"`` or a replica id.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from shunter.engine.coordinator.relay import Relay
from shunter.events import Generate, Message, Order

TRAINER = "trainer"
Post = Callable[[list[Message]], None]


class Executor(Protocol):
    def bind(self, post: Post) -> None:
        """Called once by the coordinator before the first ``send``."""

    def send(self, target: str, command: Order) -> None: ...

    def relay_of(self, target: str) -> str:
        """The relay that can take weights for ``target`` straight from the trainer (named in
        ``Publish.deliver``); "" where it must be loaded by an ``InstallWeights`` of its own."""

    def pending(self) -> int:
        """Commands sent whose outcome has not been posted yet."""

    async def close(self) -> None: ...


class TaskExecutor:
    """Shared bookkeeping: each ``send`` runs ``_call(target, command)`` as a task whose
    outcome ``_call`` posts itself; ``pending`` counts them; ``close`` cancels them.

    What a replica answers goes through its relay (``relays[target]``, else ``relay``; none:
    straight to the coordinator), which folds per-sample facts into reports; anything else
    (the trainer's answers, the executor's own facts) first flushes every relay, so no fact
    about a replica is overtaken by one posted after it. ``Generate`` orders to a replica in
    :attr:`relays` leave once per loop turn, batched per relay (:meth:`_relayed`): the
    coordinator pays one hand-over per node, not one call per prompt group."""

    def __init__(self) -> None:
        self._post: Post | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._targets: dict[asyncio.Task[None], str] = {}
        self.relay: Relay | None = None
        """The relay of every replica not in :attr:`relays`."""
        self.relays: dict[str, Relay] = {}
        """Replica id -> the relay its answers go through (a simulated node's, say): see :meth:`route`."""
        self._relays: dict[str, Relay] = {}  # every relay of ``relays``, once, by name
        self.hand_over: dict[str, str] = {}
        """Replica id -> the relay (by name) its ``Generate`` orders are handed over to."""
        self._outbox: dict[str, list[tuple[str, Order]]] = {}  # relay name -> orders this turn
        self._queued = 0

    def route(self, target: str, relay: Relay) -> None:
        """``target`` sits behind ``relay`` (in this process): its answers go through it and its
        ``Generate`` orders are handed over to it once a turn."""
        self.relays[target] = relay
        self._relays[relay.name] = relay
        self.hand_over[target] = relay.name

    def relay_of(self, target: str) -> str:
        return self.hand_over.get(target, "")

    def relay_named(self, name: str) -> Relay | None:
        return self._relays.get(name)

    def post_through_relay(self, events: list[Message]) -> None:
        """What relays post: on to the coordinator (a relay is made before ``bind``)."""
        assert self._post is not None, "bind() was not called"
        self._post(events)

    def bind(self, post: Post) -> None:
        self._post = post

    def send(self, target: str, command: Order) -> asyncio.Task[None] | None:
        """Carry ``command`` out in the background; the task doing it (None: handed over to a relay)."""
        name = self.hand_over.get(target) if command.__class__ is Generate else None
        if name is None:
            return self._start(target, command)
        box = self._outbox.get(name)
        if box is None:
            if not self._outbox:
                asyncio.get_running_loop().call_soon(self._hand_over)
            box = self._outbox[name] = []
        box.append((target, command))
        self._queued += 1
        return None

    def _hand_over(self) -> None:
        boxes, self._outbox, self._queued = self._outbox, {}, 0
        for name, orders in boxes.items():
            self._relayed(name, orders)

    def _relayed(self, name: str, orders: list[tuple[str, Order]]) -> None:
        """Hand a turn's orders for the replicas behind relay ``name`` over to it (in-process:
        start them here, timed as the relay's work)."""
        relay = self._relays[name]
        t0 = relay.timer()
        for target, cmd in orders:
            self._start(target, cmd)
        relay.cpu_s += relay.timer() - t0

    def _start(self, target: str, command: Order, **how: Any) -> asyncio.Task[None]:
        """``how``: passed on to ``_call`` (the Ray executor's ``reply``, say)."""
        task = asyncio.get_running_loop().create_task(self._call(target, command, **how))
        self._tasks.add(task)
        self._targets[task] = target
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._targets.pop(task, None)

    def tasks_for(self, target: str) -> list[asyncio.Task[None]]:
        """The calls to ``target`` still running."""
        return [t for t, tgt in self._targets.items() if tgt == target]

    async def _call(self, target: str, command: Order) -> None:
        raise NotImplementedError

    def _deliver(self, events: list[Message], target: str = "") -> None:
        """Post what ``target`` (a replica; "": the trainer or the executor itself) answered."""
        assert self._post is not None, "bind() was not called"
        if not events:  # a replica's progress beat carries none: nothing to post
            return
        if target and target != TRAINER and (relay := self.relays.get(target, self.relay)) is not None:
            relay.push(events)
            return
        self.flush_relays()
        self._post(events)

    def flush_relays(self) -> None:
        if self.relay is not None:
            self.relay.flush()
        for r in self._relays.values():
            if r.held:
                r.flush()

    def pending(self) -> int:
        return len(self._tasks) + self._queued

    async def close(self) -> None:
        self._outbox, self._queued = {}, 0
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._post is not None:
            self.flush_relays()
