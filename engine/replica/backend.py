"""What a rollout replica needs from an inference engine, as a protocol.

Invariant: the engine core (``RolloutCore``) sees only this protocol, never vLLM, so the
same sample loop runs on vLLM (``shunter.actors.vllm.backend``), on the bench simulator,
and on test fakes. ``generate`` returns the tokens produced so far when a request is
aborted (``finish_reason == "abort"``): a cut generation loses nothing. A backend whose
engine is gone for good (its process killed) raises :class:`EngineDead` from every call: the
replica is then dead as a whole (the executors kill it and report ``ReplicaDown``, so every
sample it held resumes elsewhere), never a string of failed generations.

Optional, for ``rollout.weight_update = "keep"``: ``pause()`` stops every request where it is
with its KV cache and returns the tokens each has made so far, ``resume(version)`` lets them go
on (on weights of ``version``); a backend that has them but cannot keep exactly says so with
``keeps_kv = False``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class GenParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    """Strings that end the request (an environment's tool-call ends), kept in the output:
    ``finish_reason`` is then ``"stop"`` and the tokens end with the string."""


@dataclass
class GenResult:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"
    marks: list[tuple[int, int]] | None = None
    """``(tokens made before, version)`` for each weight swap in place the request went through,
    when the backend tracks them itself (vLLM's weight-version spans); None: the caller's own
    count at ``pause`` stands."""


class EngineDead(RuntimeError):
    """The inference engine behind a replica died and cannot serve again (vLLM's
    ``EngineDeadError``: its ``EngineCore`` process is gone)."""


class Backend(Protocol):
    async def start(self) -> None: ...
    async def generate(self, request_id: str, prompt_token_ids: list[int], params: GenParams) -> GenResult: ...
    async def abort(self, request_ids: list[str]) -> None: ...
    async def load_weights(self, blob: bytes) -> float: ...
    async def sleep(self, level: int = 1) -> None: ...
    async def wake_up(self) -> None: ...
    async def shutdown(self) -> None: ...


class Tokenizer(Protocol):
    """What a replica tokenizes with. A tokenizer that renders chat prompts also has
    ``render(messages: list[ChatMessage]) -> list[int]`` (the chat template, with the
    generation prompt); without it, a chat prompt is refused naming the cause."""

    eos_token_id: int

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
