"""``EngineView``: the read-only snapshot a policy decides on.

Invariant: a view is immutable and complete enough to decide on — a policy needs nothing
but the event and the view (plus its own state). The coordinator builds a new view after
applying each event; the view's ``seq`` increases with every event applied, so a policy can
tell two views apart.
"""

from __future__ import annotations

import msgspec

from shunter.events.vocab import (
    DOWN,
    HYBRID,
    ROLLOUT,
    STANDALONE,
    SWITCHING,
    TRAINER,
    Mode,
    ReplicaKind,
    TrainerActivity,
    TrainerDriver,
)

__all__ = [
    "DOWN",
    "HYBRID",
    "ROLLOUT",
    "STANDALONE",
    "SWITCHING",
    "TRAINER",
    "BufferView",
    "EngineView",
    "ReplicaView",
    "TrainerView",
]


class ReplicaView(msgspec.Struct, frozen=True, kw_only=True):
    """One replica as the coordinator knows it."""

    replica_id: str
    kind: ReplicaKind
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


class TrainerView(msgspec.Struct, frozen=True, kw_only=True):
    """The trainer as the coordinator knows it."""

    state: TrainerActivity = "idle"
    """``training`` / ``publishing`` from the moment the order is sent until its answer."""
    step: int = 0
    """Optimizer steps done."""
    version: int = 0
    """Last published weight version (0: the weights the run started from)."""
    steps_since_publish: int = 0
    step_s: float = 0.0
    """Smoothed (EMA) optimizer-step time in seconds (0 until the first step)."""
    offloaded: list[str] = []
    """Parts of its state in host memory (``optimizer``, ``params``, ``grads``)."""


class BufferView(msgspec.Struct, frozen=True, kw_only=True):
    """The sample buffer: prompt groups from dispatch to trained."""

    ready_samples: int = 0
    """Samples of complete groups not yet trained."""
    ready_batches: int = 0
    """Mini-batches that could be taken now (with ``on_stale = "wait"``, only behind no older
    group still generating)."""
    in_flight_groups: int = 0
    in_flight_samples: int = 0
    dispatched_groups: int = 0
    trained_groups: int = 0
    dropped_groups: int = 0
    gate_open: bool = True
    """Whether the staleness capacity gate admits another group now (false also while the run ends)."""
    pending_resumes: int = 0
    """Partial samples waiting for a replica."""


class EngineView(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a policy decides on, besides the event and its own state."""

    run_id: str = ""
    seq: int = 0
    """Events applied so far."""
    ppo_mini_batch_size: int = 1
    parameter_sync_step: int = 1
    train_batch_size: int = 1
    n_samples_per_prompt: int = 1
    max_staleness: int = 0
    validate_every: int = 0
    """Validate every this many optimizer steps (0: never)."""
    trainer_driver: TrainerDriver = "engine"
    replicas: tuple[ReplicaView, ...] = ()
    """In rank order."""
    trainer: TrainerView = TrainerView()
    buffer: BufferView = BufferView()
    switch_cost_s: dict[str, float] = {}
    """Smoothed measured switch time per direction (``rollout``, ``trainer``); absent until measured."""
    done: bool = False
    """The run is ending (``total_steps`` reached or ``Stop``): the coordinator's finale owns
    the replicas and the trainer from here; a policy should ask for nothing more."""

    def replica(self, replica_id: str) -> ReplicaView | None:
        for r in self.replicas:
            if r.replica_id == replica_id:
                return r
        return None

    def ids(self, *, kind: str | None = None, mode: str | None = None) -> list[str]:
        """Replica ids filtered by kind and/or mode, in rank order."""
        return [
            r.replica_id for r in self.replicas if (kind is None or r.kind == kind) and (mode is None or r.mode == mode)
        ]
