"""Facts from the trainer and the replicas' weights and modes: steps, publishes, loads,
switches, offload.

Invariant: ``StepEnd.step`` counts optimizer steps from 1; ``WeightsReady.version``
counts publishes from 1 (version 0 is the model the run started from), so the staleness
of a sample is ``trainer version - sample.min_version``.
"""

from __future__ import annotations

from shunter.events.base import Event
from shunter.events.vocab import ServingMode, StatePart, WaitOutcome


class StepBegin(Event, frozen=True, kw_only=True, tag="trainer.step_begin"):
    """An optimizer step starts on a batch.

    ``trainer -> coordinator, policy``, first in the answer to a ``Train`` order."""

    step: int
    batch_id: int
    samples: int
    version: int
    group_ids: list[int] = []
    """The prompt groups in the batch (the event log's record of what each step trained)."""


class StepEnd(Event, frozen=True, kw_only=True, tag="trainer.step_end"):
    """An optimizer step is done; ``metrics`` holds ``trainer/*`` and ``batch/*`` figures.

    ``trainer -> coordinator, policy, metrics``, after its ``StepBegin``."""

    step: int
    batch_id: int
    duration_s: float
    metrics: dict[str, float] = {}


class WeightsReady(Event, frozen=True, kw_only=True, tag="trainer.weights_ready"):
    """New weights are published. ``handle`` names them in the transport (a Ray object
    store entry held by the executor's handle table, CUDA IPC handles, a weight group +
    version); the tensors themselves never ride in an event.

    ``trainer -> coordinator, policy`` in answer to ``Publish``; a policy typically answers
    it with ``LoadWeights``."""

    version: int
    handle: str
    transport: str
    nbytes: int
    duration_s: float
    detail: dict[str, float] = {}
    """Seconds by part of the publish (``items_s``, ``copy_s``, ``sync_s``, ``pack_s``,
    ``thread_s``, ``deliver_s`` — the object store and the relays' calls); empty where the
    trainer reports none (a simulated one)."""


class WeightsSent(Event, frozen=True, kw_only=True, tag="trainer.weights_sent"):
    """The trainer broadcast ``version`` to a replica over its weight group.

    ``trainer -> coordinator`` in answer to ``SendWeights``."""

    replica_id: str
    version: int
    nbytes: int
    buckets: int
    duration_s: float


class WeightGroupOpened(Event, frozen=True, kw_only=True, tag="weight_group.opened"):
    """The trainer opened (as rank 0) the weight group of ``replica_id`` at ``host:port``.

    ``trainer -> executor, coordinator`` in answer to ``JoinWeightGroup``."""

    replica_id: str
    backend: str
    host: str
    port: int


class WeightGroupJoined(Event, frozen=True, kw_only=True, tag="weight_group.joined"):
    """A replica joined its weight group: it can receive weights over it.

    ``replica -> executor, coordinator`` in answer to ``JoinWeightGroup``."""

    replica_id: str
    backend: str
    duration_s: float


class WeightsLoaded(Event, frozen=True, kw_only=True, tag="rollout.weights_loaded"):
    """A replica serves ``version`` now.

    ``replica -> coordinator, policy`` in answer to ``InstallWeights``."""

    replica_id: str
    version: int
    duration_s: float
    interrupted: int = 0
    """In-flight samples cut by this load (they resume on the new weights)."""
    detail: dict[str, float] = {}
    """Where the time went: ``abort_s`` (cutting the requests in flight), ``load_s`` (the
    backend's load), and what the backend reports (``open_s``, ``decode_s`` ...);
    ``arrived_at``: the wall clock (epoch seconds) when the order reached the replica, so the
    hops before it are this minus the sender's stamp."""


class ModeChanged(Event, frozen=True, kw_only=True, tag="replica.mode_changed"):
    """A replica finished switching into ``mode``.

    ``replica -> coordinator, policy`` in answer to ``EnterRollout`` / ``EnterTrainer``."""

    replica_id: str
    mode: ServingMode
    previous: ServingMode
    duration_s: float
    detail: dict[str, float] = {}
    """Where the time went (``sleep_s``, ``wake_s``, ``load_s``), memory moved, and for
    ``rollout`` the weight ``version`` it serves."""


class Offloaded(Event, frozen=True, kw_only=True, tag="trainer.offloaded"):
    """Parts of the trainer's state are in host memory now.

    ``trainer -> coordinator, policy`` in answer to ``OffloadState``."""

    parts: list[StatePart]
    nbytes: int
    duration_s: float


class Onloaded(Event, frozen=True, kw_only=True, tag="trainer.onloaded"):
    """Parts of the trainer's state are back on its device.

    ``trainer -> coordinator, policy`` in answer to ``OnloadState``."""

    parts: list[StatePart]
    nbytes: int
    duration_s: float


class TrainerStateSaved(Event, frozen=True, kw_only=True, tag="trainer.state_saved"):
    """The trainer's part of a checkpoint is on disk (not yet committed: see ``CheckpointSaved``).

    ``trainer -> coordinator`` in answer to ``SaveCheckpoint``; the coordinator commits."""

    step: int
    version: int
    path: str
    nbytes: int
    duration_s: float


class TrainerPending(Event, frozen=True, kw_only=True, tag="trainer.pending"):
    """The run lost its trainer (``reason``) and restarts from its checkpoint at
    ``checkpoint_step``, but the Ray cluster has no room for a trainer now — its node lost, say:
    ``missing`` is what the trainer asks for that no node has free, ``free`` what the cluster has of
    it. The restart waits up to ``deadline_s`` (``run.restart_wait_s``) for a node to come back or be
    added (``trainer.waited``), then the run ends with an error naming the step and ``--resume``.

    ``Engine -> Engine.events()``, once, when the wait begins (no coordinator runs meanwhile: the
    new attempt's coordinator records it with ``trainer.waited`` when it starts)."""

    reason: str
    checkpoint_step: int
    missing: dict[str, float]
    free: dict[str, float]
    deadline_s: float


class TrainerWaited(Event, frozen=True, kw_only=True, tag="trainer.waited"):
    """The wait a ``TrainerPending`` announced is over: room was found (``placed``: the restart goes
    on, ``RunResumed`` follows) or ``run.restart_wait_s`` passed first (``gave_up``: the run ends).

    ``Engine -> Engine.events()``, once after each ``TrainerPending``; recorded by the new
    attempt's coordinator when it is ``placed``."""

    outcome: WaitOutcome
    waited_s: float
