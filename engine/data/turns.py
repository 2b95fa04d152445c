"""A multi-turn sample's bookkeeping: pure functions over ``Sample``.

Invariants (those of ``shunter.events.data``, kept by every function here):

- with an environment in play, ``len(loss_mask) == len(token_ids)``: 1 for a generated token,
  0 for an observation token;
- an observation token has log-prob 0.0 and the version of the generated token before it, so
  the sample's oldest version is its oldest *generated* token's;
- the turns' ``generated + observed`` add up to the tokens before the current turn: the current
  turn's action is the text after the last observation (so it survives a cut and a move).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import get_args

import msgspec

from shunter.events import Sample, Turn
from shunter.events.vocab import EnvFailure

FAILURES: tuple[str, ...] = get_args(EnvFailure)
"""The failures an environment call can have; a trajectory that met one carries it in its
``metrics`` (``mark_failure``), counted per step as ``env/<failure>``."""


def add_generated(
    s: Sample, ids: list[int], logprobs: list[float], versions: list[int], finish: str, *, masked: bool
) -> Sample:
    """``s`` with one generation's tokens appended (``masked``: keep a loss mask, all 1 here)."""
    mask = (s.loss_mask or [1] * len(s.token_ids)) + [1] * len(ids) if masked else s.loss_mask
    return msgspec.structs.replace(
        s,
        token_ids=s.token_ids + ids,
        logprobs=s.logprobs + logprobs,
        versions=s.versions + versions,
        loss_mask=mask,
        finish_reason=finish,
    )


def turn_start(s: Sample) -> int:
    """Where the current turn's generated tokens begin."""
    return sum(t.generated + t.observed for t in s.turns)


def action(s: Sample, decode: Callable[[list[int]], str]) -> str:
    """The current turn's text (what the environment's ``step`` is given)."""
    return decode(s.token_ids[turn_start(s) :])


def ends_with_call(s: Sample, decode: Callable[[list[int]], str], stop: tuple[str, ...]) -> bool:
    """Whether the current turn ended on one of the environment's ``stop`` strings."""
    text = action(s, decode)
    return bool(stop) and any(text.endswith(x) for x in stop)


def add_observation(
    s: Sample, ids: list[int], *, env_s: float, reward: float, metrics: dict[str, float], version: int
) -> Sample:
    """``s`` with an environment's answer appended (as much as the budget has room for) and the
    step recorded as a ``Turn``; ``metrics`` merge by the largest value per name."""
    ids = ids[: s.remaining_tokens] if s.max_tokens else ids
    v = s.versions[-1] if s.versions else version
    merged = dict(s.metrics)
    for k, x in metrics.items():
        merged[k] = max(float(x), merged.get(k, float("-inf")))
    turn = Turn(generated=len(s.token_ids) - turn_start(s), observed=len(ids), env_s=env_s, version=v, reward=reward)
    return msgspec.structs.replace(
        s,
        token_ids=s.token_ids + ids,
        logprobs=s.logprobs + [0.0] * len(ids),
        versions=s.versions + [v] * len(ids),
        loss_mask=(s.loss_mask or [1] * len(s.token_ids)) + [0] * len(ids),
        turns=[*s.turns, turn],
        metrics=merged,
    )


def mark_failure(s: Sample, failure: EnvFailure) -> Sample:
    """``s`` with a failed environment call recorded: ``metrics[failure] = 1`` (once per kind,
    whichever replica's environment failed; a name ``StepResult.metrics`` may not use)."""
    return msgspec.structs.replace(s, metrics={**s.metrics, failure: 1.0})


def env_reward(s: Sample) -> float:
    """The environment's rewards over the sample's steps."""
    return sum(t.reward for t in s.turns)


def batch_metrics(samples: list[Sample]) -> dict[str, float]:
    """A batch's multi-turn figures (every step of a run with an environment, none without): ``batch/turns_mean``
    (environment steps per sample), ``batch/observation_tokens``, ``env/raised``, ``env/returned``,
    ``env/timeout`` (the batch's trajectories that met such a failed environment call: the run
    summary's names, counted per step) and per environment metric ``env/<name>``, its mean over
    the batch's samples (a sample that reported none counts 0)."""
    if not samples or not any(s.loss_mask or s.turns or s.metrics for s in samples):
        return {}  # single-turn samples (with an environment in play every sample has a loss mask)
    out = {
        "batch/turns_mean": sum(len(s.turns) for s in samples) / len(samples),
        "batch/observation_tokens": float(sum(len(s.token_ids) - s.trained_tokens for s in samples)),
    }
    for failure in FAILURES:
        out[f"env/{failure}"] = float(sum(failure in s.metrics for s in samples))
    for name in sorted({k for s in samples for k in s.metrics} - set(FAILURES)):
        out[f"env/{name}"] = sum(s.metrics.get(name, 0.0) for s in samples) / len(samples)
    return out
