"""The requests of one vLLM engine: ``VLLMRequests`` turns ``GenParams`` into vLLM's sampling
parameters, streams each request (``generate``), aborts them (``abort``), and keeps the table of
requests in flight.

``VLLMRequests`` is held by ``shunter.actors.vllm.backend.VLLMBackend``; it is given the
``VLLMEngine`` (vLLM's ``AsyncLLM``, the sampling types ``start()`` imported, whether prompts
take a cache salt, whether the engine is asleep) and the ``WeightEpoch`` that ``VLLMWeights``
advances (the salt of new requests). It imports no vLLM.

Invariants it keeps (numbered as in ``backend``): 2. tokens are never lost to an abort
(``generate`` returns the partial with ``finish_reason="abort"``; ``len(token_ids) ==
len(logprobs)``); 3. ``logprobs[i]`` is the log-prob of ``token_ids[i]`` as the engine sampled
it; and a call into an engine whose core died raises ``EngineDead``.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

from shunter.actors.vllm.engine import VLLMEngine, engine_call, engine_rpc
from shunter.actors.vllm.weights import WeightEpoch
from shunter.engine.replica.backend import GenParams, GenResult

_FINISH_MAP = {"stop": "stop", "length": "length", "abort": "abort"}


class VLLMRequests:
    """``VLLMBackend``'s requests: sampling parameters, ``generate``, ``abort``."""

    def __init__(self, engine: VLLMEngine, epoch: WeightEpoch):
        self.engine = engine
        self.epoch = epoch
        self._inflight: set[str] = set()
        self._abort_requested: set[str] = set()

    def running(self) -> list[str]:
        """The ids of the requests in flight."""
        return list(self._inflight)

    def _sampling_params(self, p: GenParams) -> Any:
        SamplingParams = self.engine.vllm["SamplingParams"]
        RequestOutputKind = self.engine.vllm["RequestOutputKind"]
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

    @engine_call
    async def generate(self, request_id: str, prompt_token_ids: list[int], params: GenParams) -> GenResult:
        """Generate one completion of ``prompt_token_ids``.

        Returns normally on "stop", "length" and on ``abort()`` / ``sleep()``
        (partial tokens, ``finish_reason="abort"``).  Cancelling the task that
        awaits this is *not* an abort: vLLM then drops the request and the
        ``CancelledError`` propagates (tokens are lost).  Request ids must be
        unique among in-flight requests (a resubmission uses a new id).
        """
        engine = self.engine.require()
        if self.engine.sleeping:
            raise RuntimeError("generate() called while the engine is asleep; call wake_up() first")
        if request_id in self._inflight:
            raise ValueError(f"request id {request_id!r} is already in flight")
        sp = self._sampling_params(params)
        prompt: dict[str, Any] = {"prompt_token_ids": [int(t) for t in prompt_token_ids]}  # TokensPrompt
        if self.engine.salted:
            prompt["cache_salt"] = f"w{self.epoch.loads}"  # prefix-cache hits only on blocks of these weights

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

    @engine_rpc
    async def abort(self, request_ids: list[str]) -> None:
        """Abort in-flight requests; their ``generate`` calls return partials.

        Ids that are not in flight (unknown, or already finished) are ignored.
        """
        engine = self.engine.require()
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
