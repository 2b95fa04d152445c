"""``LocalExecutor``: runs the coordinator's commands on in-process components.

Invariant: the same command -> events contract as the Ray executor (``RayExecutor``),
with the same component code (``RolloutCore.handle``, ``TrainerHost.handle``); only the
process boundary is missing. Used by the unit tier and by simulations, where the
backend and trainer core are stand-ins and everything else is the real engine.
"""

from __future__ import annotations

from collections.abc import Callable

from shunter.engine.coordinator.executor import TRAINER, TaskExecutor
from shunter.engine.io.errors import describe
from shunter.engine.replica.backend import EngineDead
from shunter.engine.replica.core import RolloutCore
from shunter.engine.trainer.host import TrainerHost
from shunter.events import (
    CommandFailed,
    Delivery,
    EnterRollout,
    Generate,
    InstallWeights,
    Order,
    ReplicaDown,
    Stamper,
    WeightsReady,
    tag_of,
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
        self._dead: set[str] = set()

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
        for t in self.tasks_for(replica_id):
            t.cancel()
        self.replicas.pop(replica_id, None)
        self._dead.add(replica_id)
        self._deliver([self.stamp(ReplicaDown(replica_id=replica_id, reason=reason))])

    async def _call(self, target: str, cmd: Order) -> None:
        if target in self._dead:  # like a call to a dead actor: no answer; its ReplicaDown is already out
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
                        if target in self._dead:
                            return
                        self._deliver(list(evs), target)
                    return
                events = await self.replicas[target].handle(cmd, payload, max_tokens=self.max_tokens)
        except EngineDead as e:  # the replica is dead as a whole, as the Ray executor reports it
            self.kill(target, reason=f"its inference engine died during {tag_of(cmd)}: {describe(e)}")
            return
        except Exception as e:  # noqa: BLE001 - every failure becomes an event
            events = [
                self.stamp(
                    CommandFailed(
                        command_kind=tag_of(cmd),
                        target=target,
                        error=describe(e),
                        group_id=cmd.group_id if isinstance(cmd, Generate) else -1,
                    )
                )
            ]
        self._deliver(list(events), target)
