"""``RayExecutor``: carries orders to the trainer and replica actors over Ray.

Invariants: every call is bounded by a timeout and every failure comes back as an event
naming the target (``CommandFailed``; a dead or hung replica yields one ``ReplicaDown``, a
dead or hung trainer one ``ComponentFailed``), never a hang or a lost error; returned bytes
are decoded by type, and bytes that do not decode become ``EventRejected``. Weight blobs stay
in the Ray object store: this executor keeps the handle -> ObjectRef table (last two
versions) and passes the ref, which Ray resolves on the receiving replica.

With a collective weight transport (``weight_group`` = ``nccl`` / ``gloo``) a weight load to
a replica on another device is a command pair: before the first one the replica joins a
group with the trainer (``JoinWeightGroup`` to each side); then every ``InstallWeights`` /
``EnterRollout`` that carries weights goes out beside a ``SendWeights`` to the trainer,
which broadcasts while the replica receives. Both halves are bounded; a failed half drops
the group, and the next load joins a new one. A replica that joins late or restarts gets
the current weights this way before it takes requests (the coordinator loads them first).

Direct loads (``direct_weights``): a replica this process serves itself (no relay actor in
front of it) and in rollout takes a new version from the trainer — ``relay_of`` names it under
``DIRECT``, the ``Publish`` carries its handle, the trainer orders the load, and its answer's
ObjectRef comes back beside ``WeightsReady``; it is read here like the answer to a load sent
from here (:meth:`_start` with the reply), with the same bounds and failure events.

Each version crosses a group once: the loads of one replica go out one at a time, and one
whose version the group already carried (a sleeping replica received it, now it wakes with
it) goes without a send — the replica's half receives only a version it has not received
since it joined (``VllmBackend.receive_weights``), so every broadcast has its receiver.

Its parts: ``WeightGroups`` (``actors.weight_groups``: the joins and the load pairs) and
``HostRelays`` (``actors.host_relays``: one relay actor per host that runs replicas), given
what each needs; what a failed call becomes is the shared ``Failures``
(``engine.coordinator.executor``), to which this executor names Ray's exceptions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgspec
import ray
from ray.exceptions import OwnerDiedError, RayActorError

from shunter.actors.host_relays import HostRelays
from shunter.actors.weight_groups import WeightGroups, handle_version
from shunter.actors.wire import codec, root_cause
from shunter.engine.coordinator.executor import TRAINER, TaskExecutor
from shunter.engine.coordinator.failures import Dead, Failures, Fault, Unanswered, fault_of
from shunter.engine.io.errors import TrainerGroupBroken, bounded
from shunter.engine.replica.backend import EngineDead
from shunter.events import (
    DIRECT,
    EnterRollout,
    Event,
    EventRejected,
    Generate,
    InstallWeights,
    Message,
    Order,
    Publish,
    RunValidation,
    Stamper,
    WeightsReady,
    tag_of,
)


class RayExecutor(TaskExecutor):
    def __init__(
        self,
        run_id: str,
        trainer,
        replicas: dict,
        *,
        timeout_s: float,
        generate_timeout_s: float = 1800.0,
        weight_group: str = "",
        group_timeout_s: float = 120.0,
        relays: dict[str, float] | None = None,
        relay_here: bool = False,
        direct_weights: bool = True,
    ) -> None:
        """``trainer``: None for a relay's executor (replicas only); ``relays``: the settings of
        the relay actors to make, one per host that runs replicas (``actors.host_relays``; None:
        none — this process holds every generation stream itself); ``relay_here``: on this
        process's host too (else its replicas' streams are held here); ``direct_weights``: the
        trainer orders the loads of the replicas served here itself (else they are sent from
        here once ``WeightsReady`` is back)."""
        super().__init__()
        self.trainer = trainer
        self._turn = 0  # the last number given to an order for the trainer (``engine.trainer.in_order``)
        self.replicas = dict(replicas)
        self.timeout_s = timeout_s
        self.generate_timeout_s = generate_timeout_s
        self.stamp = Stamper(run_id, "executor")
        self._refs: dict[str, ray.ObjectRef] = {}
        self.kinds: dict[str, str] = {}  # replica id -> kind (from ReplicaUp)
        self.places: dict[str, tuple[str, tuple[str, ...]]] = {}  # component -> (node, GPU ids), from ComponentPlaced
        self._watches: dict[str, asyncio.Task] = {}  # component -> the call that reports its death
        self.direct_weights = direct_weights
        self.known: Callable[[Message, bytes], None] | None = None
        """Given each relay actor's report with its bytes as they came (the event log writes them as they are)."""
        self.failures = Failures(emit=self._emit, answer=self._answer, retire=self.retire, kill=self._kill)
        self.groups = WeightGroups(
            weight_group,
            trainer,
            self.replicas,
            places=self.places,
            kinds=self.kinds,
            timeout_s=timeout_s,
            group_timeout_s=group_timeout_s,
            deliver=self._deliver,
            emit=self._emit,
        )
        self.hosts = HostRelays(
            run_id,
            relays,
            relay_here,
            replicas=self.replicas,
            hand_over=self.hand_over,
            first_down=self.failures.mark_down,
            post=self._post_reports,
            remember=self._remember,
            report_down=self.failures.dead,
            executor_class=RayExecutor,
        )

    def serve(self, replica_id: str, handle) -> None:
        """Carry orders to ``replica_id`` at ``handle`` from now on, a new life of it."""
        self.replicas[replica_id] = handle
        self.failures.revive(replica_id)

    def add_replica(self, replica_id: str, handle) -> None:
        self.serve(replica_id, handle)
        self.groups.drop(replica_id)
        self.watch(replica_id)

    def place(self, replica_id: str, node_id: str) -> None:
        """A replica landed on ``node_id`` (``ComponentPlaced``): see ``HostRelays.place``."""
        self.hosts.place(replica_id, node_id)

    def watch(self, target: str) -> None:
        """Keep one call open on ``target`` (``watch()`` never returns while it lives) so that its
        death is reported at once — an idle trainer or a sleeping replica is called by nobody
        else; a replica's watch raises ``EngineDead`` when its engine dies in its actor, a sharded
        trainer's rank 0 ``TrainerGroupBroken`` when another rank dies."""
        handle = self.trainer if target == TRAINER else self.replicas[target]

        async def watching() -> None:
            try:
                await handle.watch.remote()
            except RayActorError as e:
                self.failures.dead(target, bounded(f"actor died: {e}"))
            except EngineDead as e:  # a replica's engine died (its core, or a tensor-parallel worker)
                self.failures.dead(target, bounded(f"its inference engine died: {root_cause(e)}"))
            except TrainerGroupBroken as e:  # a trainer rank died: rank 0 says which
                self.failures.dead(target, bounded(root_cause(e)))
            except Exception:  # noqa: BLE001 - no watch (an older actor), or the call was cancelled
                pass

        old = self._watches.pop(target, None)
        if old is not None:
            old.cancel()
        self._watches[target] = asyncio.get_running_loop().create_task(watching())

    def watch_all(self) -> None:
        for target in [TRAINER, *self.replicas] if self.trainer is not None else self.replicas:
            self.watch(target)

    def keep_weights(self, handle: str, ref: ray.ObjectRef) -> None:
        """The published blob behind ``handle`` (the last two versions are kept)."""
        self._refs[handle] = ref
        for old in sorted(self._refs, key=handle_version)[:-2]:
            del self._refs[old]

    def relay_of(self, target: str) -> str:
        """A replica's relay actor, which the trainer hands new weights to, or ``DIRECT`` for
        one this process serves (none for a weight group: each load there is paired with the
        trainer's send)."""
        if self.groups.backend or self.failures.is_down(target) or target not in self.replicas:
            return ""
        name = self.hand_over.get(target, "")
        if self.hosts.made(name):
            return name if self.hosts.acknowledged(target) else ""
        return DIRECT if self.direct_weights and self.trainer is not None else ""

    def _relayed(self, name: str, orders: list[tuple[str, Order]]) -> None:
        if not self.hosts.run(name, orders):  # an in-process relay (or one already gone: its replicas are down)
            super()._relayed(name, orders)

    def pending(self) -> int:
        return super().pending() + self.hosts.pending()

    async def close(self) -> None:
        self.hosts.close()
        await super().close()

    def retire(self, replica_id: str) -> None:
        """A replica is down (``ReplicaDown``, whoever said so): kill its actor if it still lives
        — its engine died, or its weights or mode are unknown — so it frees its CPUs / GPUs for
        a replacement and can never answer late; its calls in flight fail and are ignored."""
        h = self.replicas.get(replica_id)
        self.failures.mark_down(replica_id)
        self.groups.leave(replica_id)
        if h is not None:
            try:
                ray.kill(h)
            except Exception:  # noqa: BLE001 - already gone
                pass

    def _kill(self, target: str) -> None:
        """A component that did not answer in time: killed, so it can neither hold resources nor answer late."""
        ray.kill(self.trainer if target == TRAINER else self.replicas[target])

    def _fault(self, target: str, cmd: Order, e: Exception) -> Fault:
        """A call's exception in the shared categories, Ray's own first (``EngineDead`` and
        anything else: ``fault_of``)."""
        if isinstance(e, RayActorError):  # the actor died
            return Dead(bounded(f"actor died during {tag_of(cmd)}: {e}"))
        if isinstance(e, OwnerDiedError):  # the weights' owner is the trainer: it is the one that died
            return Dead(bounded(f"the weights sent with {tag_of(cmd)} to {target} died with their owner: {e}"), TRAINER)
        if isinstance(e, TimeoutError):
            return Unanswered("run.timeout_s", self.timeout_s)
        return fault_of(cmd, e, root_cause)

    async def _call(self, target: str, cmd: Order, reply=None) -> None:
        """``reply``: the ObjectRef of ``target``'s answer to ``cmd`` when the trainer sent it
        (a ``DIRECT`` load), else it is sent from here."""
        data = codec().encode(cmd)
        refs: list = []
        try:
            if reply is not None:
                out = await asyncio.wait_for(reply, self.timeout_s)
            elif target == TRAINER:
                direct = {
                    rid: self.replicas[rid]
                    for d in (cmd.deliver if isinstance(cmd, Publish) else ())
                    if d.relay == DIRECT
                    for rid in d.replica_ids
                    if rid in self.replicas
                }
                turn = self._turn + 1  # numbered as submitted: the trainer runs them in this order
                call = self.trainer.control.remote(data, direct, turn)
                self._turn = turn  # (a submit that raised took no number: no gap to wait for)
                out, refs, *more = await asyncio.wait_for(call, self.timeout_s)
                if more and more[0]:
                    self._loads(self._decoded(target, out, refs), more[0])
                    return
            else:
                h = self.replicas[target]
                if isinstance(cmd, Generate):  # a stream: each sample's events as it ends
                    try:  # bounds the time without progress: each item (events or a beat) renews it
                        async with asyncio.timeout(self.generate_timeout_s) as silence:
                            async for ref in h.generate.remote(data):
                                self._decoded(target, await ref)
                                silence.reschedule(asyncio.get_running_loop().time() + self.generate_timeout_s)
                    except TimeoutError:  # hung: killed, so it can neither hold resources nor answer late
                        self.failures.failed(
                            target, cmd, Unanswered("rollout.generate_timeout_s", self.generate_timeout_s)
                        )
                    return
                else:
                    payload = None
                    if isinstance(cmd, InstallWeights | EnterRollout) and cmd.handle:
                        payload = self._refs.get(cmd.handle)
                        if payload is None:
                            raise LookupError(f"no weights under handle {cmd.handle!r}")
                    timeout = None if isinstance(cmd, RunValidation) else self.timeout_s

                    def call():
                        return asyncio.wait_for(h.control.remote(data, payload), timeout)

                    if payload is not None and self.groups.grouped(target):
                        out = await self.groups.load(target, cmd, call)
                    else:
                        out = await call()
        except Exception as e:  # noqa: BLE001 - every failure becomes an event
            self.failures.failed(target, cmd, self._fault(target, cmd, e))
            return
        self._decoded(target, out, refs)

    def _loads(self, events: list, installs: dict) -> None:
        """The trainer's ``DIRECT`` loads, under way: each answer is read as a call of its own."""
        ready = next((e for e in events if isinstance(e, WeightsReady)), None)
        if ready is None:  # nothing was published (the answer says why): the loads fail there
            return
        for rid, ref in installs.items():
            self._start(rid, InstallWeights(version=ready.version, handle=ready.handle), reply=ref)

    def _decoded(self, target: str, out: bytes, refs: list | None = None) -> list:
        """Deliver the events in a reply (bytes that do not decode: ``EventRejected``)."""
        try:
            events = codec().decode_batch(out)
        except msgspec.MsgspecError as e:
            self._emit([EventRejected(origin=target, error=str(e), nbytes=len(out))])
            return []
        for ev in events:
            if isinstance(ev, WeightsReady) and refs:
                self.keep_weights(ev.handle, refs[0])
        self._deliver(events, target)
        return events

    def _emit(self, events: list[Event]) -> None:
        self._deliver([self.stamp(e) for e in events])

    def _answer(self, target: str, events: list[Event]) -> None:
        """A failed command's ``CommandFailed``: this executor's own fact, posted at once (not
        folded by ``target``'s relay)."""
        self._emit(events)

    def _post_reports(self, msgs: list[Message]) -> None:
        """A relay actor's messages, to the coordinator once bound (each fact about a replica
        after those the relays here hold)."""
        if self._post is not None:
            self.flush_relays()
            self._post(msgs)

    def _remember(self, msg: Message, body: bytes) -> None:
        if self.known is not None:
            self.known(msg, body)
