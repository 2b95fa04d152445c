"""Validation facts: greedy generation on held-out prompts at a given weight version."""

from __future__ import annotations

from shunter.events.base import Event


class ValidateBegin(Event, frozen=True, kw_only=True, tag="validate.begin"):
    """A replica starts scoring ``prompts`` held-out prompts on weights ``version``.

    ``replica -> coordinator, policy`` in answer to ``RunValidation``."""

    version: int
    prompts: int
    replica_ids: list[str] = []


class ValidateEnd(Event, frozen=True, kw_only=True, tag="validate.end"):
    """Held-out scores of weights ``version``: ``metrics`` holds ``reward_mean`` and ``exact``.

    ``replica -> coordinator, policy, metrics`` after its ``ValidateBegin``."""

    version: int
    duration_s: float
    metrics: dict[str, float] = {}
    errors: list[str] = []
    """One line per piece of the user's code that failed on held-out prompts (the reward, the
    environment): what, on how many (``metrics`` counts them: ``reward_errors``,
    ``env_errors``; those prompts are scored 0 or as they stood), and the first cause. The
    validation itself succeeded: a failed validation command is a ``CommandFailed``."""
