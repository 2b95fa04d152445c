"""``Failures``: what a component's failed call becomes, one path for both executors
(``LocalExecutor`` in process, ``RayExecutor`` over Ray; a relay's executor too).

The executor names what happened in the shared categories — the component is dead (:class:`Dead`),
the command failed (:class:`Failed`), no answer in time (:class:`Unanswered`); an executor maps its
transport's own exceptions onto them first (``RayExecutor._fault``), the rest through
:func:`fault_of` — and the events are decided here: one ``ReplicaDown`` per replica life, the
trainer's death one ``ComponentFailed``, a failed command one ``CommandFailed`` naming the target
and the cause. ``tests/actors/test_executor_contract.py`` runs one contract against both executors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shunter.engine.coordinator.executor import TRAINER
from shunter.engine.io.errors import TrainerGroupBroken, bounded, secs
from shunter.engine.replica.backend import EngineDead
from shunter.events import CommandFailed, ComponentFailed, Event, Generate, Order, ReplicaDown, tag_of


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
    first): ``EngineDead`` is a dead replica, ``TrainerGroupBroken`` a dead trainer, anything
    else a failed command; ``cause`` names it."""
    if isinstance(e, EngineDead):  # a replica whose engine died is a dead replica: free it, resume its samples
        return Dead(bounded(f"its inference engine died during {tag_of(cmd)}: {cause(e)}"))
    if isinstance(e, TrainerGroupBroken):  # the trainer's ranks are out of step: it is as good as dead
        return Dead(bounded(cause(e)))
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
                        TRAINER, f"no answer to {tag_of(cmd)} within {fault.setting} = {secs(fault.seconds)}s; killed"
                    )
                elif isinstance(cmd, Generate):  # hung: kill it so it can neither hold resources nor answer late
                    self.kill(target)
                    self.dead(
                        target, f"no progress on {tag_of(cmd)} for {fault.setting} = {secs(fault.seconds)}s; killed"
                    )
                else:
                    error = f"no answer within {secs(fault.seconds)}s ({fault.setting})"
                    self.answer(target, [CommandFailed(command_kind=tag_of(cmd), target=target, error=error)])
