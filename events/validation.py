"""Validation facts: greedy generation on held-out prompts at a given weight version."""

from __future__ import annotations

from shunter.events.base import Event


class ValidateBegin(Event, frozen=True, kw_only=True, tag="validate.begin"):
    version: int
    prompts: int
    replica_ids: list[str] = []


class ValidateEnd(Event, frozen=True, kw_only=True, tag="validate.end"):
    version: int
    duration_s: float
    metrics: dict[str, float] = {}
