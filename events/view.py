"""``EngineView``: the read-only snapshot a policy decides on.

Invariant: a view is immutable and complete enough to decide on — a policy needs nothing
but the event and the view (plus its own state). The coordinator builds a new view after
applying each event; the view's ``seq`` increases with every event applied, so it also
serves as the versioned snapshot a restarted coordinator resumes from.
"""

from __future__ import annotations

import msgspec

ROLLOUT = "rollout"
TRAINER = "trainer"
SWITCHING = "switching"
DOWN = "down"
HYBRID = "hybrid"
STANDALONE = "standalone"


class ReplicaView(msgspec.Struct, frozen=True, kw_only=True):
    replica_id: str
    kind: str
    """``hybrid`` (lives on trainer resources) | ``standalone``."""
    rank: int
    mode: str
    """``rollout`` | ``trainer`` | ``switching`` | ``down``."""
    in_flight: int = 0
    """Samples currently generating on it."""
    version: int = 0
    """Weight version it has loaded."""
    samples_per_s: float = 0.0
    """Smoothed completion rate while in rollout (0 until measured)."""


class TrainerView(msgspec.Struct, frozen=True, kw_only=True):
    state: str = "idle"
    """``idle`` | ``training`` | ``publishing``."""
    step: int = 0
    """Optimizer steps done."""
    version: int = 0
    """Last published weight version."""
    steps_since_publish: int = 0
    step_s: float = 0.0
    """Smoothed optimizer-step time."""
    offloaded: list[str] = []


class BufferView(msgspec.Struct, frozen=True, kw_only=True):
    ready_samples: int = 0
    ready_batches: int = 0
    in_flight_groups: int = 0
    in_flight_samples: int = 0
    dispatched_groups: int = 0
    trained_groups: int = 0
    dropped_groups: int = 0
    gate_open: bool = True
    """Whether the staleness capacity gate admits another group now."""
    pending_resumes: int = 0
    """Partial samples waiting for a replica."""


class EngineView(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str = ""
    seq: int = 0
    ppo_mini_batch_size: int = 1
    parameter_sync_step: int = 1
    train_batch_size: int = 1
    n_samples_per_prompt: int = 1
    max_staleness: int = 0
    validate_every: int = 0
    """Validate every this many optimizer steps (0: never)."""
    trainer_driver: str = "engine"
    replicas: tuple[ReplicaView, ...] = ()
    trainer: TrainerView = TrainerView()
    buffer: BufferView = BufferView()
    switch_cost_s: dict[str, float] = {}
    """Smoothed measured switch time per direction (``rollout``, ``trainer``)."""
    done: bool = False

    def replica(self, replica_id: str) -> ReplicaView | None:
        for r in self.replicas:
            if r.replica_id == replica_id:
                return r
        return None

    def ids(self, *, kind: str | None = None, mode: str | None = None) -> list[str]:
        """Replica ids filtered by kind and/or mode, in rank order."""
        return [
            r.replica_id
            for r in sorted(self.replicas, key=lambda r: r.rank)
            if (kind is None or r.kind == kind) and (mode is None or r.mode == mode)
        ]
