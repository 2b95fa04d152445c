"""The boundary between the pure coordinator and the components it commands.

Invariant: ``send`` never blocks and never raises — the executor carries the order out
in the background and reports every outcome, failures included, back through the
``post`` callback it was given, as events (``CommandFailed`` names the target and the
cause). The coordinator therefore never waits on a component inside its loop. Executors
carry orders only; intents never reach a component.

A failed call takes one path whichever executor carried it (:class:`Failures`): the executor
names what happened in the shared categories — the component is dead (:class:`Dead`), the
command failed (:class:`Failed`), no answer in time (:class:`Unanswered`) — and the events
are decided here: one ``ReplicaDown`` per replica life, the trainer's death one
``ComponentFailed``, a failed command one ``CommandFailed`` naming the target and the cause.

Targets: ``"trainer"`` or a replica id.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from shunter.engine.coordinator.relay import Relay
from shunter.engine.io.errors import bounded
from shunter.engine.replica.backend import EngineDead
from shunter.events import CommandFailed, ComponentFailed, Event, Generate, Message, Order, ReplicaDown, tag_of

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


# -- the one failure path ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Dead:
    """The component is dead — its process, or a replica's inference engine. ``component``: who
    died where it is not the call's target (the trainer, owner of the weights a call carried)."""

    reason: str
    component: str = ""


@dataclass(frozen=True, slots=True)
class Failed:
    """The command failed; the component lives and takes the next one."""

    error: str


@dataclass(frozen=True, slots=True)
class Unanswered:
    """No answer within ``seconds`` (the setting ``setting``): a stream without progress, or a call."""

    setting: str
    seconds: float


Fault = Dead | Failed | Unanswered


def fault_of(cmd: Order, e: Exception, cause: Callable[[BaseException], str]) -> Fault:
    """A component's exception in the shared categories (an executor maps its transport's own
    first): ``EngineDead`` is a dead replica, anything else a failed command; ``cause`` names it."""
    if isinstance(e, EngineDead):  # a replica whose engine died is a dead replica: free it, resume its samples
        return Dead(bounded(f"its inference engine died during {tag_of(cmd)}: {cause(e)}"))
    return Failed(cause(e))


class Failures:
    """What a failed call becomes, for every executor (held by ``LocalExecutor`` and
    ``RayExecutor``; a relay's and the coordinator's alike).

    Given: ``emit`` (the executor's own facts, stamped and posted after the relays are
    flushed), ``answer`` (a failed command's ``CommandFailed``, posted as ``target``'s answer),
    ``retire`` (a replica reported down: free it — its calls in flight never answer) and
    ``kill`` (a component that did not answer in time: stop it, so it cannot answer late).

    Invariants: a replica is reported down once per life (``ReplicaDown``; :meth:`revive` starts
    a new one), however many of its calls were in flight and whoever noticed; the trainer's death
    is one ``ComponentFailed``; a silent trainer or generation stream is killed and reported
    dead, a replica's silent call fails (``CommandFailed``)."""

    def __init__(
        self,
        *,
        emit: Callable[[list[Event]], None],
        answer: Callable[[str, list[Event]], None],
        retire: Callable[[str], None],
        kill: Callable[[str], None],
    ) -> None:
        self.emit, self.answer, self.retire, self.kill = emit, answer, retire, kill
        self._down: set[str] = set()  # components already reported down (this life)

    def is_down(self, component: str) -> bool:
        return component in self._down

    def mark_down(self, component: str) -> bool:
        """Take ``component`` as down; whether this is the first time in its life (then say so)."""
        if component in self._down:
            return False
        self._down.add(component)
        return True

    def revive(self, replica_id: str) -> None:
        """A replica's new life (added again): it can be reported down again."""
        self._down.discard(replica_id)

    def dead(self, component: str, reason: str) -> None:
        """``component`` is dead: the trainer's death is one ``ComponentFailed`` (the run ends; the
        Engine restarts it from the last checkpoint); a replica is retired and reported down once
        (the coordinator resumes its samples elsewhere; nothing is dropped)."""
        if component == TRAINER:
            if self.mark_down(TRAINER):
                self.emit([ComponentFailed(component=TRAINER, error=reason)])
        elif self.mark_down(component):
            self.retire(component)
            self.emit([ReplicaDown(replica_id=component, reason=reason)])

    def failed(self, target: str, cmd: Order, fault: Fault) -> None:
        """The call of ``cmd`` to ``target`` ended in ``fault``: its events."""
        match fault:
            case Dead():
                self.dead(fault.component or target, fault.reason)
            case Failed():
                group_id = cmd.group_id if isinstance(cmd, Generate) else -1
                self.answer(
                    target,
                    [CommandFailed(command_kind=tag_of(cmd), target=target, error=fault.error, group_id=group_id)],
                )
            case Unanswered():
                if target == TRAINER:  # hung: kill it so it cannot answer late, and report it down
                    self.kill(TRAINER)
                    self.dead(
                        TRAINER, f"no answer to {tag_of(cmd)} within {fault.setting} = {fault.seconds:g}s; killed"
                    )
                elif isinstance(cmd, Generate):  # hung: kill it so it can neither hold resources nor answer late
                    self.kill(target)
                    self.dead(target, f"no progress on {tag_of(cmd)} for {fault.setting} = {fault.seconds:g}s; killed")
                else:
                    error = f"no answer within {fault.seconds:g}s ({fault.setting})"
                    self.answer(target, [CommandFailed(command_kind=tag_of(cmd), target=target, error=error)])
