"""The sample buffer's records (``engine/coordinator/buffer.py``): :class:`Group` (one prompt group from
dispatch to trained or dropped, with its staleness level), its checkpoint form
(:class:`GroupState`, :class:`BufferState`) and :class:`AccountingError`.

Invariant: a group's samples are added only through :meth:`Group.put`, which keeps its oldest
token version (``oldest``), so :attr:`Group.min_version` — the version its staleness is measured
from — costs nothing however often it is asked; :meth:`Group.rule_level` recomputes the level
the buffer keeps incrementally, for its books' check.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from shunter.events import PromptSpec, Sample


@dataclass
class Group:
    group_id: int
    prompt: PromptSpec
    n: int
    dispatch_version: int
    samples: dict[str, Sample] = field(default_factory=dict)
    level: int = -1
    """The oldest weight version its tokens may come from: while it generates, its dispatch
    version at most (a sample may still start there); once complete, its :attr:`min_version`
    — the version its staleness is measured from, which may be newer than the dispatch version
    when a replica loaded new weights before generating it."""

    oldest: int | None = None
    """The oldest weight version of any token of its samples so far (None: no token yet); kept
    by :meth:`put`, so :attr:`min_version` costs nothing however often it is asked."""

    def __post_init__(self) -> None:
        self.oldest = min((s.min_version for s in self.samples.values() if s.versions), default=None)
        self.level = self.rule_level()

    def rule_level(self) -> int:
        """:attr:`level` computed afresh from the samples (the buffer keeps it incrementally)."""
        if self.complete:
            return self.min_version
        return min([self.dispatch_version, *(s.min_version for s in self.samples.values() if s.versions)])

    def put(self, sample: Sample) -> None:
        """A finished sample joins the group (the only way samples are added)."""
        self.samples[sample.sample_id] = sample
        if sample.versions:
            v = sample.min_version
            if self.oldest is None or v < self.oldest:
                self.oldest = v

    @property
    def complete(self) -> bool:
        return len(self.samples) >= self.n

    @property
    def min_version(self) -> int:
        """The oldest weight version any of its tokens came from (a sample without tokens has none)."""
        return self.dispatch_version if self.oldest is None else self.oldest


class GroupState(msgspec.Struct, frozen=True, kw_only=True):
    group_id: int
    prompt: PromptSpec
    n: int
    dispatch_version: int
    samples: list[Sample] = []


class BufferState(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the buffer holds, as plain data (part of a checkpoint)."""

    next_group: int
    next_batch: int
    trained: int
    dropped: dict[str, int]
    groups: list[GroupState]
    """In flight or ready, in dispatch order."""
    ready: list[int]
    """Complete groups in completion order."""
    taken_version: int = 0
    taken_at_version: int = 0
    """Mini-batches taken on trainer version ``taken_version`` (the wait-mode plan's pace)."""


class AccountingError(RuntimeError):
    """The buffer's books do not balance (a bug: a group was lost or counted twice)."""
