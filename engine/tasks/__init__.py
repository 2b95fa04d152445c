"""Verifiable tasks and reward loading.

Invariant: everything here is importable without torch, Ray or vLLM; tasks and rewards
are resolved only from names the user gives (built-in short names or "module:attr").
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
