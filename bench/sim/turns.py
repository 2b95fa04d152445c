"""Multi-turn trajectories in the simulator: their plans and the simulated tool.

Invariants:

- a trajectory is a pure function of its key (the first token it generates): how many tool
  calls it makes (uniform on ``0..tool_calls_max``) and each turn's length (drawn as a
  response's is, at least 2 tokens), so it goes on the same on whichever replica resumes it,
  after a weight-update cut or a move;
- where a trajectory stands follows from its tokens alone: the turn is the number of tool
  calls (``CALL``) so far, the tokens made in it are those after the last call or observation
  (``OBS``) token;
- a tool call's latency is a pure function of (scenario seed, key, call index): lognormal
  (``env_latency_median_s``, ``env_latency_sigma``), capped at ``env_latency_max_s``, spent
  on the running loop's clock (virtual under ``looptime``); so a scenario replays identically.

Text is not modelled, but the rollout core finds tool calls by their text, so a multi-turn
simulated tokenizer spells every token (``spell``): ``.`` a filler, ``k<key>;`` the key,
``<call>`` a call (the tool's stop string), ``~`` an observation token.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
from typing import Any

from shunter.bench.sim.cost_model import CostModel, LengthSampler
from shunter.engine.data.environments import StepResult

EOS, FILL, CALL, OBS = 0, 1, 2, 3
KEY0 = 4
"""Keys are token ids from here on (never one of the tokens above)."""
CALL_TEXT = "<call>"
OBS_TEXT = "~"
_KEY = re.compile(r"k(\d+);")
_SPELL = {FILL: ".", CALL: CALL_TEXT, OBS: OBS_TEXT, EOS: ""}


def spell(ids: list[int]) -> str:
    return "".join(_SPELL.get(t, f"k{t};") for t in ids)


class Plans:
    """The trajectories of one replica's samples: new keys from its seeded sampler, plans by key."""

    def __init__(self, cost: CostModel, sampler: LengthSampler) -> None:
        self.cost, self.sampler = cost, sampler
        self._plans: dict[int, list[int]] = {}

    def plan(self, key: int) -> list[int]:
        """Generated tokens of each turn; all but the last end with a tool call."""
        got = self._plans.get(key)
        if got is None:
            if len(self._plans) > 1 << 16:
                self._plans.clear()
            rng = random.Random(key)
            calls = rng.randint(0, self.cost.tool_calls_max)
            got = self._plans[key] = [max(2, self.sampler.draw(rng)) for _ in range(calls + 1)]
        return got

    def next_turn(self, prefix: list[int], may_call: bool) -> tuple[int, int, bool]:
        """For a request whose tokens so far are ``prefix``: the trajectory's key, the tokens
        left in its current turn, and whether the turn ends with a tool call (``may_call``:
        the request has stop strings; without, the model answers once more and ends)."""
        key = prefix[0] if prefix else self.sampler.rng.randrange(KEY0, 2**31)
        turns = self.plan(key)
        start = 0
        for i in range(len(prefix) - 1, -1, -1):
            if prefix[i] in (CALL, OBS):
                start = i + 1
                break
        turn = min(prefix.count(CALL), len(turns) - 1)
        return key, max(0, turns[turn] - (len(prefix) - start)), may_call and turn < len(turns) - 1


def key_of(text: str) -> int:
    m = _KEY.search(text)
    return int(m.group(1)) if m else 0


class SimTool:
    """A tool that answers every call after a long-tailed latency (the environment protocol of
    ``shunter.engine.data.environments``; made per trajectory through ``functools.partial``)."""

    stop = (CALL_TEXT,)

    def __init__(self, cost: CostModel, seed: int) -> None:
        self.cost, self.seed = cost, seed
        self.key, self.calls = 0, 0

    async def reset(self, prompt: Any, transcript: str) -> None:
        self.key, self.calls = key_of(transcript), transcript.count(CALL_TEXT)

    def latency_s(self) -> float:
        c = self.cost
        rng = random.Random(f"{self.seed}:{self.key}:{self.calls}")
        return min(c.env_latency_max_s, rng.lognormvariate(math.log(c.env_latency_median_s), c.env_latency_sigma))

    async def step(self, action: str) -> StepResult:
        self.key = self.key or key_of(action)
        await asyncio.sleep(self.latency_s())
        self.calls += 1
        return StepResult(observation=OBS_TEXT * self.cost.observation_tokens, metrics={"calls": float(self.calls)})
