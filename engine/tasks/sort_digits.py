"""Built-in verifiable task: sort 4-8 digits, ``"31942>"`` -> ``"12349"``.

Invariant: the reward is a pure function of (response, answer), always in [0, 1], and
equals 1.0 exactly when the whitespace-stripped response equals the answer:

    0.8 * (#positions i with out[i] == target[i]) / max(len(out), len(target))
  + 0.1 * [len(out) == len(target)]
  + 0.1 * [out == target]

The response is the text generated after the prompt, decoded without special tokens
(the eos token ends it). Any other character is compared literally, so it only costs.
"""

from __future__ import annotations

import random
from typing import ClassVar

from .base import Task, TaskPrompt

MIN_DIGITS = 4
MAX_DIGITS = 8
SEPARATOR = ">"


def reward(prompt: str, response: str, answer: str) -> float:
    """Partial-credit sort reward; ``prompt`` is unused (the answer already encodes it)."""
    del prompt
    out = response.strip()
    target = answer.strip()
    longest = max(len(out), len(target))
    if longest == 0:
        return 1.0
    matches = sum(1 for a, b in zip(out, target, strict=False) if a == b)
    score = 0.8 * matches / longest + 0.1 * (len(out) == len(target)) + 0.1 * (out == target)
    return min(1.0, max(0.0, score))


def make_prompt(digits: str) -> TaskPrompt:
    """The prompt for a digit string: ``"31942"`` -> ``TaskPrompt("31942>", "12349")``."""
    return TaskPrompt(text=digits + SEPARATOR, answer="".join(sorted(digits)))


class SortDigitsTask(Task):
    """Uniform length in [4, 8], digits i.i.d. uniform (repeats allowed)."""

    name: ClassVar[str] = "sort_digits"

    def sample(self, rng: random.Random) -> TaskPrompt:
        length = rng.randint(MIN_DIGITS, MAX_DIGITS)
        return make_prompt("".join(rng.choice("0123456789") for _ in range(length)))

    def reward(self, prompt: str, response: str, answer: str) -> float:
        return reward(prompt, response, answer)
