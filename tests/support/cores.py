"""Rollout cores for the tests that drive one replica directly (no coordinator): a core over the
fake engine with the calculator (:func:`core`), its orders (:func:`gen`), what came out
(:func:`ends`), the environments users write wrong (:class:`Raises`, :class:`WrongType`,
:class:`Hangs`), a multi-turn run config (:func:`run_cfg`), and a plain core over any backend
(:func:`plain_core`, e.g. the simulator's, which can keep its KV cache through a weight load).
"""

from __future__ import annotations

import asyncio

from shunter.engine.config import from_dict
from shunter.engine.data.environments import Calculator
from shunter.engine.replica.core import RolloutCore
from shunter.events import Generate, PromptSpec, SampleEnd, SamplingSpec, Stamper
from tests.support.fakes import CharTokenizer, FakeBackend

PROMPT = PromptSpec(prompt_id=1, text="12+34>", answer="46")


def tool_user(after_call: str = ""):
    """The fake model: calls the calculator on the prompt's expression, then writes
    ``after_call`` (then eos) once the tool has answered."""

    def respond(context: str) -> str:
        prompt, _, response = context.partition(">")
        return prompt + "=" if "=" not in response else after_call

    return respond


def final_answer(prompt: str, response: str, answer: str) -> float:
    return 1.0 if response.rsplit("=", 1)[-1].endswith(answer) else 0.0


def core(backend=None, environment=Calculator, **kw) -> RolloutCore:
    return RolloutCore(
        "standalone-0",
        backend or FakeBackend(token_s=0.01, respond=tool_user()),
        CharTokenizer(),
        final_answer,
        Stamper("t", "standalone-0"),
        environment=environment,
        env_name=getattr(environment, "__name__", "env"),
        **kw,
    )


def gen(n: int = 1, max_tokens: int = 20, group_id: int = 0) -> Generate:
    return Generate(group_id=group_id, prompt=PROMPT, n=n, sampling=SamplingSpec(max_tokens=max_tokens))


def ends(events) -> list:
    return [e.sample for e in events if isinstance(e, SampleEnd)]


class Raises(Calculator):
    async def step(self, action):
        raise ZeroDivisionError("the user's bug")


class WrongType(Calculator):
    async def step(self, action):
        return "46"


class Hangs(Calculator):
    async def step(self, action):
        await asyncio.Event().wait()


def run_cfg(**task):
    return from_dict(
        {
            "run": {"total_steps": 4, "policy": "separate"},
            "task": {"environment": "calculator", **task},
            "rollout": {"standalone_replicas": 2, "n_samples_per_prompt": 4, "max_tokens": 24, "max_staleness": 1},
            "trainer": {"ppo_mini_batch_size": 8, "parameter_sync_step": 1, "train_batch_size": 8},
            "validation": {"every": 2, "prompts": 4},
        }
    )


def plain_core(backend, **kw) -> RolloutCore:
    return RolloutCore("r0", backend, CountingTokenizer(), lambda p, r, a: 0.5, Stamper("run", "r0"), **kw)


class CountingTokenizer:
    """Every text is 8 tokens; every id decodes to nothing (the simulator's replicas need no more)."""

    eos_token_id = 0

    def encode(self, text: str) -> list[int]:
        return [1] * 8

    def decode(self, ids: list[int]) -> str:
        return ""
