"""Verifiable tasks: prompts with a known answer and a reward in [0, 1]; the built-in rewards.

- ``base``: ``Task`` (what a task is), loading tasks and rewards by the names users give
  (built-in short names or ``"module:attr"``), telling a reward's signature (``as_scorer``);
- ``sort_digits``: the built-in task that learns on a CPU — sort 4-8 digits;
- ``word_problems``: arithmetic word problems, with or without a calculator tool;
- ``math_reward``: a math reward of verl's signature on math-verify (``task.reward = "math"``).

Invariant: everything here is importable without torch, Ray or vLLM. The names below are the
public API for users' tasks (``from shunter.engine.tasks import Task``).
"""

from .base import (
    BUILTIN_REWARDS,
    BUILTIN_TASKS,
    RewardFn,
    Scorer,
    Task,
    TaskPrompt,
    as_scorer,
    is_held_out,
    load_reward,
    load_task,
    score_of,
)
from .sort_digits import SortDigitsTask

__all__ = [
    "BUILTIN_REWARDS",
    "BUILTIN_TASKS",
    "RewardFn",
    "Scorer",
    "SortDigitsTask",
    "Task",
    "TaskPrompt",
    "as_scorer",
    "is_held_out",
    "load_reward",
    "load_task",
    "score_of",
]
