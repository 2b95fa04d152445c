"""The weights of one vLLM engine: ``VLLMWeights`` loads a new version (shunter's worker
extension, vLLM's IPC weight-transfer engine, or the replica's weight group), pauses requests
with their KV cache across a load, and keeps the prefix cache honest; ``WeightEpoch`` counts the
loads (the cache salt of new requests).

``VLLMWeights`` is held by ``shunter.actors.vllm.backend.VLLMBackend``; it is given the
``VLLMEngine`` (vLLM's ``AsyncLLM``, whether it keeps the KV cache across a pause, whether
prompts are salted), the ``WeightEpoch`` it shares with ``VLLMRequests``, and the spec's
``weight_transfer``. It imports vLLM (lazily, inside functions), so it is one of the vLLM adapters.

Invariant it keeps (4. in ``backend``): after ``load_weights`` returns every forward pass
runs with the new weights, and no request started after it reuses a KV block of the old weights
(requests are salted with the load's epoch, or the prefix cache is reset).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from shunter.actors.vllm.engine import VLLMEngine, engine_rpc
from shunter.engine.weights.group import Received

log = logging.getLogger(__name__)

_EXT_RPC = "shunter_load_safetensors"
_EXT_RPC_IPC = "shunter_load_cuda_ipc"
_EXT_RPC_JOIN = "shunter_join_weight_group"
_EXT_RPC_RECV = "shunter_recv_weights"


def ipc_update_info(info: dict) -> dict:
    """shunter's packed update info with only the fields the installed vLLM knows."""
    from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferUpdateInfo

    return {k: v for k, v in info.items() if k in IPCWeightTransferUpdateInfo.__dataclass_fields__}


async def _timed(aw: Any) -> tuple[Any, float]:
    """(result, seconds until it came)."""
    t0 = time.perf_counter()
    return await aw, time.perf_counter() - t0


@dataclass
class WeightEpoch:
    """The weight loads of one engine so far: new requests carry it as their cache salt, so the
    prefix cache matches only blocks of the same weights. ``VLLMWeights`` advances it (before a
    load), ``VLLMRequests`` reads it."""

    loads: int = 0


class VLLMWeights:
    """``VLLMBackend``'s weights: keep-mode pause / resume, weight groups, loads."""

    def __init__(self, engine: VLLMEngine, epoch: WeightEpoch, weight_transfer: str):
        self.engine = engine
        self.epoch = epoch
        self.weight_transfer = weight_transfer  # EngineSpec.weight_transfer
        self.last_load: dict = {}  # what the worker reported for the last weight load
        self.weight_group = ""  # backend of the weight group this replica joined ("" = none)
        self._group_timeout_s = 120.0
        self._received = Received()  # what the weight group carried (not necessarily loaded)
        self.paused = False

    # ------------------------------------------------- weights in place (keep mode)

    @engine_rpc
    async def pause(self) -> dict[str, int]:
        """Freeze every request with its KV cache (vLLM's ``pause_generation(mode="keep")``);
        returns nothing per request: each result says where its weights changed (``marks``)."""
        if not self.engine.keeps_kv:
            raise RuntimeError("this vLLM cannot pause requests with their KV cache and label weight versions")
        await self.engine.require().pause_generation(mode="keep", clear_cache=False)
        self.paused = True
        return {}

    @engine_rpc
    async def resume(self, version: int = -1) -> None:
        """Let the frozen requests go on; tokens from here on are labelled ``version``."""
        engine = self.engine.require()
        try:
            if version >= 0:
                await engine.update_weight_version(str(version))
        finally:
            self.paused = False
            await engine.resume_generation()

    @engine_rpc
    async def label_version(self, version: int) -> None:
        """Label the tokens from here on ``version`` (``-1``: no version, the label shunter reads
        as none) where the engine keeps a weight-version label — an engine taken over from an
        earlier run or attempt keeps the last one it had, which would name their versions."""
        update = getattr(self.engine.require(), "update_weight_version", None)
        if update is not None:
            await update(str(version) if version >= 0 else "")

    # ---------------------------------------------------------- weight groups

    @engine_rpc
    async def join_weight_group(self, backend: str, host: str, port: int, timeout_s: float) -> float:
        """Join the trainer's weight group for this replica (rank 1, in the worker); seconds."""
        t0 = time.perf_counter()
        await self.engine.require().collective_rpc(_EXT_RPC_JOIN, args=(backend, host, port, timeout_s))
        self.weight_group, self._group_timeout_s = backend, timeout_s
        self._received.joined()
        return time.perf_counter() - t0

    def receives(self, blob: bytes) -> bool:
        """Whether ``blob`` is a layout whose bytes come over this replica's weight group (the
        trainer sends them beside the command that carried it, so they must be received)."""
        from shunter.engine.weights import transport as wt

        return bool(self.weight_group) and wt.payload_kind(blob) in (wt.CUDA_IPC, wt.FLAT)

    @engine_rpc
    async def receive_weights(self, blob: bytes, *, load: bool = False) -> dict:
        """Receive (and, with ``load``, install) the weights a layout names over the group;
        a layout already received is only installed."""
        from shunter.engine.weights import transport as wt

        version = wt.package_layout(blob)["version"]
        fresh = self._received.fresh(version)
        results = await self.engine.require().collective_rpc(
            _EXT_RPC_RECV, args=(bytes(blob), self._group_timeout_s, fresh, load)
        )
        self._received.got(version)
        return results[0] if results else {}

    # ---------------------------------------------------------------- weights

    @engine_rpc
    async def load_weights(self, blob: bytes) -> float:
        """Install a safetensors-serialised HF state dict; returns seconds taken.

        In-flight requests keep running and switch to the new weights at the
        next engine step (their earlier tokens were produced by the old ones).
        """
        engine = self.engine.require()
        if not isinstance(blob, (bytes, bytearray, memoryview)):
            raise TypeError(f"load_weights expects bytes, got {type(blob).__name__}")
        t0 = time.perf_counter()
        from shunter.engine.weights import transport as wt

        kind = wt.payload_kind(blob)
        self.epoch.loads += 1  # before the load: a request admitted while it runs computes on the new weights
        needs_reset = not self.engine.salted  # salted requests never match the old weights' blocks
        if self.receives(blob):
            self.last_load = await self.receive_weights(blob, load=True)
            results = [self.last_load]
        elif kind == wt.FLAT:
            raise RuntimeError(
                "got a flat weight layout but this replica joined no weight group "
                "(trainer.weight_transport nccl / gloo sends the bytes over one)"
            )
        elif kind == wt.VLLM_IPC:
            self.last_load = await self._load_through_vllm(wt.open_vllm_ipc(blob))
            results = [self.last_load]
        else:
            # the load and the prefix-cache reset go to the engine core together (it takes them in
            # order, between two steps): one wait for the engine instead of two
            rpc = _EXT_RPC_IPC if kind == wt.CUDA_IPC else _EXT_RPC
            load = _timed(engine.collective_rpc(rpc, args=(bytes(blob),)))
            if self.engine.salted:
                (results, rpc_s), reset_s = await load, 0.0
            else:
                (results, rpc_s), (_, reset_s) = await asyncio.gather(load, _timed(self._drop_stale_prefix_cache()))
            self.last_load = {**(results[0] if results else {}), "rpc_s": rpc_s, "reset_s": reset_s}
            self.last_load["salted"] = float(self.engine.salted)
            needs_reset = False  # done alongside the load, if it was needed
        if needs_reset:  # after the load
            await self._drop_stale_prefix_cache()
        dt = time.perf_counter() - t0
        log.debug("load_weights: %s in %.3fs", results, dt)
        return dt

    async def _load_through_vllm(self, update_info: dict) -> dict:
        """vLLM's weight-transfer engine: start (layerwise reload) / update / finish."""
        if self.weight_transfer != "ipc":
            raise RuntimeError(
                "got a vllm_ipc weight payload but this engine was built without vLLM's IPC "
                f"weight-transfer engine (EngineSpec.weight_transfer={self.weight_transfer!r})"
            )
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        engine = self.engine.async_llm
        t0 = time.perf_counter()
        await engine.start_weight_update()
        t1 = time.perf_counter()
        await engine.update_weights(WeightTransferUpdateRequest(update_info=ipc_update_info(update_info)))
        t2 = time.perf_counter()
        await engine.finish_weight_update()
        t3 = time.perf_counter()
        return {
            "path": "vllm_ipc",
            "backend_start_s": t1 - t0,
            "backend_load_s": t2 - t1,
            "backend_finish_s": t3 - t2,
            "tensors": len(update_info.get("names", ())),
        }

    async def _drop_stale_prefix_cache(self) -> None:
        engine = self.engine.async_llm
        # vLLM >= ~0.11: reset_prefix_cache(reset_running_requests=...) -> bool.
        # A plain reset fails (returns False) while requests hold KV blocks;
        # then preempt them so their KV is recomputed under the new weights --
        # otherwise old-weight blocks would stay cached for future prompts.
        try:
            ok = await engine.reset_prefix_cache()
        except Exception as e:  # noqa: BLE001  # pragma: no cover - engine without prefix caching
            log.warning("reset_prefix_cache failed: %s", e)
            return
        if ok is False and self.paused:
            return  # weights swapped in place: the frozen requests keep the KV they have
        if ok is False:
            try:
                await engine.reset_prefix_cache(reset_running_requests=True)
            except TypeError:  # older vLLM: no such argument
                log.warning("prefix cache not reset: requests in flight (old vLLM)")
