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
from shunter.events import DIRECT, Delivery, InstallWeights, Stamper

INLINE_BYTES = 100 * 1024
"""A published blob up to this size travels inside each direct ``InstallWeights`` call (Ray's
own inline limit for arguments); a larger one goes once into the object store."""

NAMESPACE = "shunter"
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
    ) -> None:
        from shunter.policies.registry import use_import_paths

        use_import_paths(import_paths or [])  # the user's loss resolves like the config's other import strings
        self.cfg = msgspec.msgpack.decode(cfg, type=TrainerConfig)
        self.run_id, self.model_dir, self.seed, self.temperature = run_id, model_dir, seed, temperature
        self.init_from = init_from
        self.host = None
        self._last: tuple[Any, ray.ObjectRef] | None = None  # (the last blob published, its ObjectRef)
        self._relays: dict[str, Any] = {}  # relay actor name -> handle

    async def setup(self) -> float:

        from transformers import AutoTokenizer

        from shunter.engine.trainer.host import TrainerHost
        from shunter.engine.trainer.trainer import Trainer

        t0 = time.perf_counter()
        if self.cfg.weight_transport == "nccl":
            from shunter.actors.vllm import nccl as vllm_nccl

            vllm_nccl.register()
        tok = AutoTokenizer.from_pretrained(self.model_dir)
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        core = Trainer(
            self.cfg,
            self.model_dir,
            seed=self.seed,
            pad_token_id=pad,
            temperature=self.temperature,
            init_from=self.init_from,
        )
        core.weight_host = ray.util.get_node_ip_address()
        await asyncio.to_thread(core.setup)
        self.host = TrainerHost(core, Stamper(self.run_id, "trainer"), transport="ray", deliver=self._deliver)
        return time.perf_counter() - t0

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
        events, blob = await self.host.handle(decode_order(data), turn)
        return encode_events(events), ([self._put(blob)] if blob is not None else []), installs

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
