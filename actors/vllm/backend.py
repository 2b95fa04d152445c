"""A thin async generation backend on vLLM: ``VLLMBackend``, what a rollout replica runs on.

Invariants this backend keeps (callers rely on them):

1. No vLLM types cross its boundary.  Inputs and outputs are plain
   Python values (``EngineSpec``, ``GenParams``, ``GenResult``, ``bytes``,
   ``float``), so nothing else in shunter imports vLLM, and every vLLM version
   difference is absorbed in this package (``engine``, ``weights`` and
   ``extension``, the worker-side half).
2. Tokens are never lost to an abort: ``generate`` returns every token (and its
   log-prob) that the engine delivered before the request was aborted, with
   ``finish_reason="abort"``, instead of raising.  ``len(token_ids) ==
   len(logprobs)`` always holds for a returned ``GenResult``.
3. ``logprobs[i]`` is the log-probability of ``token_ids[i]`` under the
   distribution the engine actually sampled it from (after temperature /
   top-k / top-p; see ``_LOGPROBS_MODE`` in ``engine``) with the weights live at that step.
4. After ``load_weights`` returns, every forward pass -- including those of
   requests already in flight -- runs with the new weights, and no request
   started after it reuses a KV block computed with the old weights: requests
   carry a ``cache_salt`` of the weights' epoch, so prefix caching matches only
   blocks of the same weights (no cache reset: on an H200 a reset takes ~8 ms,
   a walk over every KV block, ten times the load's own round trip). A request
   in flight across a load keeps the KV it has (as ``pause_generation(mode=
   "keep")`` does); the rollout core aborts or pauses its requests before a
   load. A vLLM without ``cache_salt`` gets the reset instead.

``VLLMBackend`` is three parts behind one interface: ``engine`` (``VLLMEngine``: starts vLLM,
puts it to sleep, wakes it, shuts it down), ``requests`` (``VLLMRequests``: ``generate``,
``abort``; invariants 2 and 3) and ``weights`` (``VLLMWeights``: loads, keep-mode pause and
resume, weight groups; invariant 4); the two last share the engine and a ``WeightEpoch``. What
needs two parts is done here: a sleep or a shutdown aborts the requests in flight first. This
module imports no vLLM (importing it is cheap).
"""

from __future__ import annotations

from shunter.actors.vllm.engine import EngineSpec, VLLMEngine, engine_rpc
from shunter.actors.vllm.requests import VLLMRequests
from shunter.actors.vllm.weights import VLLMWeights, WeightEpoch
from shunter.engine.replica.backend import GenParams, GenResult


class VLLMBackend:
    """One vLLM ``AsyncLLM`` engine behind a small, version-neutral interface.

    All methods must be called from the event loop that ran ``start()``.
    """

    def __init__(self, spec: EngineSpec):
        self.spec = spec
        self.engine = VLLMEngine(spec)
        epoch = WeightEpoch()  # loads so far: the salt of new requests
        self.requests = VLLMRequests(self.engine, epoch)
        self.weights = VLLMWeights(self.engine, epoch, spec.weight_transfer)

    # ------------------------------------------------------------ engine

    async def start(self) -> None:
        await self.engine.start()

    def dead(self, error: BaseException | None = None) -> bool:
        """Whether the engine core died (``error``: what a call just raised)."""
        return self.engine.dead(error)

    @property
    def timings(self) -> dict[str, float]:
        """Informational: start-up breakdown."""
        return self.engine.timings

    @property
    def keeps_kv(self) -> bool:
        """Set by start(): this vLLM can pause with the KV cache and label versions."""
        return self.engine.keeps_kv

    @engine_rpc
    async def sleep(self, level: int = 1) -> None:
        """Release accelerator memory (level 1: offload weights, drop KV; level
        2: drop both).  In-flight requests are aborted first and return
        partial results.  On CPU vLLM's sleep is a no-op, but it is still
        called so the code path is the same as on GPU.
        """
        self.engine.require()
        if self.engine.sleeping:
            return
        running = self.requests.running()
        if running:
            await self.requests.abort(running)
        await self.engine.sleep(level)

    @engine_rpc
    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Re-acquire memory.  ``tags`` (GPU only, e.g. ``["weights"]`` then
        ``["kv_cache"]``) allows loading weights before re-allocating the KV
        cache; the backend counts as asleep until a wake-up without tags (or
        one that covers everything) has happened.
        """
        await self.engine.wake_up(tags)

    @property
    def is_sleeping(self) -> bool:
        return self.engine.sleeping

    def device_memory_used(self) -> int:
        """Bytes in use on this process's GPU (whole device; 0 on CPU)."""
        return self.engine.device_memory_used()

    async def shutdown(self) -> None:
        await self.engine.shutdown(self.requests.running())

    # ------------------------------------------------------------ requests

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: GenParams) -> GenResult:
        """``VLLMRequests.generate``: one completion; a partial one on abort."""
        return await self.requests.generate(request_id, prompt_token_ids, params)

    async def abort(self, request_ids: list[str]) -> None:
        """``VLLMRequests.abort``: in-flight requests return partials."""
        await self.requests.abort(request_ids)

    # ------------------------------------------------------------ weights

    @property
    def last_load(self) -> dict:
        """What the worker reported for the last weight load."""
        return self.weights.last_load

    @property
    def weight_group(self) -> str:
        """Backend of the weight group this replica joined ("" = none)."""
        return self.weights.weight_group

    @property
    def paused(self) -> bool:
        """Whether requests are frozen with their KV cache (a keep-mode load not yet resumed)."""
        return self.weights.paused

    async def pause(self) -> dict[str, int]:
        """``VLLMWeights.pause``: freeze every request with its KV cache."""
        return await self.weights.pause()

    async def resume(self, version: int = -1) -> None:
        """``VLLMWeights.resume``: the frozen requests go on, labelled ``version``."""
        await self.weights.resume(version)

    async def label_version(self, version: int) -> None:
        """``VLLMWeights.label_version``: tokens from here on are labelled ``version``."""
        await self.weights.label_version(version)

    async def join_weight_group(self, backend: str, host: str, port: int, timeout_s: float) -> float:
        """``VLLMWeights.join_weight_group``: seconds to join the trainer's weight group."""
        return await self.weights.join_weight_group(backend, host, port, timeout_s)

    def receives(self, blob: bytes) -> bool:
        """``VLLMWeights.receives``: whether ``blob``'s bytes come over the weight group."""
        return self.weights.receives(blob)

    async def receive_weights(self, blob: bytes, *, load: bool = False) -> dict:
        """``VLLMWeights.receive_weights``: receive (and, with ``load``, install) a layout's weights."""
        return await self.weights.receive_weights(blob, load=load)

    async def load_weights(self, blob: bytes) -> float:
        """``VLLMWeights.load_weights``: install a weight payload; seconds taken."""
        return await self.weights.load_weights(blob)
