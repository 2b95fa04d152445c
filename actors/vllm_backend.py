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
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


# Dotted path of the worker extension; derived from our own package so that it
# follows the package if it is ever renamed (== "shunter.actors.vllm_ext...").
_EXT_QUALNAME = f"{__package__ or 'shunter.actors'}.vllm_ext.WeightSyncExtension"
_EXT_RPC = "shunter_load_safetensors"
_EXT_RPC_IPC = "shunter_load_cuda_ipc"
_EXT_RPC_JOIN = "shunter_join_weight_group"
_EXT_RPC_RECV = "shunter_recv_weights"

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

_FINISH_MAP = {"stop": "stop", "length": "length", "abort": "abort"}


from shunter.engine.backend import EngineDead, GenParams, GenResult  # noqa: E402 - the shared protocol types
from shunter.engine.weight_group import Received  # noqa: E402

__all__ = ["BackendStartError", "EngineSpec", "GenParams", "GenResult", "VLLMBackend"]


def _ipc_init_info() -> dict:
    """vLLM >= 0.27 agrees on the packed format at init (``packed`` in the init info);
    0.26 has an empty init info and says ``packed`` in every update."""
    from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferInitInfo

    return {"packed": True} if "packed" in IPCWeightTransferInitInfo.__dataclass_fields__ else {}


def _ipc_update_info(info: dict) -> dict:
    """shunter's packed update info with only the fields the installed vLLM knows."""
    from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferUpdateInfo

    return {k: v for k, v in info.items() if k in IPCWeightTransferUpdateInfo.__dataclass_fields__}


async def _timed(aw: Any) -> tuple[Any, float]:
    """(result, seconds until it came)."""
    t0 = time.perf_counter()
    return await aw, time.perf_counter() - t0


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


DEATH_POLL_S = 0.5
"""How often a call waiting on the engine core (a weight load, a pause, a sleep) checks that
the core is still alive."""


def _engine_call(fn: Any) -> Any:
    """A call into vLLM: an error that means the engine core is gone (``EngineDeadError``, or
    any error once the engine reports itself errored) becomes ``EngineDead``."""

    @functools.wraps(fn)
    async def call(self: VLLMBackend, *args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(self, *args, **kwargs)
        except EngineDead:
            raise
        except Exception as e:
            if self.dead(e):
                raise EngineDead(f"the vLLM engine core is gone ({type(e).__name__}: {e})") from e
            raise

    return call


def _engine_rpc(fn: Any) -> Any:
    """An ``_engine_call`` that waits on the engine core's answer to a utility call
    (``collective_rpc``, ``pause_generation``, ``sleep``, ...). vLLM fails a request's output
    stream when its core process dies, but never the future of a utility call in flight: a
    ``kill -9`` of ``VLLM::EngineCore`` during a weight load would hang the call until
    ``run.timeout_s``. So the call is raced against the core's death (vLLM's own liveness
    monitor sets ``errored``), checked every ``DEATH_POLL_S``: ``EngineDead`` within a second."""
    inner = _engine_call(fn)

    @functools.wraps(fn)
    async def call(self: VLLMBackend, *args: Any, **kwargs: Any) -> Any:
        task = asyncio.ensure_future(inner(self, *args, **kwargs))
        try:
            while not (await asyncio.wait({task}, timeout=DEATH_POLL_S))[0]:
                if self.dead():
                    raise EngineDead(f"the vLLM engine core is gone (its process exited during {fn.__name__})")
            return task.result()
        finally:
            task.cancel()  # the caller was cancelled, or the engine died: the call goes too

    return call


class VLLMBackend:
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

    # --------------------------------------------------------------- generate

    def _sampling_params(self, p: GenParams) -> Any:
        SamplingParams = self._vllm["SamplingParams"]
        RequestOutputKind = self._vllm["RequestOutputKind"]
        if p.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {p.max_tokens}")
        # "disabled" top-k: vLLM >= ~0.10 uses 0 (and maps -1 -> 0); older
        # releases used -1 and rejected 0.  Both spellings mean disabled here.
        top_k = p.top_k if p.top_k and p.top_k > 0 else 0
        kw = dict(
            n=1,
            max_tokens=p.max_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=top_k,
            seed=p.seed,
            stop_token_ids=list(p.stop_token_ids),
            ignore_eos=p.ignore_eos,
            logprobs=0,  # sampled token only (vLLM always includes it)
            detokenize=False,  # we deal in token ids only
            output_kind=RequestOutputKind.DELTA,
        )
        if p.stop:  # vLLM matches stop strings on the detokenized text
            kw.update(stop=list(p.stop), include_stop_str_in_output=True, detokenize=True)
        try:
            return SamplingParams(**kw)
        except ValueError:
            if top_k == 0:  # pre-0.10 spelling of "disabled"
                kw["top_k"] = -1
                return SamplingParams(**kw)
            raise

    @_engine_call
    async def generate(self, request_id: str, prompt_token_ids: list[int], params: GenParams) -> GenResult:
        """Generate one completion of ``prompt_token_ids``.

        Returns normally on "stop", "length" and on ``abort()`` / ``sleep()``
        (partial tokens, ``finish_reason="abort"``).  Cancelling the task that
        awaits this is *not* an abort: vLLM then drops the request and the
        ``CancelledError`` propagates (tokens are lost).  Request ids must be
        unique among in-flight requests (a resubmission uses a new id).
        """
        engine = self._require()
        if self._sleeping:
            raise RuntimeError("generate() called while the engine is asleep; call wake_up() first")
        if request_id in self._inflight:
            raise ValueError(f"request id {request_id!r} is already in flight")
        sp = self._sampling_params(params)
        prompt: dict[str, Any] = {"prompt_token_ids": [int(t) for t in prompt_token_ids]}  # TokensPrompt
        if self._salted:
            prompt["cache_salt"] = f"w{self._epoch}"  # prefix-cache hits only on blocks of these weights

        tokens: list[int] = []
        logprobs: list[float] = []
        finish: str | None = None
        spans: Any = None
        self._inflight.add(request_id)
        try:
            stream = engine.generate(prompt, sp, request_id)
            async with contextlib.aclosing(stream):
                async for out in stream:
                    for comp in out.outputs:  # n == 1: exactly one completion
                        self._take(comp, tokens, logprobs)
                        if comp.finish_reason is not None:
                            finish = str(comp.finish_reason)
                        spans = getattr(comp, "weight_versions", None) or spans
                    if out.finished:
                        break
                    if request_id in self._abort_requested:
                        # abort() raced ahead of vLLM registering the request;
                        # repeat it now that vLLM knows the id.
                        await engine.abort(request_id)
        finally:
            self._inflight.discard(request_id)
            aborted_by_us = request_id in self._abort_requested
            self._abort_requested.discard(request_id)

        if finish is None:
            # Stream ended without a finish reason: only happens on abort.
            finish = "abort"
        if aborted_by_us and finish not in ("stop", "length"):
            finish = "abort"
        if finish not in _FINISH_MAP:
            raise RuntimeError(
                f"request {request_id!r} finished with vLLM reason {finish!r} after {len(tokens)} tokens"
            )
        return GenResult(token_ids=tokens, logprobs=logprobs, finish_reason=_FINISH_MAP[finish], marks=_marks(spans))

    # ------------------------------------------------- weights in place (keep mode)

    @_engine_rpc
    async def pause(self) -> dict[str, int]:
        """Freeze every request with its KV cache (vLLM's ``pause_generation(mode="keep")``);
        returns nothing per request: each result says where its weights changed (``marks``)."""
        if not self.keeps_kv:
            raise RuntimeError("this vLLM cannot pause requests with their KV cache and label weight versions")
        await self._require().pause_generation(mode="keep", clear_cache=False)
        self._paused = True
        return {}

    @_engine_rpc
    async def resume(self, version: int = -1) -> None:
        """Let the frozen requests go on; tokens from here on are labelled ``version``."""
        engine = self._require()
        try:
            if version >= 0:
                await engine.update_weight_version(str(version))
        finally:
            self._paused = False
            await engine.resume_generation()

    @staticmethod
    def _take(comp: Any, tokens: list[int], logprobs: list[float]) -> None:
        new = list(comp.token_ids)
        if not new:
            return
        lps = comp.logprobs
        if lps is None or len(lps) != len(new):
            raise RuntimeError(
                f"vLLM returned {len(new)} tokens but {'no' if lps is None else len(lps)} log-prob positions"
            )
        # Each position is a {token_id: Logprob} mapping (a dict, or a view of
        # vLLM's FlatLogprobs); the sampled token is always present.
        for tok, pos in zip(new, lps, strict=False):
            entry = pos[tok]
            lp = float(entry.logprob)
            if math.isnan(lp):
                raise RuntimeError(f"NaN log-prob for sampled token {tok}")
            tokens.append(int(tok))
            logprobs.append(lp)

    @_engine_rpc
    async def abort(self, request_ids: list[str]) -> None:
        """Abort in-flight requests; their ``generate`` calls return partials.

        Ids that are not in flight (unknown, or already finished) are ignored.
        """
        engine = self._require()
        ids = [r for r in request_ids if r in self._inflight]
        if not ids:
            return
        self._abort_requested.update(ids)
        await engine.abort(ids)

    # ---------------------------------------------------------- weight groups

    async def join_weight_group(self, backend: str, host: str, port: int, timeout_s: float) -> float:
        """Join the trainer's weight group for this replica (rank 1, in the worker); seconds."""
        t0 = time.perf_counter()
        await self._require().collective_rpc(_EXT_RPC_JOIN, args=(backend, host, port, timeout_s))
        self.weight_group, self._group_timeout_s = backend, timeout_s
        self._received.joined()
        return time.perf_counter() - t0

    def receives(self, blob: bytes) -> bool:
        """Whether ``blob`` is a layout whose bytes come over this replica's weight group (the
        trainer sends them beside the command that carried it, so they must be received)."""
        from shunter.engine import weight_transport as wt

        return bool(self.weight_group) and wt.payload_kind(blob) in (wt.CUDA_IPC, wt.FLAT)

    async def receive_weights(self, blob: bytes, *, load: bool = False) -> dict:
        """Receive (and, with ``load``, install) the weights a layout names over the group;
        a layout already received is only installed."""
        from shunter.engine import weight_transport as wt

        version = wt.package_layout(blob)["version"]
        fresh = self._received.fresh(version)
        results = await self._require().collective_rpc(
            _EXT_RPC_RECV, args=(bytes(blob), self._group_timeout_s, fresh, load)
        )
        self._received.got(version)
        return results[0] if results else {}

    # ---------------------------------------------------------------- weights

    @_engine_rpc
    async def load_weights(self, blob: bytes) -> float:
        """Install a safetensors-serialised HF state dict; returns seconds taken.

        In-flight requests keep running and switch to the new weights at the
        next engine step (their earlier tokens were produced by the old ones).
        """
        engine = self._require()
        if not isinstance(blob, (bytes, bytearray, memoryview)):
            raise TypeError(f"load_weights expects bytes, got {type(blob).__name__}")
        t0 = time.perf_counter()
        from shunter.engine import weight_transport as wt

        kind = wt.payload_kind(blob)
        self._epoch += 1  # before the load: a request admitted while it runs computes on the new weights
        needs_reset = not self._salted  # salted requests never match the old weights' blocks
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
            if self._salted:
                (results, rpc_s), reset_s = await load, 0.0
            else:
                (results, rpc_s), (_, reset_s) = await asyncio.gather(load, _timed(self._drop_stale_prefix_cache()))
            self.last_load = {**(results[0] if results else {}), "rpc_s": rpc_s, "reset_s": reset_s}
            self.last_load["salted"] = float(self._salted)
            needs_reset = False  # done alongside the load, if it was needed
        if needs_reset:  # after the load
            await self._drop_stale_prefix_cache()
        dt = time.perf_counter() - t0
        log.debug("load_weights: %s in %.3fs", results, dt)
        return dt

    async def _load_through_vllm(self, update_info: dict) -> dict:
        """vLLM's weight-transfer engine: start (layerwise reload) / update / finish."""
        if self.spec.weight_transfer != "ipc":
            raise RuntimeError(
                "got a vllm_ipc weight payload but this engine was built without vLLM's IPC "
                f"weight-transfer engine (EngineSpec.weight_transfer={self.spec.weight_transfer!r})"
            )
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        engine = self._engine
        t0 = time.perf_counter()
        await engine.start_weight_update()
        t1 = time.perf_counter()
        await engine.update_weights(WeightTransferUpdateRequest(update_info=_ipc_update_info(update_info)))
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
        engine = self._engine
        # vLLM >= ~0.11: reset_prefix_cache(reset_running_requests=...) -> bool.
        # A plain reset fails (returns False) while requests hold KV blocks;
        # then preempt them so their KV is recomputed under the new weights --
        # otherwise old-weight blocks would stay cached for future prompts.
        try:
            ok = await engine.reset_prefix_cache()
        except Exception as e:  # noqa: BLE001  # pragma: no cover - engine without prefix caching
            log.warning("reset_prefix_cache failed: %s", e)
            return
        if ok is False and self._paused:
            return  # weights swapped in place: the frozen requests keep the KV they have
        if ok is False:
            try:
                await engine.reset_prefix_cache(reset_running_requests=True)
            except TypeError:  # older vLLM: no such argument
                log.warning("prefix cache not reset: requests in flight (old vLLM)")

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


def _marks(spans: Any) -> list[tuple[int, int]] | None:
    """vLLM's weight-version spans of one completion (``WeightVersionSpan(version, start,
    end)``) as ``(tokens before, version)`` marks (None: the engine labelled nothing; labels
    that are not shunter's version numbers are skipped)."""
    out = []
    for span in spans or ():
        try:
            out.append((int(span.start), int(span.version)))
        except (AttributeError, TypeError, ValueError):
            continue
    return out or None
