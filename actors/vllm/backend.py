"""The only module of shunter that imports vLLM: a thin async generation backend.

Invariants this module keeps (callers rely on them):

1. No vLLM types cross this module's boundary.  Inputs and outputs are plain
   Python values (``EngineSpec``, ``GenParams``, ``GenResult``, ``bytes``,
   ``float``), so nothing else in shunter imports vLLM, and every vLLM version
   difference is absorbed here (or in ``vllm_ext``, the worker-side half).
2. Tokens are never lost to an abort: ``generate`` returns every token (and its
   log-prob) that the engine delivered before the request was aborted, with
   ``finish_reason="abort"``, instead of raising.  ``len(token_ids) ==
   len(logprobs)`` always holds for a returned ``GenResult``.
3. ``logprobs[i]`` is the log-probability of ``token_ids[i]`` under the
   distribution the engine actually sampled it from (after temperature /
   top-k / top-p; see ``_LOGPROBS_MODE``) with the weights live at that step.
4. After ``load_weights`` returns, every forward pass -- including those of
   requests already in flight -- runs with the new weights, and no request
   started after it reuses a KV block computed with the old weights: requests
   carry a ``cache_salt`` of the weights' epoch, so prefix caching matches only
   blocks of the same weights (no cache reset: on an H200 a reset takes ~8 ms,
   a walk over every KV block, ten times the load's own round trip). A request
   in flight across a load keeps the KV it has (as ``pause_generation(mode=
   "keep")`` does); the rollout core aborts or pauses its requests before a
   load. A vLLM without ``cache_salt`` gets the reset instead.

Importing this module is cheap: vLLM is imported lazily in ``start()``.

The methods of ``VLLMBackend`` are in three modules: this one starts the engine, puts it to sleep,
wakes it and shuts it down; ``vllm_stream`` streams requests (``generate``, ``abort``, and
``EngineDead`` when the engine core is gone); ``vllm_weights`` loads weights (keep-mode pause and
resume, weight groups). The other two are mixins of ``VLLMBackend`` and re-exported here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shunter.actors.vllm.stream import VLLMStream, _engine_rpc
from shunter.actors.vllm.weights import (
    VLLMWeights,
    _ipc_init_info,
)
from shunter.engine.replica.backend import GenParams, GenResult
from shunter.engine.weights.group import Received

log = logging.getLogger(__name__)


# Dotted path of the worker extension; derived from our own package so that it
# follows the package if it is ever renamed (== "shunter.actors.vllm.extension...").
_EXT_QUALNAME = f"{__package__ or 'shunter.actors.vllm'}.extension.WeightSyncExtension"

# Which log-probs vLLM reports for the sampled token.
#   "raw_logprobs" (vLLM default): log_softmax of the model logits before
#       temperature / top-k / top-p -- i.e. the temperature-1 policy.
#   "processed_logprobs": log_softmax of the logits the sampler actually drew
#       from (after temperature scaling and top-k/top-p masking).
# We choose "processed_logprobs": an RL learner that importance-corrects
# against the behaviour policy needs the probability of the distribution the
# token was drawn from.  For temperature == 1 without top-k/top-p the two are
# identical; for greedy (temperature 0) vLLM reports the unscaled log_softmax.
# Caveat: with top-k/top-p the processed distribution is renormalised over the
# kept set, so a learner that recomputes log-probs at temperature T without
# the same truncation will disagree by that renormalisation.
_LOGPROBS_MODE = "processed_logprobs"

__all__ = ["BackendStartError", "EngineSpec", "GenParams", "GenResult", "VLLMBackend"]


def _can_keep(engine: Any) -> bool:
    """Whether this vLLM pauses requests with their KV cache (``pause_generation(mode="keep")``)
    and labels each token with the weight version that produced it (``update_weight_version``,
    reported as ``CompletionOutput.weight_versions``): both are needed to update weights in
    place and still say exactly which tokens which weights made."""
    import inspect

    pause = getattr(engine, "pause_generation", None)
    try:
        has_mode = pause is not None and "mode" in inspect.signature(pause).parameters
    except (TypeError, ValueError):
        has_mode = False
    return has_mode and callable(getattr(engine, "update_weight_version", None))


class BackendStartError(RuntimeError):
    """The engine could not be built; the message names the model dir."""


@dataclass(frozen=True)
class EngineSpec:
    model_dir: str
    seed: int = 0
    max_model_len: int = 256
    max_num_seqs: int = 256
    enforce_eager: bool = True
    gpu_memory_utilization: float = 0.5  # ignored on CPU
    enable_sleep_mode: bool = False  # GPU only (forced off on CPU)
    # vLLM hands tokens to this process every N tokens (and at the end, abort included, so
    # no token is lost): per-token host overhead of many concurrent streams otherwise costs
    # a large share of throughput. Ignored by vLLM releases without the option.
    stream_interval: int = 16
    # vLLM's own weight-transfer engine ("ipc"; "" = only shunter's worker extension, which is
    # always there). Needed for the ``vllm_ipc`` payloads of ``engine.weight_transport``.
    weight_transfer: str = ""
    extra: dict = field(default_factory=dict)  # passed through to AsyncEngineArgs


def _has_cache_salt() -> bool:
    """Whether this vLLM's prompts take ``cache_salt`` (folded into the first block's hash, so
    every block of a salted request hashes apart from the same tokens under another salt)."""
    try:
        from vllm.inputs import TokensPrompt
    except ImportError:  # pragma: no cover - another vLLM layout
        return False
    return "cache_salt" in getattr(TokensPrompt, "__annotations__", {})


class VLLMBackend(VLLMStream, VLLMWeights):
    """One vLLM ``AsyncLLM`` engine behind a small, version-neutral interface.

    All methods must be called from the event loop that ran ``start()``.
    """

    def __init__(self, spec: EngineSpec):
        self.spec = spec
        self._engine: Any = None
        self._vllm: dict[str, Any] = {}  # lazily imported vLLM symbols
        self._sleeping = False
        self._inflight: set[str] = set()
        self._abort_requested: set[str] = set()
        self._on_cpu = False
        self.timings: dict[str, float] = {}  # informational: start-up breakdown
        self.last_load: dict = {}  # what the worker reported for the last weight load
        self.weight_group = ""  # backend of the weight group this replica joined ("" = none)
        self._group_timeout_s = 120.0
        self._received = Received()  # what the weight group carried (not necessarily loaded)
        self.keeps_kv = False  # set by start(): this vLLM can pause with the KV cache and label versions
        self._paused = False
        self._salted = False  # set by start(): requests carry cache_salt (no prefix-cache reset on a load)
        self._epoch = 0  # loads so far: the salt of new requests

    # ------------------------------------------------------------------ start

    async def start(self) -> None:
        if self._engine is not None:
            return
        model_dir = Path(self.spec.model_dir)
        if not model_dir.is_dir():
            raise BackendStartError(f"model dir {str(model_dir)!r} does not exist or is not a directory")
        if not (model_dir / "config.json").is_file():
            raise BackendStartError(f"model dir {str(model_dir)!r} has no config.json (not an HF model dir)")

        # Harmless defaults: read only by vLLM's CPU platform (GiB of KV cache;
        # without it vLLM CPU sizes the KV cache from free RAM). Never overrides
        # a value the caller set.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

        t0 = time.perf_counter()
        try:
            from vllm import SamplingParams
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.platforms import current_platform
            from vllm.sampling_params import RequestOutputKind
            from vllm.v1.engine.async_llm import AsyncLLM
        except Exception as e:  # pragma: no cover - install problem
            raise BackendStartError(f"cannot import vLLM for model dir {str(model_dir)!r}: {e}") from e
        self._vllm = {"SamplingParams": SamplingParams, "RequestOutputKind": RequestOutputKind}
        self._on_cpu = bool(getattr(current_platform, "is_cpu", lambda: False)())
        t1 = time.perf_counter()

        kwargs: dict[str, Any] = dict(
            model=str(model_dir),
            tokenizer=str(model_dir),
            seed=self.spec.seed,
            max_model_len=self.spec.max_model_len,
            max_num_seqs=self.spec.max_num_seqs,
            enforce_eager=self.spec.enforce_eager,
            gpu_memory_utilization=self.spec.gpu_memory_utilization,
            enable_sleep_mode=self.spec.enable_sleep_mode and not self._on_cpu,
            worker_extension_cls=_EXT_QUALNAME,
            logprobs_mode=_LOGPROBS_MODE,  # exists since vLLM ~0.10.2
            disable_log_stats=True,
        )
        if self.spec.stream_interval > 1 and "stream_interval" in getattr(AsyncEngineArgs, "__dataclass_fields__", {}):
            kwargs["stream_interval"] = self.spec.stream_interval
        if self.spec.weight_transfer:
            kwargs["weight_transfer_config"] = {"backend": self.spec.weight_transfer}
        kwargs.update(self.spec.extra)
        try:
            args = AsyncEngineArgs(**kwargs)
            # Blocks this loop for the engine-core start-up (seconds); the
            # client objects bind to the running loop, so build it here.
            self._engine = AsyncLLM.from_engine_args(args)
            if self.spec.weight_transfer:
                from vllm.distributed.weight_transfer.base import (
                    WeightTransferInitRequest,
                )

                await self._engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=_ipc_init_info()))
        except Exception as e:
            raise BackendStartError(
                f"vLLM engine failed to start for model dir {str(model_dir)!r}: {type(e).__name__}: {e}"
            ) from e
        self._sleeping = False
        self.keeps_kv = _can_keep(self._engine)
        self._salted = _has_cache_salt()
        self.timings["start_import_s"] = t1 - t0
        self.timings["start_engine_s"] = time.perf_counter() - t1

    def dead(self, error: BaseException | None = None) -> bool:
        """Whether the engine core died (``error``: what a call just raised)."""
        try:
            from vllm.v1.engine.exceptions import EngineDeadError
        except ImportError:  # pragma: no cover - another vLLM layout
            EngineDeadError = ()  # noqa: N806
        return isinstance(error, EngineDeadError) or bool(getattr(self._engine, "errored", False))

    def _require(self) -> Any:
        if self._engine is None:
            raise RuntimeError("VLLMBackend used before start() (or after shutdown())")
        return self._engine

    # ------------------------------------------------------------ sleep/wake

    @_engine_rpc
    async def sleep(self, level: int = 1) -> None:
        """Release accelerator memory (level 1: offload weights, drop KV; level
        2: drop both).  In-flight requests are aborted first and return
        partial results.  On CPU vLLM's sleep is a no-op, but it is still
        called so the code path is the same as on GPU.
        """
        engine = self._require()
        if self._sleeping:
            return
        if self._inflight:
            await self.abort(list(self._inflight))
        # 0.32: sleep(level, mode="abort"); older: sleep(level). Positional
        # level works for both.
        await engine.sleep(level)
        self._sleeping = True

    @_engine_rpc
    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Re-acquire memory.  ``tags`` (GPU only, e.g. ``["weights"]`` then
        ``["kv_cache"]``) allows loading weights before re-allocating the KV
        cache; the backend counts as asleep until a wake-up without tags (or
        one that covers everything) has happened.
        """
        engine = self._require()
        if not self._sleeping:
            return
        if tags is None:
            await engine.wake_up()
            self._sleeping = False
            return
        fully_awake = await engine.wake_up(list(tags))
        # 0.32 returns bool; older releases return None -> ask the engine.
        if fully_awake is None:
            with contextlib.suppress(Exception):
                fully_awake = not await engine.is_sleeping()
        self._sleeping = not bool(fully_awake)

    @property
    def is_sleeping(self) -> bool:
        return self._sleeping

    def device_memory_used(self) -> int:
        """Bytes in use on this process's GPU (whole device; 0 on CPU)."""
        if self._on_cpu:
            return 0
        try:
            import torch

            free, total = torch.cuda.mem_get_info()
            return int(total - free)
        except Exception:  # noqa: BLE001 - informational only
            return 0

    # --------------------------------------------------------------- shutdown

    async def shutdown(self) -> None:
        engine, self._engine = self._engine, None
        if engine is None:
            return
        if self._inflight:
            with contextlib.suppress(Exception):
                await engine.abort(list(self._inflight))
        engine.shutdown()
        self._sleeping = False
