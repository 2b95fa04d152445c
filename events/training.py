"""Facts from the trainer: steps, weights, offload.

Invariant: ``StepEnd.step`` counts optimizer steps from 1; ``WeightsReady.version``
counts publishes from 1 (version 0 is the model the run started from), so the staleness
of a sample is ``trainer version - sample.min_version``.
"""

from __future__ import annotations

from shunter.events.base import Event


class StepBegin(Event, frozen=True, kw_only=True, tag="trainer.step_begin"):
    step: int
    batch_id: int
    samples: int
    version: int
    group_ids: list[int] = []
    """The prompt groups in the batch (the event log's record of what each step trained)."""


class StepEnd(Event, frozen=True, kw_only=True, tag="trainer.step_end"):
    step: int
    batch_id: int
    duration_s: float
    metrics: dict[str, float] = {}


class WeightsReady(Event, frozen=True, kw_only=True, tag="trainer.weights_ready"):
    """New weights are published. ``handle`` names them in the transport (a Ray object
    store entry held by the coordinator's handle table, a path, an NCCL group + version);
    the tensors themselves never ride in an event."""

    version: int
    handle: str
    transport: str
    nbytes: int
    duration_s: float


class WeightsSent(Event, frozen=True, kw_only=True, tag="trainer.weights_sent"):
    """The trainer broadcast ``version`` to a replica over its weight group."""

    replica_id: str
    version: int
    nbytes: int
    buckets: int
    duration_s: float


class WeightGroupOpened(Event, frozen=True, kw_only=True, tag="weight_group.opened"):
    """The trainer opened (as rank 0) the weight group of ``replica_id`` at ``host:port``."""

    replica_id: str
    backend: str
    host: str
    port: int


class WeightGroupJoined(Event, frozen=True, kw_only=True, tag="weight_group.joined"):
    """A replica joined its weight group: it can receive weights over it."""

    replica_id: str
    backend: str
    duration_s: float


class WeightsLoaded(Event, frozen=True, kw_only=True, tag="rollout.weights_loaded"):
    replica_id: str
    version: int
    duration_s: float
    interrupted: int = 0
    """In-flight samples cut by this load (they resume on the new weights)."""
    detail: dict[str, float] = {}
    """Where the time went: ``abort_s`` (cutting the requests in flight), ``load_s`` (the
    backend's load), and what the backend reports (``open_s``, ``decode_s`` ...)."""


class ModeChanged(Event, frozen=True, kw_only=True, tag="replica.mode_changed"):
    replica_id: str
    mode: str
    """``rollout`` | ``trainer``."""
    previous: str
    duration_s: float
    detail: dict[str, float] = {}
    """Where the time went (``sleep_s``, ``wake_s``, ``load_s``) and memory moved."""


class Offloaded(Event, frozen=True, kw_only=True, tag="trainer.offloaded"):
    parts: list[str]
    nbytes: int
    duration_s: float


class Onloaded(Event, frozen=True, kw_only=True, tag="trainer.onloaded"):
    parts: list[str]
    nbytes: int
    duration_s: float


class TrainerStateSaved(Event, frozen=True, kw_only=True, tag="trainer.state_saved"):
    """The trainer's part of a checkpoint is on disk (not yet committed: see ``CheckpointSaved``)."""

    step: int
    version: int
    path: str
    nbytes: int
    duration_s: float
