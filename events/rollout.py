"""Facts about rollout samples and prompt groups.

Invariant: every prompt group the coordinator dispatches ends in exactly one of
``GroupTrained`` (via a batch), ``GroupDropped`` (with a reason), or is still in flight;
samples of a group report ``SampleBegin`` once per (re)start and ``SampleEnd`` once.
"""

from __future__ import annotations

from shunter.events.base import Event
from shunter.events.data import Sample


class SampleBegin(Event, frozen=True, kw_only=True, tag="rollout.sample_begin"):
    sample_id: str
    group_id: int
    replica_id: str
    version: int
    prefix_len: int = 0
    """Tokens already generated before this (re)start: 0 for a fresh sample."""


class SampleEnd(Event, frozen=True, kw_only=True, tag="rollout.sample_end"):
    replica_id: str
    sample: Sample


class SampleAborted(Event, frozen=True, kw_only=True, tag="rollout.sample_aborted"):
    """A generation was cut. ``partial`` is set when the sample leaves its replica (it must
    be resumed elsewhere); it is empty when the replica resumes it itself (weight update)."""

    sample_id: str
    group_id: int
    replica_id: str
    reason: str
    """``weights_update`` | ``reclaimed`` | ``replica_down`` | ``shutdown``."""
    tokens: int = 0
    partial: Sample | None = None


class SampleResumed(Event, frozen=True, kw_only=True, tag="rollout.sample_resumed"):
    sample_id: str
    group_id: int
    replica_id: str
    prefix_len: int
    remaining_tokens: int
    version: int


class GroupDropped(Event, frozen=True, kw_only=True, tag="buffer.group_dropped"):
    group_id: int
    reason: str
    """``stale`` | ``failed`` | ``shutdown`` ..."""
    samples: int = 0


class BatchReady(Event, frozen=True, kw_only=True, tag="buffer.batch_ready"):
    """The buffer holds a full mini-batch (``ppo_mini_batch_size`` samples, whole groups)."""

    batch_id: int
    samples: int
    groups: int
    min_version: int
    max_staleness: int
