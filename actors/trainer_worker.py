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
Invariant: no rank outlives another's death by more than a collective deadline — rank 0
watches the others and ends its own process when one dies (so the executor sees the trainer
die and the run restarts from its checkpoint), and every other rank ends itself when rank 0
dies; a rank blocked in a collective with a dead peer fails at ``trainer.collective_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from typing import Any

import msgspec
import ray

from shunter.actors.wire import decode_order, encode_events
from shunter.engine.config.trainer import TrainerConfig
from shunter.events import DIRECT, Delivery, InstallWeights, JoinWeightGroup, LeaveWeightGroup, SendWeights, Stamper

INLINE_BYTES = 100 * 1024
"""A published blob up to this size travels inside each direct ``InstallWeights`` call (Ray's
own inline limit for arguments); a larger one goes once into the object store."""

NAMESPACE = "shunter"
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
        self.host = None
        self._last: tuple[Any, ray.ObjectRef] | None = None  # (the last blob published, its ObjectRef)
        self._relays: dict[str, Any] = {}  # relay actor name -> handle

    async def rendezvous(self) -> tuple[str, int]:
        """Rank 0: (its node's IP, a free port there) for the other ranks to join its group at."""
        from shunter.engine.trainer.rank_group import free_port

        return ray.util.get_node_ip_address(), free_port()

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
                RankGroup.join, self.rank, world, host, port, device=device, timeout_s=self.cfg.collective_timeout_s
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
        """Rank 0 watches every other rank, and every other rank watches rank 0: when one dies
        this process ends too (module docstring), so no rank waits on a collective that cannot
        finish and the executor, which watches rank 0, sees the trainer die."""
        targets = self.peers

        async def watching(h: Any) -> None:
            try:
                await h.watch.remote()
            except ray.exceptions.RayActorError:
                import os

                os._exit(1)  # a rank gone: this one can never finish a collective with it
            except Exception:  # noqa: BLE001 - cancelled as the actor stops
                pass

        loop = asyncio.get_running_loop()
        self._watchers = [loop.create_task(watching(h)) for h in targets]

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
        forward = self.rank == 0 and not isinstance(order, GROUP_ORDERS)
        fanned = []
        if forward and self.peers:  # one object-store copy of the order for all of them
            ref = ray.put(data) if len(data) > INLINE_BYTES else data
            fanned = [p.control.remote(ref, None, turn) for p in self.peers]
        events, blob = await self.host.handle(order, turn)
        if fanned:  # every rank took part; a rank that failed fails the order
            await asyncio.gather(*fanned)
        return encode_events(events), ([self._put(blob)] if blob is not None and self.rank == 0 else []), installs

    async def watch(self) -> None:
        """Never returns: the executor keeps one call open so that the death of this process
        is known at once, even while nothing else is asked of it."""
        await asyncio.Event().wait()

    async def where(self) -> dict:
        """Node and GPUs of this actor (``ComponentPlaced``)."""
        from shunter.actors.launch.placement import where

        return where()


def remote_class():
    return ray.remote(TrainerWorker)
