"""``LocalExecutor``: runs the coordinator's commands on in-process components.

Invariant: the same command -> events contract as the Ray executor (``RayExecutor``),
with the same component code (``RolloutCore.handle``, ``TrainerHost.handle``) and the same
failure path (``Failures``: a component's exception is a dead replica or a failed command);
only the process boundary is missing. Used by the unit tier and by simulations, where the
backend and trainer core are stand-ins and everything else is the real engine.
"""

from __future__ import annotations

from collections.abc import Callable

from shunter.engine.coordinator.executor import TRAINER, TaskExecutor
from shunter.engine.coordinator.failures import Failures, fault_of
from shunter.engine.io.errors import describe
from shunter.engine.replica.core import RolloutCore
from shunter.engine.trainer.host import TrainerHost
from shunter.events import (
    Delivery,
    EnterRollout,
    Event,
    Generate,
    InstallWeights,
    Order,
    Stamper,
    WeightsReady,
)


class LocalExecutor(TaskExecutor):
    def __init__(
        self,
        run_id: str,
        trainer: TrainerHost,
        replicas: dict[str, RolloutCore],
        *,
        max_tokens: int = 16,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__()
        self.trainer = trainer
        self.replicas = replicas
        self.max_tokens = max_tokens
        self.stamp = Stamper(run_id, "executor", clock) if clock else Stamper(run_id, "executor")
        self.blobs: dict[str, bytes] = {}
        self.failures = Failures(emit=self._emit, answer=self._answer, retire=self._retire, kill=self._silence)

    def deliver(self, version: int, handle: str, blob: bytes | None, deliveries: list[Delivery]) -> None:
        """The trainer hands a version it just published to relays (``Publish.deliver``): each
        relay gives its replicas an ``InstallWeights`` (its work, not the coordinator's)."""
        if blob is not None:
            self._keep(handle, blob)
        for d in deliveries:
            if self.relay_named(d.relay) is not None:
                self._relayed(d.relay, [(rid, InstallWeights(version=version, handle=handle)) for rid in d.replica_ids])

    def _keep(self, handle: str, blob: bytes) -> None:
        self.blobs[handle] = blob
        for old in list(self.blobs)[:-2]:  # keep the last two versions
            del self.blobs[old]

    def kill(self, replica_id: str, reason: str = "killed") -> None:
        """Fault injection: the replica vanishes mid-call (its calls never answer, like a dead
        actor's) and the executor reports it down, as the Ray executor does on ``RayActorError``."""
        self.failures.dead(replica_id, reason)

    def _retire(self, replica_id: str) -> None:
        """A replica reported down vanishes: its calls in flight are cancelled and never answer."""
        self._silence(replica_id)
        self.replicas.pop(replica_id, None)

    def _silence(self, target: str) -> None:
        for t in self.tasks_for(target):
            t.cancel()

    def _emit(self, events: list[Event]) -> None:
        self._deliver([self.stamp(e) for e in events])

    def _answer(self, target: str, events: list[Event]) -> None:
        """A failed command's ``CommandFailed``, posted as ``target``'s answer (through its relay)."""
        self._deliver([self.stamp(e) for e in events], target)

    async def _call(self, target: str, cmd: Order) -> None:
        if self.failures.is_down(target):  # like a call to a dead actor: no answer; its ReplicaDown is already out
            return
        try:
            if target == TRAINER:
                events, blob = await self.trainer.handle(cmd)
                for ev in events:
                    if isinstance(ev, WeightsReady) and blob is not None:
                        self._keep(ev.handle, blob)
            else:
                payload = self.blobs.get(cmd.handle) if isinstance(cmd, InstallWeights | EnterRollout) else None
                if isinstance(cmd, Generate):  # each sample's events as it ends, like the Ray executor
                    async for evs in self.replicas[target].generate_stream(cmd):
                        if self.failures.is_down(target):
                            return
                        self._deliver(list(evs), target)
                    return
                events = await self.replicas[target].handle(cmd, payload, max_tokens=self.max_tokens)
        except Exception as e:  # noqa: BLE001 - every failure becomes an event (EngineDead: the replica is dead)
            self.failures.failed(target, cmd, fault_of(cmd, e, describe))
            return
        self._deliver(list(events), target)
