"""``TrainerWorker``: a Ray actor around the torch ``Trainer`` (via ``TrainerHost``).

Invariant: published weights go into the Ray object store from here, once per publish; only
their handle travels in ``WeightsReady`` — the ObjectRef is returned beside the events for the
executor's handle table, and Ray resolves it on the replica that loads it. A ``Publish`` that
names relays (``Publish.deliver``) gets the same ObjectRef to each of them before the answer
leaves: one call per host, whatever the number of replicas there. Replicas named under
``DIRECT`` (those the coordinator's process serves) get their ``InstallWeights`` from here,
one call each, the blob inline when it is small (a CUDA IPC package: no object-store round
trip); the answers' ObjectRefs go back beside ``WeightsReady`` (``control``'s third item) and
the coordinator reads them as if it had sent the loads itself — one hop fewer than a relay.

A trainer of ``trainer.world_size = N`` ranks is N of these actors, one per rank, joined in one
torch.distributed group (``RankGroup``) at ``setup``: rank 0's address comes from its
``rendezvous`` (its node's IP and a free port), which the launcher hands to every rank. The
coordinator sees one trainer, rank 0: it forwards every order except the weight-group ones to
the other ranks (the same bytes and turn, so every rank runs the same orders in the same order
— each is a collective), runs its own part, and answers with its own events once every rank
has answered; the published weights, the relays and the weight groups are rank 0's alone.
Invariant: a group that lost a rank is never used again — rank 0 watches the others and its
``watch`` fails with ``TrainerGroupBroken`` naming the rank that died (the executor takes it as
the trainer's death: the run restarts from its checkpoint and every rank is ended), every
other rank ends its own process when rank 0 dies, and an order that fails in a collective (a
peer dead, or silent past ``trainer.collective_timeout_s``) fails with ``TrainerGroupBroken``
too, whatever the order was.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from typing import Any

import msgspec
import ray

from shunter.actors.wire import decode_order, encode_events, root_cause
from shunter.engine.config.trainer import TrainerConfig
from shunter.engine.io.errors import TrainerGroupBroken, secs
from shunter.events import (
    DIRECT,
    Delivery,
    InstallWeights,
    JoinWeightGroup,
    LeaveWeightGroup,
    SendWeights,
    Stamper,
    tag_of,
)

INLINE_BYTES = 100 * 1024
"""A published blob up to this size travels inside each direct ``InstallWeights`` call (Ray's
own inline limit for arguments); a larger one goes once into the object store."""

NAMESPACE = "shunter"
PEER_DEATH_GRACE_S = 5.0
"""After an order fails in a collective, how long rank 0 waits for Ray to report a peer's death,
so the failure names the rank that died rather than the reset connection it left (measured here:
gloo's reset came first in 2 of 3 kills of rank 1)."""
GROUP_ORDERS = (JoinWeightGroup, SendWeights, LeaveWeightGroup)
"""Orders rank 0 serves alone: its weight groups carry the weights it published."""
_CALL: contextvars.ContextVar[tuple[dict[str, Any], dict[str, ray.ObjectRef]]] = contextvars.ContextVar("direct")
"""This control call's (replica id -> handle for its ``DIRECT`` loads, replica id -> ObjectRef
of each one's answer): per call (each runs in its own task), as calls overlap here."""


class TrainerWorker:
    def __init__(
        self,
        run_id: str,
        cfg: bytes,
        model_dir: str,
        *,
        seed: int = 0,
        temperature: float = 1.0,
        init_from: str = "",
        import_paths: list[str] | None = None,
        rank: int = 0,
    ) -> None:
        from shunter.policies.registry import use_import_paths

        use_import_paths(import_paths or [])  # the user's loss resolves like the config's other import strings
        self.cfg = msgspec.msgpack.decode(cfg, type=TrainerConfig)
        self.run_id, self.model_dir, self.seed, self.temperature = run_id, model_dir, seed, temperature
        self.init_from = init_from
        self.rank = rank
        self.peers: list[Any] = []  # rank 0: the other ranks' handles, by rank; another rank: rank 0's
        self._watchers: list[asyncio.Task] = []
        self._broken_at: asyncio.Future | None = None  # rank 0: fails once another rank has died
        self._listen: Any = None  # rank 0: the group store's listening socket, from rendezvous to setup
        self.host = None
        self._last: tuple[Any, ray.ObjectRef] | None = None  # (the last blob published, its ObjectRef)
        self._relays: dict[str, Any] = {}  # relay actor name -> handle

    async def rendezvous(self) -> tuple[str, int]:
        """Rank 0: (its node's IP, a free port there) for the other ranks to join its group at."""
        from shunter.engine.weights.group import listen_socket

        ip = ray.util.get_node_ip_address()
        self._listen, port = listen_socket(ip)  # this address only, never all interfaces
        return ip, int(port)

    async def setup(self, group_at: tuple[str, int] | None = None, peers: list[Any] | None = None) -> float:
        """Build the trainer; with ``trainer.world_size > 1`` first join the ranks' group at
        ``group_at`` (rank 0's ``rendezvous``; every rank's ``setup`` runs at once). ``peers``:
        rank 0 is given the other ranks' handles (it forwards orders to them), every other rank
        rank 0's (each watches the other side)."""
        from transformers import AutoTokenizer

        from shunter.engine.trainer.host import TrainerHost
        from shunter.engine.trainer.rank_group import RankGroup
        from shunter.engine.trainer.trainer import Trainer

        t0 = time.perf_counter()
        if self.cfg.weight_transport == "nccl":
            from shunter.actors.vllm import nccl as vllm_nccl

            vllm_nccl.register()
        tok = AutoTokenizer.from_pretrained(self.model_dir)
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        world = self.cfg.world_size
        group = RankGroup()
        if world > 1:
            if group_at is None:
                raise ValueError(f"trainer rank {self.rank} of {world}: setup needs rank 0's address (group_at)")
            import torch

            device = self.cfg.device
            device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
            host, port = group_at
            group = await asyncio.to_thread(
                RankGroup.join,
                self.rank,
                world,
                host,
                port,
                device=device,
                timeout_s=self.cfg.collective_timeout_s,
                sock=self._listen,
            )
            self.peers = list(peers or [])
            self._watch_peers()
        core = Trainer(
            self.cfg,
            self.model_dir,
            seed=self.seed,
            pad_token_id=pad,
            temperature=self.temperature,
            init_from=self.init_from,
            group=group,
        )
        core.weight_host = ray.util.get_node_ip_address()
        await asyncio.to_thread(core.setup)
        deliver = self._deliver if self.rank == 0 else None
        self.host = TrainerHost(core, Stamper(self.run_id, "trainer"), transport="ray", deliver=deliver)
        return time.perf_counter() - t0

    def _watch_peers(self) -> None:
        """Rank 0 watches every other rank, and every other rank watches rank 0 (module
        docstring): a rank that sees rank 0 die ends its own process (nobody can use it now);
        rank 0, seeing another rank die, fails its own ``watch`` with ``TrainerGroupBroken``
        naming that rank, which the executor takes as the trainer's death — the run restarts
        from its checkpoint and every rank of this attempt is ended."""

        async def watching(rank: int, h: Any) -> None:
            try:
                await h.watch.remote()
            except ray.exceptions.RayActorError as e:
                if self.rank != 0:
                    import os

                    os._exit(1)  # rank 0 gone: this one can never finish a collective with it
                if not self._broken().done():  # the first rank lost is the one named
                    self._broken().set_exception(
                        TrainerGroupBroken(f"trainer rank {rank} of {self.cfg.world_size} died: {_first_line(e)}")
                    )
            except Exception:  # noqa: BLE001 - cancelled as the actor stops
                pass

        loop = asyncio.get_running_loop()
        ranks = range(1, len(self.peers) + 1) if self.rank == 0 else [0]
        self._watchers = [loop.create_task(watching(r, h)) for r, h in zip(ranks, self.peers, strict=True)]

    def _put(self, blob: Any) -> ray.ObjectRef:
        """The published blob in the object store, once per publish (the relays and the
        coordinator's handle table share the one copy)."""
        if self._last is None or self._last[0] is not blob:
            self._last = (blob, ray.put(blob))
        return self._last[1]

    def _deliver(self, version: int, handle: str, blob: Any, deliveries: list[Delivery]) -> None:
        """New weights straight to the relays ``Publish.deliver`` names, one call per host (each
        gives its replicas an ``InstallWeights``), and to the ``DIRECT`` replicas one call each.
        A relay that is gone is skipped: the coordinator takes its replicas as down."""
        ref: ray.ObjectRef | None = None
        for d in deliveries:
            if d.relay == DIRECT:
                self._direct(version, handle, blob, d.replica_ids)
                continue
            ref = ref or self._put(blob)
            relay = self._relays.get(d.relay)
            if relay is None:
                try:
                    relay = self._relays[d.relay] = ray.get_actor(d.relay, namespace=NAMESPACE)
                except ValueError:
                    continue
            relay.install.remote(version, handle, [ref], d.replica_ids)

    def _direct(self, version: int, handle: str, blob: Any, replica_ids: list[str]) -> None:
        from shunter.actors.wire import codec

        data = codec().encode(InstallWeights(version=version, handle=handle))
        small = isinstance(blob, bytes | bytearray) and len(blob) <= INLINE_BYTES
        payload = blob if small else self._put(blob)
        handles, installs = _CALL.get(({}, {}))
        for rid in replica_ids:
            h = handles.get(rid)
            if h is not None:  # one the coordinator did not hand over: it hears of no answer, and retries
                installs[rid] = h.control.remote(data, payload)

    async def control(
        self, data: bytes, replicas: dict[str, Any] | None = None, turn: int = 0
    ) -> tuple[bytes, list, dict]:
        """(events, [the published blob's ObjectRef] after a publish, {replica id: ObjectRef of
        its answer} for the ``DIRECT`` loads); ``replicas``: the handles of those replicas;
        ``turn``: the order's number from the executor (runs after the one before it)."""
        installs: dict[str, ray.ObjectRef] = {}
        _CALL.set((replicas or {}, installs))
        order = decode_order(data)
        collective = self.cfg.world_size > 1 and not isinstance(order, GROUP_ORDERS)
        fanned = []
        if collective and self.rank == 0 and self.peers:  # one object-store copy of the order for all of them
            ref = ray.put(data) if len(data) > INLINE_BYTES else data
            fanned = [p.control.remote(ref, None, turn) for p in self.peers]
        try:
            events, blob = await self.host.handle(order, turn)
            if fanned:  # every rank took part; a rank that failed fails the order
                await asyncio.gather(*fanned)
        except Exception as e:
            if not collective:
                raise
            if self.rank == 0 and self.peers:  # a peer's death reaches gloo (a reset connection) before Ray's report
                try:
                    await asyncio.wait_for(asyncio.shield(self._broken()), PEER_DEATH_GRACE_S)
                except TrainerGroupBroken as lost:
                    raise lost from e  # the rank that died, named
                except TimeoutError:
                    pass  # none died: a peer hung, or the collective failed on its own
            # a rank failed in a collective (a peer died or hung past the deadline): the ranks are
            # out of step for good, whatever the order was — the trainer is as good as dead
            raise TrainerGroupBroken(
                f"trainer rank {self.rank} of {self.cfg.world_size}: {tag_of(order)} failed "
                f"(trainer.collective_timeout_s = {secs(self.cfg.collective_timeout_s)}s): {_first_line(e)}"
            ) from e
        return encode_events(events), ([self._put(blob)] if blob is not None and self.rank == 0 else []), installs

    async def watch(self) -> None:
        """Never returns while the trainer lives: the executor keeps one call open so that the
        death of this process is known at once, even while nothing else is asked of it; on rank
        0 of several, it raises ``TrainerGroupBroken`` once another rank has died."""
        await asyncio.shield(self._broken())

    def _broken(self) -> asyncio.Future:
        if self._broken_at is None:
            self._broken_at = asyncio.get_running_loop().create_future()
        return self._broken_at

    async def where(self) -> dict:
        """Node and GPUs of this actor (``ComponentPlaced``)."""
        from shunter.actors.launch.placement import where

        return where()


def remote_class():
    return ray.remote(TrainerWorker)


def _first_line(e: BaseException) -> str:
    """An error's cause in one line: Ray's wrapping and stack dumps dropped."""
    text = root_cause(e).strip().splitlines()
    return text[0] if text else type(e).__name__
