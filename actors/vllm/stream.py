"""The streaming half of ``VLLMBackend``: ``generate`` / ``abort``, and the wrappers that turn a
dead engine core into ``EngineDead``.

``VLLMStream`` is a mixin of ``shunter.actors.vllm.backend.VLLMBackend`` (it holds no state of
its own: ``VLLMBackend.__init__`` sets what its methods use). It imports no vLLM: the
sampling types come from ``self._vllm``, which ``start()`` fills.

Invariants it keeps (numbered as in ``vllm_backend``): 2. tokens are never lost to an abort
(``generate`` returns the partial with ``finish_reason="abort"``; ``len(token_ids) ==
len(logprobs)``); 3. ``logprobs[i]`` is the log-prob of ``token_ids[i]`` as the engine sampled
it; and a call into an engine whose core died raises ``EngineDead``, within ``DEATH_POLL_S``
for a call that waits on the core.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
from typing import TYPE_CHECKING, Any

from shunter.engine.replica.backend import EngineDead, GenParams, GenResult

if TYPE_CHECKING:
    from shunter.actors.vllm.backend import VLLMBackend

_FINISH_MAP = {"stop": "stop", "length": "length", "abort": "abort"}


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


class VLLMStream:
    """``VLLMBackend``'s requests: sampling parameters, ``generate``, ``abort`` (a mixin)."""

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
