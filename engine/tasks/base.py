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
import inspect
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ClassVar

from shunter.events.data import PromptSpec
from shunter.policies.registry import import_object

RewardFn = Callable[[str, str, str], float]
"""A task's reward: ``(prompt, response, answer) -> float``."""
Scorer = Callable[[PromptSpec, str], object]
"""What a replica calls on each finished sample: ``(prompt, response) -> float`` (or verl's dict
with ``"score"``); :func:`as_scorer` makes one of either signature a user writes."""
VERL_PARAMS = ("data_source", "solution_str", "ground_truth", "extra_info")

BUILTIN_TASKS: dict[str, str] = {
    "sort_digits": "shunter.engine.tasks.sort_digits:SortDigitsTask",
    "word_problems": "shunter.engine.tasks.word_problems:WordProblemsTask",
    "word_problems_tool": "shunter.engine.tasks.word_problems:WordProblemsToolTask",
}


@dataclass(frozen=True, slots=True)
class TaskPrompt:
    """One prompt: the text fed to the model and the answer the reward checks against."""

    text: str
    answer: str
    demo: str = ""
    """The warm start's target response when it is not the bare answer (a tool call, say)."""


def is_held_out(text: str, holdout_mod: int = 10) -> bool:
    """The validation rule: stable across processes and Python versions (no ``hash()``)."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % holdout_mod == 0


class Task(ABC):
    """A task samples prompts from an rng; the base class does the train/validation split."""

    name: ClassVar[str] = "task"
    stream: ClassVar[str] = ""
    """Whose prompt streams this task shares (a variant of another task poses its problems); empty: its own."""
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
        rng = random.Random(f"{self.stream or self.name}:train:{int(seed)}")
        while True:
            prompt = self.sample(rng)
            if not self.is_validation(prompt):
                yield prompt

    def validation_prompts(self, n: int, seed: int = 0) -> list[TaskPrompt]:
        """``n`` distinct held-out prompts, deterministic for ``seed``."""
        rng = random.Random(f"{self.stream or self.name}:validation:{int(seed)}")
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


BUILTIN_REWARDS: dict[str, str] = {"math": "shunter.engine.tasks.math_reward:compute_score"}


def load_reward(spec: str) -> Callable[..., object]:
    """A reward function by built-in name (``"math"``) or ``"module:function"``: a task's
    ``(prompt, response, answer)`` or verl's ``compute_score(data_source, solution_str,
    ground_truth, extra_info)``."""
    target = BUILTIN_REWARDS.get(spec, spec)
    if ":" not in target:
        known = ", ".join(sorted(BUILTIN_REWARDS))
        raise ValueError(f"unknown reward {spec!r}: not a built-in ({known}) nor 'module:function'")
    fn = import_object(target, "reward")
    if not callable(fn) or isinstance(fn, type):
        raise ValueError(f"reward spec {spec!r}: {fn!r} is not a callable function")
    as_scorer(fn)  # the signature is one of the two
    reward: Callable[..., object] = fn
    return reward


def as_scorer(fn: Callable[..., object]) -> Scorer:
    """The replica's call for a reward function of either signature, or a ``ValueError`` naming
    the function and the forms a reward takes:

    - verl's, when it has a parameter named ``data_source``, ``solution_str`` or ``ground_truth``:
      called by keyword with those of ``data_source, solution_str, ground_truth, extra_info`` it
      accepts (all of them with ``**kwargs``), so their order and defaults are its own; it must
      take the first three (``extra_info`` may be left out, as verl's own default allows), and
      any other parameter it requires is refused;
    - verl's, by position in that order, when it requires 4 positional arguments of other names;
    - else a task's ``(prompt, response, answer)``, by position.

    An ``async`` function is refused: rewards run synchronously in worker threads."""
    name = getattr(fn, "__qualname__", repr(fn))
    if any(inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f) for f in (fn, type(fn).__call__)):
        raise ValueError(f"reward function {name} is async; reward functions must be synchronous (plain def)")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: take it as a task's
        params = []
    names = _verl_names(name, params)
    if names:
        return lambda p, response: fn(**{k: v for k, v in _verl_args(p, response).items() if k in names})
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
    required = [p for p in positional if p.default is p.empty]
    if len(required) == 4:
        return lambda p, response: fn(*_verl_args(p, response).values())
    if not params or len(required) <= 3 <= len(positional) or varargs:
        return lambda p, response: fn(p.text, response, p.answer)
    raise ValueError(
        f"reward function {name} takes {len(positional)} positional arguments; a reward takes 3, "
        f"(prompt, response, answer), or verl's 4, ({', '.join(VERL_PARAMS)})"
    )


def _verl_names(name: str, params: list[inspect.Parameter]) -> tuple[str, ...]:
    """The verl parameters a function takes by keyword, when it names one of verl's first three;
    ``()`` when it names none. One that also requires a parameter of another name, or that
    cannot take one of verl's first three (verl passes them by name), is refused."""
    by_name = {p.name: p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if not set(by_name) & set(VERL_PARAMS[:3]):
        return ()
    any_keyword = any(p.kind is p.VAR_KEYWORD for p in params)
    names = tuple(n for n in VERL_PARAMS if any_keyword or n in by_name)
    required = [p for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    other = [p.name for p in required if p.kind is p.POSITIONAL_ONLY or p.name not in names]
    if other:
        raise ValueError(
            f"reward function {name} takes verl's {', '.join(n for n in names if n in by_name)} but also requires "
            f"{', '.join(other)}; a reward takes (prompt, response, answer) by position, or verl's "
            f"({', '.join(VERL_PARAMS)}) by name"
        )
    missing = [n for n in VERL_PARAMS[:3] if n not in names]
    if missing:
        raise ValueError(
            f"reward function {name} takes verl's {', '.join(n for n in names if n in by_name)} but not "
            f"{', '.join(missing)}: a verl reward is called by name with {', '.join(VERL_PARAMS[:3])} (and "
            f"extra_info if it takes it), so it must take {', '.join(missing)} (or **kwargs)"
        )
    return names


def _verl_args(p: PromptSpec, response: str) -> dict[str, object]:
    """verl's four arguments for one sample, in verl's order."""
    return {
        "data_source": p.data_source,
        "solution_str": response,
        "ground_truth": p.answer,
        "extra_info": dict(p.extra_info),
    }


def score_of(result: object) -> object:
    """A reward's result as the number it scores: a float, or verl's dict's ``"score"``."""
    if isinstance(result, dict):
        return result.get("score", result)
    return result
