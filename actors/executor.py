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

The weight groups' half of this executor is ``actors.executor_groups`` (a mixin of
``RayExecutor``, as ``actors.relays`` is).
"""

from __future__ import annotations

import asyncio

import msgspec
import ray
from ray.exceptions import OwnerDiedError, RayActorError

from shunter.actors.host_relays import Relays
from shunter.actors.weight_groups import WeightGroups, _version
from shunter.actors.wire import codec, root_cause
from shunter.engine.coordinator.executor import TRAINER, TaskExecutor
from shunter.engine.io.errors import bounded
from shunter.engine.replica.backend import EngineDead
from shunter.events import (
    DIRECT,
    CommandFailed,
    ComponentFailed,
    EnterRollout,
    EventRejected,
    Generate,
    InstallWeights,
    Order,
    Publish,
    ReplicaDown,
    RunValidation,
    Stamper,
    WeightsReady,
    tag_of,
)


class RayExecutor(WeightGroups, Relays, TaskExecutor):
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
        the relay actors to make, one per host that runs replicas (``actors.relays``; None: none —
        this process holds every generation stream itself); ``relay_here``: on this process's
        host too (else its replicas' streams are held here); ``direct_weights``: the trainer
        orders the loads of the replicas served here itself (else they are sent from here once
        ``WeightsReady`` is back)."""
        super().__init__()
        self._init_relays(run_id, relays, relay_here)
        self.trainer = trainer
        self._turn = 0  # the last number given to an order for the trainer (``engine.in_order``)
        self.replicas = dict(replicas)
        self.timeout_s = timeout_s
        self.generate_timeout_s = generate_timeout_s
        self.stamp = Stamper(run_id, "executor")
        self._refs: dict[str, ray.ObjectRef] = {}
        self._down: set[str] = set()  # replicas already reported down: one ReplicaDown per replica life
        self.weight_group, self.group_timeout_s = weight_group, group_timeout_s
        self.kinds: dict[str, str] = {}  # replica id -> kind (from ReplicaUp)
        self.places: dict[str, tuple[str, tuple[str, ...]]] = {}  # component -> (node, GPU ids), from ComponentPlaced
        self._joins: dict[str, asyncio.Future] = {}  # replica id -> its weight-group join
        self._carried: dict[str, int] = {}  # replica id -> the last version its current group carried
        self._loading: dict[str, asyncio.Lock] = {}  # replica id -> held while a load's pair is out
        self._watches: dict[str, asyncio.Task] = {}  # component -> the call that reports its death
        self.direct_weights = direct_weights

    def add_replica(self, replica_id: str, handle) -> None:
        self.replicas[replica_id] = handle
        self._down.discard(replica_id)
        self._drop_group(replica_id)
        self.watch(replica_id)

    def watch(self, target: str) -> None:
        """Keep one call open on ``target`` (``watch()`` never returns) so that its death is
        reported at once — an idle trainer or a sleeping replica is called by nobody else."""
        handle = self.trainer if target == TRAINER else self.replicas[target]

        async def watching() -> None:
            try:
                await handle.watch.remote()
            except RayActorError as e:
                if target == TRAINER:
                    self._trainer_down(bounded(f"actor died: {e}"))
                else:
                    self._replica_down(target, bounded(f"actor died: {e}"))
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
        for old in sorted(self._refs, key=_version)[:-2]:
            del self._refs[old]

    def relay_of(self, target: str) -> str:
        """A replica's relay actor, which the trainer hands new weights to, or ``DIRECT`` for
        one this process serves (none for a weight group: each load there is paired with the
        trainer's send)."""
        if self.weight_group or target in self._down or target not in self.replicas:
            return ""
        name = self.hand_over.get(target, "")
        if name in self._actors:
            return name if target in self._confirmed else ""
        return DIRECT if self.direct_weights and self.trainer is not None else ""

    def pending(self) -> int:
        return super().pending() + self.relayed_pending()

    async def close(self) -> None:
        self.close_relays()
        await super().close()

    def _trainer_down(self, reason: str) -> None:
        if TRAINER not in self._down:
            self._down.add(TRAINER)
            self._emit([ComponentFailed(component=TRAINER, error=reason)])

    def retire(self, replica_id: str) -> None:
        """A replica is down (``ReplicaDown``, whoever said so): kill its actor if it still lives
        — its engine died, or its weights or mode are unknown — so it frees its CPUs / GPUs for
        a replacement and can never answer late; its calls in flight fail and are ignored."""
        h = self.replicas.get(replica_id)
        self._down.add(replica_id)
        self._leave(replica_id)
        if h is not None:
            try:
                ray.kill(h)
            except Exception:  # noqa: BLE001 - already gone
                pass

    def _replica_down(self, replica_id: str, reason: str) -> None:
        """Report a replica down once, however many of its calls were in flight when it died."""
        if replica_id not in self._down:
            self.retire(replica_id)
            self._emit([ReplicaDown(replica_id=replica_id, reason=reason)])

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
                    except TimeoutError:  # hung: kill it so it can neither hold resources nor answer late
                        ray.kill(h)
                        self._replica_down(
                            target,
                            (
                                f"no progress on {tag_of(cmd)} for rollout.generate_timeout_s"
                                f" = {self.generate_timeout_s:g}s; killed"
                            ),
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

                    if payload is not None and self._grouped(target):
                        out = await self._grouped_load(target, cmd, call)
                    else:
                        out = await call()
        except EngineDead as e:  # a replica whose engine died is a dead replica: free it, resume its samples
            self._replica_down(target, bounded(f"its inference engine died during {tag_of(cmd)}: {root_cause(e)}"))
            return
        except RayActorError as e:
            if target == TRAINER:  # the run ends; the Engine restarts it from the last checkpoint
                self._trainer_down(bounded(f"actor died during {tag_of(cmd)}: {e}"))
            else:  # the coordinator resumes the replica's samples elsewhere; nothing is dropped
                self._replica_down(target, bounded(f"actor died during {tag_of(cmd)}: {e}"))
            return
        except OwnerDiedError as e:  # the weights' owner is the trainer: it is the one that died
            self._trainer_down(bounded(f"the weights sent with {tag_of(cmd)} to {target} died with their owner: {e}"))
            return
        except TimeoutError:
            if target == TRAINER:  # hung: kill it so it cannot answer late, and report it down
                ray.kill(self.trainer)
                self._trainer_down(f"no answer to {tag_of(cmd)} within run.timeout_s = {self.timeout_s:g}s; killed")
            else:
                self._emit(
                    [
                        CommandFailed(
                            command_kind=tag_of(cmd),
                            target=target,
                            error=f"no answer within {self.timeout_s:g}s (run.timeout_s)",
                        )
                    ]
                )
            return
        except Exception as e:  # noqa: BLE001 - every failure becomes an event
            self._emit(
                [
                    CommandFailed(
                        command_kind=tag_of(cmd),
                        target=target,
                        error=root_cause(e),
                        group_id=cmd.group_id if isinstance(cmd, Generate) else -1,
                    )
                ]
            )
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

    def _emit(self, events: list) -> None:
        self._deliver([self.stamp(e) for e in events])
