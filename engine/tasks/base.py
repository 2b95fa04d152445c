"""Verifiable tasks: prompt streams with a known answer and a reward in [0, 1].

Invariant: a task's training stream and its validation set never share a prompt. The
rule is a content hash, not a seed: a prompt is *held out* iff
``blake2b(text) % holdout_mod == 0`` (one prompt in ``holdout_mod``, default 10).
``train_prompts`` skips held-out prompts; ``validation_prompts`` yields only held-out
ones, so the split holds for every pair of seeds. Both streams are pure functions of
their seed (``random.Random``, no global state), so equal seeds give equal prompts.

Tasks and reward functions are only ever imported by the ``"module:attr"`` names a user
gives (or a built-in short name); nothing is evaluated or unpickled.
"""

from __future__ import annotations

import hashlib
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ClassVar

from shunter.policies.registry import import_object

RewardFn = Callable[[str, str, str], float]

BUILTIN_TASKS: dict[str, str] = {
    "sort_digits": "shunter.engine.tasks.sort_digits:SortDigitsTask",
}


@dataclass(frozen=True, slots=True)
class TaskPrompt:
    """One prompt: the text fed to the model and the answer the reward checks against."""

    text: str
    answer: str


def is_held_out(text: str, holdout_mod: int = 10) -> bool:
    """The validation rule: stable across processes and Python versions (no ``hash()``)."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % holdout_mod == 0


class Task(ABC):
    """A task samples prompts from an rng; the base class does the train/validation split."""

    name: ClassVar[str] = "task"
    holdout_mod: ClassVar[int] = 10

    @abstractmethod
    def sample(self, rng: random.Random) -> TaskPrompt:
        """Draw one prompt (train or held-out alike) using only ``rng``."""

    @abstractmethod
    def reward(self, prompt: str, response: str, answer: str) -> float:
        """Score a response in [0, 1]."""

    def is_validation(self, prompt: TaskPrompt) -> bool:
        return is_held_out(prompt.text, self.holdout_mod)

    def train_prompts(self, seed: int) -> Iterator[TaskPrompt]:
        """Infinite, deterministic for ``seed``; never yields a held-out prompt."""
        rng = random.Random(f"{self.name}:train:{int(seed)}")
        while True:
            prompt = self.sample(rng)
            if not self.is_validation(prompt):
                yield prompt

    def validation_prompts(self, n: int, seed: int = 0) -> list[TaskPrompt]:
        """``n`` distinct held-out prompts, deterministic for ``seed``."""
        rng = random.Random(f"{self.name}:validation:{int(seed)}")
        out: list[TaskPrompt] = []
        seen: set[str] = set()
        budget = max(1000, 1000 * n * self.holdout_mod)
        while len(out) < n:
            budget -= 1
            if budget < 0:
                raise ValueError(f"task {self.name!r} has fewer than {n} held-out prompts")
            prompt = self.sample(rng)
            if prompt.text not in seen and self.is_validation(prompt):
                seen.add(prompt.text)
                out.append(prompt)
        return out


def load_task(name_or_import: str) -> Task:
    """A built-in short name (``"sort_digits"``) or ``"module:Class"``; returns an instance."""
    spec = BUILTIN_TASKS.get(name_or_import, name_or_import)
    if ":" not in spec:
        known = ", ".join(sorted(BUILTIN_TASKS))
        raise ValueError(f"unknown task {name_or_import!r}: not a built-in ({known}) nor 'module:Class'")
    cls = import_object(spec, "task")
    if not isinstance(cls, type):
        raise ValueError(f"task spec {spec!r}: {cls!r} is not a class")
    task: Task = cls()
    missing = [m for m in ("train_prompts", "validation_prompts", "reward") if not callable(getattr(task, m, None))]
    if missing:
        raise ValueError(f"task spec {spec!r}: {cls.__name__} lacks {', '.join(missing)}")
    return task


def load_reward(spec: str) -> RewardFn:
    """Import a reward function ``(prompt, response, answer) -> float`` by ``"module:function"``."""
    fn = import_object(spec, "reward")
    if not callable(fn) or isinstance(fn, type):
        raise ValueError(f"reward spec {spec!r}: {fn!r} is not a callable function")
    reward: RewardFn = fn
    return reward
