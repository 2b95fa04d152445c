"""Built-in verifiable task: arithmetic word problems, with or without a calculator tool.

``"ann,has,5,pens,and,buys,7,more,how,many,pens>"`` -> ``"12"``. The tiny model's 42-symbol
vocabulary has no space, so words are joined by commas; the numbers add (two or three
addends). The prompts are a pure function of the seed, so the offline generator
(``examples/make_word_problems.py``) writes the same problems as verl parquet datasets.

The two variants pose problems of the difficulty that shows what each can learn on CPU:

- ``word_problems`` (single turn): addends 1-9 (sums 2-27), what the tiny model (2 layers,
  ~0.5M parameters) can learn to add in its head; with addends up to 20 (sums to 60) it stayed
  at 0.15 greedy exact through 300 SFT and 300 GRPO steps;
- ``word_problems_tool`` (the calculator): addends 1-20, which the model cannot add in its head
  but can learn to copy into a calculator call. On 1-9 problems RL moved it *away* from the
  tool (its mental answers were right more often than its early calls), so the tool variant
  keeps the harder problems, where calling the tool is what pays.

``revision`` names a variant's distribution; the tiny model's build marker records it, so a
model warm-started on an older revision is rebuilt rather than reused.

Invariants:

- the reward is a pure function of (response, answer) in [0, 1], equal to 1.0 exactly when
  the response's **last number** is the answer: a plain answer (``19``) and a calculator
  trajectory (``12+7=19``, the ``19`` being the tool's) score alike; otherwise partial credit,
  ``0.5 * (digits in place) / max(len)``, and 0.0 with no number at all;
- ``word_problems_tool``'s warm start demonstrates one prompt in three as a calculator call
  (``12+7=19``) instead of the bare answer, so the tiny model starts out calling the tool now
  and then, and RL can raise that share (``env/tool_ok``).
"""

from __future__ import annotations

import random
import re
from typing import Any, ClassVar

from .base import Task, TaskPrompt

NAMES = ("ann", "bob", "cat", "dan", "eve", "fay", "gus", "ivy", "jon", "kim", "lee", "max", "ned", "oli")
ITEMS = ("pens", "apples", "cards", "coins", "books", "shells", "stamps", "marbles")
LOW = 1
_NUMBER = re.compile(r"\d+")


def problem(rng: random.Random, high: int) -> tuple[str, list[int]]:
    """One problem's words (comma-joined, without the separator) and its addends (``LOW``-``high``)."""
    item = rng.choice(ITEMS)
    a, b = rng.randint(LOW, high), rng.randint(LOW, high)
    if rng.random() < 0.5:
        name = rng.choice(NAMES)
        return f"{name},has,{a},{item},and,buys,{b},more,how,many,{item}", [a, b]
    x, y, z = rng.sample(NAMES, 3)
    c = rng.randint(LOW, high)
    return f"{x},has,{a},{item},{y},has,{b},and,{z},has,{c},how,many,in,all", [a, b, c]


def score(response: str, answer: str) -> float:
    """The module docstring's reward: the response's last number against the answer."""
    numbers: list[str] = _NUMBER.findall(response)
    if not numbers:
        return 0.0
    out, target = numbers[-1], answer.strip()
    if out == target:
        return 1.0
    hits = sum(a == b for a, b in zip(out, target, strict=False))
    return 0.5 * hits / max(len(out), len(target), 1)


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    """The reward in verl's signature (``task.reward = "shunter.engine.tasks.word_problems:compute_score"``)."""
    del data_source, extra_info
    return score(solution_str, ground_truth)


class WordProblemsTask(Task):
    """Two or three addends of 1-9; the answer is their sum."""

    name: ClassVar[str] = "word_problems"
    high: ClassVar[int] = 9
    """The largest addend."""
    revision: ClassVar[int] = 2
    """The problem distribution's revision, recorded in the tiny model's build marker (1: addends 1-20)."""
    tool_share: ClassVar[float] = 0.0
    """Share of warm-start demonstrations written as a calculator call."""

    def sample(self, rng: random.Random) -> TaskPrompt:
        words, terms = problem(rng, self.high)
        answer = str(sum(terms))
        call = rng.random() < self.tool_share
        return TaskPrompt(
            text=words + ">", answer=answer, demo="+".join(map(str, terms)) + "=" + answer if call else ""
        )

    def reward(self, prompt: str, response: str, answer: str) -> float:
        del prompt
        return score(response, answer)


class WordProblemsToolTask(WordProblemsTask):
    """Two or three addends of 1-20, for the calculator; one warm-start demonstration in three
    calls it. Its prompts are drawn like ``word_problems``' revision 1 (the same seeds)."""

    name: ClassVar[str] = "word_problems_tool"
    stream: ClassVar[str] = "word_problems"
    high: ClassVar[int] = 20
    revision: ClassVar[int] = 1
    tool_share: ClassVar[float] = 1 / 3
