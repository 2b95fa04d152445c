"""``EngineView``: the read-only snapshot a policy decides on.

Invariant: a view is immutable and complete enough to decide on — a policy needs nothing
but the event and the view (plus its own state). The coordinator builds a new view after
applying each event; the view's ``seq`` increases with every event applied, so a policy can
tell two views apart. Building a view costs O(replicas changed since the last one), not
O(replicas): ``ReplicaViews`` shares its unchanged chunks with the view before it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import overload

import msgspec

from shunter.events.vocab import (
    Mode,
    ReplicaKind,
    TrainerActivity,
    TrainerDriver,
)

__all__ = [
    "BufferView",
    "EngineView",
    "ReplicaView",
    "ReplicaViews",
    "TrainerView",
]


class ReplicaView(msgspec.Struct, frozen=True, kw_only=True):
    """One replica as the coordinator knows it."""

    replica_id: str
    """``<kind>-<rank>`` (``standalone-0``, ``hybrid-1``): the rank is the registry's, shared by
    both kinds, so with one standalone replica the first hybrid is ``hybrid-1``, and a
    replacement takes the smallest free rank. Take ids from the view (``view.ids(kind=...)``);
    never build them."""
    kind: ReplicaKind
    """``standalone``: a GPU of its own, always generating unless a policy says otherwise;
    ``hybrid``: shares the trainer's resources, starts in ``trainer`` mode (asleep) and generates
    only while lent to rollout."""
    rank: int
    """From the registry; unique among live replicas of the run, hybrid and standalone alike."""
    mode: Mode
    """``switching`` from the moment a switch is ordered until its ``ModeChanged``."""
    in_flight: int = 0
    """Samples currently generating on it."""
    version: int = 0
    """Weight version it has loaded."""
    samples_per_s: float = 0.0
    """Completions per second over the last minute of event time while in rollout (0 until measured)."""


class ReplicaViews(Sequence[ReplicaView]):
    """The replicas of one ``EngineView``, in rank order: an immutable sequence (compares equal
    to a tuple of the same views) made of chunks of ``CHUNK`` views. A new view copies only the
    chunks that changed and shares the rest; ``find`` looks a replica up by id in O(1)."""

    CHUNK = 64
    __slots__ = ("_chunks", "_len", "_pos")

    def __init__(
        self, chunks: tuple[tuple[ReplicaView, ...], ...] = (), pos: Mapping[str, int] | None = None, n: int = -1
    ) -> None:
        """``n``: the number of views, if the caller knows it (else counted)."""
        self._chunks = chunks
        self._len = n if n >= 0 else sum(map(len, chunks))
        self._pos = pos

    @classmethod
    def of(cls, views: Sequence[ReplicaView]) -> ReplicaViews:
        n = cls.CHUNK
        return cls(tuple(tuple(views[i : i + n]) for i in range(0, len(views), n)))

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, i: int) -> ReplicaView: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[ReplicaView, ...]: ...
    def __getitem__(self, i: int | slice) -> ReplicaView | tuple[ReplicaView, ...]:
        if isinstance(i, slice):
            return tuple(self)[i]
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError("replica index out of range")
        return self._chunks[i // self.CHUNK][i % self.CHUNK]

    def __iter__(self) -> Iterator[ReplicaView]:
        return itertools.chain.from_iterable(self._chunks)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ReplicaViews | tuple | list):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"ReplicaViews({tuple(self)!r})"

    def find(self, replica_id: str) -> ReplicaView | None:
        i = self._pos.get(replica_id) if self._pos is not None else None
        if i is not None and i < self._len and (v := self[i]).replica_id == replica_id:
            return v
        return next((r for r in self if r.replica_id == replica_id), None)


class TrainerView(msgspec.Struct, frozen=True, kw_only=True):
    """The trainer as the coordinator knows it."""

    state: TrainerActivity = "idle"
    """``training`` / ``publishing`` from the moment the order is sent until its answer."""
    step: int = 0
    """Optimizer steps done."""
    version: int = 0
    """Last published weight version (0: the weights the run started from)."""
    steps_since_publish: int = 0
    """Optimizer steps since the last publish: ``PublishWeights`` is due at
    ``view.parameter_sync_step``."""
    step_s: float = 0.0
    """Smoothed (EMA) optimizer-step time in seconds (0 until the first step)."""
    offloaded: list[str] = []
    """Parts of its state in host memory (``optimizer``, ``params``, ``grads``)."""


class BufferView(msgspec.Struct, frozen=True, kw_only=True):
    """The sample buffer: prompt groups from dispatch to trained."""

    ready_samples: int = 0
    """Samples of complete groups not yet trained."""
    ready_batches: int = 0
    """Mini-batches that could be taken now (with ``on_stale = "wait"``, none while a group
    whose staleness deadline has come is still generating)."""
    in_flight_groups: int = 0
    """Prompt groups dispatched and not yet complete (some of their samples still generating)."""
    in_flight_samples: int = 0
    """Samples generating on replicas now."""
    dispatched_groups: int = 0
    """Prompt groups started since the run began."""
    trained_groups: int = 0
    """Prompt groups an optimizer step has taken."""
    dropped_groups: int = 0
    """Prompt groups dropped: too stale, failed, or cut off at the run's end."""
    gate_open: bool = True
    """Whether the staleness capacity gate admits another group now (false also while the run ends)."""
    pending_resumes: int = 0
    """Partial samples waiting for a replica."""


class EngineView(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a policy decides on, besides the event and its own state."""

    run_id: str = ""
    """The run's id (``<run.name>-<random>`` unless given)."""
    seq: int = 0
    """Events applied so far."""
    ppo_mini_batch_size: int = 1
    """Samples in one optimizer step's mini-batch (``trainer.ppo_mini_batch_size``)."""
    parameter_sync_step: int = 1
    """Optimizer steps between two publishes (``trainer.parameter_sync_step``)."""
    train_batch_size: int = 1
    """Samples between two publishes: ``parameter_sync_step`` x ``ppo_mini_batch_size``."""
    n_samples_per_prompt: int = 1
    """Samples in one prompt group (``rollout.n_samples_per_prompt``)."""
    max_staleness: int = 0
    """How many weight versions behind a trained sample may be (``rollout.max_staleness``)."""
    validate_every: int = 0
    """Validate every this many optimizer steps (0: never)."""
    trainer_driver: TrainerDriver = "engine"
    """``engine``: the policy trains and publishes (``TrainStep``, ``PublishWeights``); ``user``:
    the embedding program does (``Engine.next_batch`` / ``train`` / ``publish_weights``)."""
    replicas: Sequence[ReplicaView] = ()
    """In rank order (a ``ReplicaViews`` when the coordinator built the view; any sequence of
    ``ReplicaView`` in a hand-made one)."""
    trainer: TrainerView = TrainerView()
    """The trainer (``TrainerView``)."""
    buffer: BufferView = BufferView()
    """The sample buffer (``BufferView``)."""
    switch_cost_s: dict[str, float] = {}
    """Smoothed measured switch time per direction (``rollout``, ``trainer``); absent until measured."""
    done: bool = False
    """The run is ending (``total_steps`` reached or ``Stop``): the coordinator's finale owns
    the replicas and the trainer from here; a policy should ask for nothing more."""

    def replica(self, replica_id: str) -> ReplicaView | None:
        """The replica with this id, or None (not in the run, or gone)."""
        if isinstance(self.replicas, ReplicaViews):
            return self.replicas.find(replica_id)
        return next((r for r in self.replicas if r.replica_id == replica_id), None)

    def ids(self, *, kind: str | None = None, mode: str | None = None) -> list[str]:
        """Replica ids filtered by kind and/or mode, in rank order."""
        return [
            r.replica_id for r in self.replicas if (kind is None or r.kind == kind) and (mode is None or r.mode == mode)
        ]
