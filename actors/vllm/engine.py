"""The vLLM engine of one replica: ``VLLMEngine`` builds vLLM's ``AsyncLLM`` from an ``EngineSpec``,
learns what the installed vLLM can do, puts it to sleep and wakes it, says whether its core died,
and shuts it down; ``engine_call`` / ``engine_rpc`` turn a call into a dead core into ``EngineDead``.

``VLLMEngine`` is held by ``shunter.actors.vllm.backend.VLLMBackend`` and given to its parts
(``VLLMRequests``, ``VLLMWeights``), which reach vLLM through ``require()`` / ``async_llm`` and
read what ``start()`` learned (``keeps_kv``, ``salted``, the sampling types in ``vllm``). It is
given only the spec.

Invariants it keeps: a call into an engine whose core died raises ``EngineDead`` (within
``DEATH_POLL_S`` for a call that waits on the core); the vLLM-version differences of building
and sleeping the engine stay here. Importing it is cheap: vLLM is imported lazily in ``start()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from shunter.engine.replica.backend import EngineDead

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


DEATH_POLL_S = 0.5
"""How often a call waiting on the engine core (a weight load, a pause, a sleep) checks that
the core is still alive."""


def cpu_threads(bind: str, tensor_parallel_size: int, given: str | None) -> str | None:
    """``OMP_NUM_THREADS`` for the workers of a tensor-parallel engine on CPU (they inherit it),
    or None to leave it as it is. A binding that names the cores ('0|1'), or 'auto', sets each
    rank's threads itself (vLLM: one per core named); so does an engine of one rank. Unbound
    ('nobind': the default, no core named by two engines), each rank would start one thread per
    core of the machine, all spinning against each other on the same cores (measured on 2
    cores: TP=2 decode about 5x slower than bound): each rank gets its share of what the process
    was given (``given``; Ray gives an actor its ``num_cpus``), one thread at least."""
    if bind != "nobind" or tensor_parallel_size <= 1:
        return None
    try:
        have = max(1, int(given or 1))
    except ValueError:
        have = 1
    return str(max(1, have // tensor_parallel_size))


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
    # always there). Needed for the ``vllm_ipc`` payloads of ``engine.weights.transport``.
    weight_transfer: str = ""
    # vLLM tensor parallelism: > 1 runs the model on this many worker processes (one device each)
    # under vLLM's multiprocessing executor, which the engine core starts and watches: a worker
    # that dies takes the core down with it (``dead()`` then says so).
    tensor_parallel_size: int = 1
    extra: dict = field(default_factory=dict)  # passed through to AsyncEngineArgs


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


def _has_cache_salt() -> bool:
    """Whether this vLLM's prompts take ``cache_salt`` (folded into the first block's hash, so
    every block of a salted request hashes apart from the same tokens under another salt)."""
    try:
        from vllm.inputs import TokensPrompt
    except ImportError:  # pragma: no cover - another vLLM layout
        return False
    return "cache_salt" in getattr(TokensPrompt, "__annotations__", {})


def _ipc_init_info() -> dict:
    """vLLM >= 0.27 agrees on the packed format at init (``packed`` in the init info);
    0.26 has an empty init info and says ``packed`` in every update."""
    from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferInitInfo

    return {"packed": True} if "packed" in IPCWeightTransferInitInfo.__dataclass_fields__ else {}


class VLLMEngine:
    """One vLLM ``AsyncLLM`` engine: built by ``start()``, gone after ``shutdown()``.

    All methods must be called from the event loop that ran ``start()``.
    """

    def __init__(self, spec: EngineSpec):
        self.spec = spec
        self.async_llm: Any = None  # vLLM's AsyncLLM (None before start() and after shutdown())
        self.vllm: dict[str, Any] = {}  # lazily imported vLLM symbols
        self.sleeping = False
        self.on_cpu = False
        self.timings: dict[str, float] = {}  # informational: start-up breakdown
        self.keeps_kv = False  # set by start(): this vLLM can pause with the KV cache and label versions
        self.salted = False  # set by start(): requests carry cache_salt (no prefix-cache reset on a load)

    # ------------------------------------------------------------------ start

    async def start(self) -> None:
        if self.async_llm is not None:
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
        self.vllm = {"SamplingParams": SamplingParams, "RequestOutputKind": RequestOutputKind}
        self.on_cpu = bool(getattr(current_platform, "is_cpu", lambda: False)())
        threads = cpu_threads(
            os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
            self.spec.tensor_parallel_size if self.on_cpu else 1,
            os.environ.get("OMP_NUM_THREADS"),
        )
        if threads is not None:
            os.environ["OMP_NUM_THREADS"] = threads
        t1 = time.perf_counter()

        kwargs: dict[str, Any] = dict(
            model=str(model_dir),
            tokenizer=str(model_dir),
            seed=self.spec.seed,
            max_model_len=self.spec.max_model_len,
            max_num_seqs=self.spec.max_num_seqs,
            enforce_eager=self.spec.enforce_eager,
            gpu_memory_utilization=self.spec.gpu_memory_utilization,
            enable_sleep_mode=self.spec.enable_sleep_mode and not self.on_cpu,
            worker_extension_cls=_EXT_QUALNAME,
            logprobs_mode=_LOGPROBS_MODE,  # exists since vLLM ~0.10.2
            disable_log_stats=True,
        )
        if self.spec.stream_interval > 1 and "stream_interval" in getattr(AsyncEngineArgs, "__dataclass_fields__", {}):
            kwargs["stream_interval"] = self.spec.stream_interval
        if self.spec.tensor_parallel_size > 1:
            # "mp", not vLLM's default inside a Ray placement group ("ray"): the replica's workers
            # are its own child processes on the devices its actor was given
            kwargs["tensor_parallel_size"] = self.spec.tensor_parallel_size
            kwargs["distributed_executor_backend"] = "mp"
        if self.spec.weight_transfer:
            kwargs["weight_transfer_config"] = {"backend": self.spec.weight_transfer}
        kwargs.update(self.spec.extra)
        try:
            args = AsyncEngineArgs(**kwargs)
            # Blocks this loop for the engine-core start-up (seconds); the
            # client objects bind to the running loop, so build it here.
            self.async_llm = AsyncLLM.from_engine_args(args)
            if self.spec.weight_transfer:
                from vllm.distributed.weight_transfer.base import (
                    WeightTransferInitRequest,
                )

                await self.async_llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=_ipc_init_info()))
        except Exception as e:
            raise BackendStartError(
                f"vLLM engine failed to start for model dir {str(model_dir)!r}: {type(e).__name__}: {e}"
            ) from e
        self.sleeping = False
        self.keeps_kv = _can_keep(self.async_llm)
        self.salted = _has_cache_salt()
        self.timings["start_import_s"] = t1 - t0
        self.timings["start_engine_s"] = time.perf_counter() - t1

    def dead(self, error: BaseException | None = None) -> bool:
        """Whether the engine core died (``error``: what a call just raised)."""
        try:
            from vllm.v1.engine.exceptions import EngineDeadError
        except ImportError:  # pragma: no cover - another vLLM layout
            EngineDeadError = ()  # noqa: N806
        return isinstance(error, EngineDeadError) or bool(getattr(self.async_llm, "errored", False))

    def require(self) -> Any:
        """vLLM's ``AsyncLLM``, once started."""
        if self.async_llm is None:
            raise RuntimeError("VLLMBackend used before start() (or after shutdown())")
        return self.async_llm

    # ------------------------------------------------------------ sleep/wake

    async def sleep(self, level: int) -> None:
        """vLLM's sleep at ``level`` (the caller aborts the requests in flight first)."""
        engine = self.require()
        # 0.32: sleep(level, mode="abort"); older: sleep(level). Positional
        # level works for both.
        await engine.sleep(level)
        self.sleeping = True

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Re-acquire memory (``tags``: only those, GPU only); asleep until all of it is back."""
        engine = self.require()
        if not self.sleeping:
            return
        if tags is None:
            await engine.wake_up()
            self.sleeping = False
            return
        fully_awake = await engine.wake_up(list(tags))
        # 0.32 returns bool; older releases return None -> ask the engine.
        if fully_awake is None:
            with contextlib.suppress(Exception):
                fully_awake = not await engine.is_sleeping()
        self.sleeping = not bool(fully_awake)

    def device_memory_used(self) -> int:
        """Bytes in use on this process's GPU (whole device; 0 on CPU)."""
        if self.on_cpu:
            return 0
        try:
            import torch

            free, total = torch.cuda.mem_get_info()
            return int(total - free)
        except Exception:  # noqa: BLE001 - informational only
            return 0

    # --------------------------------------------------------------- shutdown

    async def shutdown(self, running: list[str]) -> None:
        """Abort ``running`` (the requests in flight) and shut the engine down."""
        engine, self.async_llm = self.async_llm, None
        if engine is None:
            return
        if running:
            with contextlib.suppress(Exception):
                await engine.abort(running)
        engine.shutdown()
        self.sleeping = False


class OnEngine(Protocol):
    """An object whose calls go to a ``VLLMEngine`` (what ``engine_call`` / ``engine_rpc`` wrap)."""

    engine: VLLMEngine


def engine_call(fn: Any) -> Any:
    """A call into vLLM: an error that means the engine core is gone (``EngineDeadError``, or
    any error once the engine reports itself errored) becomes ``EngineDead``."""

    @functools.wraps(fn)
    async def call(self: OnEngine, *args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(self, *args, **kwargs)
        except EngineDead:
            raise
        except Exception as e:
            if self.engine.dead(e):
                raise EngineDead(f"the vLLM engine core is gone ({type(e).__name__}: {e})") from e
            raise

    return call


def engine_rpc(fn: Any) -> Any:
    """An ``engine_call`` that waits on the engine core's answer to a utility call
    (``collective_rpc``, ``pause_generation``, ``sleep``, ...). vLLM fails a request's output
    stream when its core process dies, but never the future of a utility call in flight: a
    ``kill -9`` of ``VLLM::EngineCore`` during a weight load would hang the call until
    ``run.timeout_s``. So the call is raced against the core's death (vLLM's own liveness
    monitor sets ``errored``), checked every ``DEATH_POLL_S``: ``EngineDead`` within a second."""
    inner = engine_call(fn)

    @functools.wraps(fn)
    async def call(self: OnEngine, *args: Any, **kwargs: Any) -> Any:
        task = asyncio.ensure_future(inner(self, *args, **kwargs))
        try:
            while not (await asyncio.wait({task}, timeout=DEATH_POLL_S))[0]:
                if self.engine.dead():
                    raise EngineDead(f"the vLLM engine core is gone (its process exited during {fn.__name__})")
            return task.result()
        finally:
            task.cancel()  # the caller was cancelled, or the engine died: the call goes too

    return call
