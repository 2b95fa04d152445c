"""Facts about rollout samples and prompt groups.

Invariant: every prompt group the coordinator dispatches ends in exactly one of trained
(via a batch, ``StepBegin.group_ids``), ``GroupDropped`` (with a reason), or is still in
flight; samples of a group report ``SampleBegin`` once per start, ``SampleResumed`` once per
restart from a prefix, and ``SampleEnd`` once.
"""

from __future__ import annotations

from shunter.events.base import Event
from shunter.events.data import Sample
from shunter.events.vocab import AbortReason, DropReason, EnvCall, EnvFailure, RewardFailure, WorkerLoss


class SampleBegin(Event, frozen=True, kw_only=True, tag="rollout.sample_begin"):
    """A sample started generating from scratch on ``replica_id``, on weights ``version``.

    ``replica -> coordinator, policy`` (in the answer to its ``Generate``)."""

    sample_id: str
    group_id: int
    replica_id: str
    version: int
    prefix_len: int = 0
    """Tokens already generated before this start (0: a fresh sample)."""


class SampleEnd(Event, frozen=True, kw_only=True, tag="rollout.sample_end"):
    """A sample is complete and scored (``sample.reward``).

    ``replica -> coordinator, policy``; the buffer takes it, and a group whose samples are all
    in becomes ready (maybe a ``BatchReady``)."""

    replica_id: str
    sample: Sample


class RewardFailed(Event, frozen=True, kw_only=True, tag="rollout.reward_failed"):
    """The reward function failed on a finished sample, which is scored 0.0 and trained on.

    ``replica -> coordinator, policy``, just before the sample's ``SampleEnd``: the coordinator
    counts it (``reward/raised``, ``reward/returned``, ``reward/timeout`` in the run summary) and
    ends the run when the reward failed on a mini-batch's worth of samples before scoring any;
    the run log has a line for the 1st, 10th, 100th … of each ``failure``."""

    replica_id: str
    sample_id: str
    group_id: int
    failure: RewardFailure
    error: str
    user_code: str
    """The reward function's ``"module:name"`` (or the task's)."""


class RewardWorkerLost(Event, frozen=True, kw_only=True, tag="rollout.reward_worker_lost"):
    """A reward worker (``task.reward_workers``) died or stopped answering under a replica's
    calls. Ray starts it again; each call it held is tried again alone, and only a call that
    loses it again scores 0.0 (its ``RewardFailed``), so a loss whose calls were all scored
    on retry leaves this event as its only trace.

    ``replica -> coordinator``, with the next sample the replica finishes after the loss (one
    event a loss a replica saw): the coordinator counts it (``reward/worker_died``,
    ``reward/worker_hung`` in the run summary); the run log has a warning for the 1st, 10th,
    100th … of each ``loss``."""

    replica_id: str
    worker: int
    """The worker's index in the run's pool (0 to ``task.reward_workers - 1``)."""
    loss: WorkerLoss
    error: str
    user_code: str
    """The reward function's ``"module:name"`` (or the task's)."""


class EnvFailed(Event, frozen=True, kw_only=True, tag="rollout.env_failed"):
    """An environment call failed: a step or reset (the trajectory ends where it is and is
    scored as it stands; its reward function sees the response so far) or a close (reported
    only: the sample is scored, or moved, as it would have been).

    ``replica -> coordinator, policy``, just before the sample's ``SampleEnd`` (or
    ``SampleAborted``, for a close when the trajectory is cut to move): the coordinator
    counts it (``env/raised``, ``env/returned``, ``env/timeout`` in the run summary) and ends the
    run when the environment failed (its constructor, ``reset`` or ``step``: a failed ``close``
    is only counted) on a mini-batch's worth of samples before one step succeeded; the run log
    has a line for the 1st, 10th, 100th … of each ``failure``."""

    replica_id: str
    sample_id: str
    group_id: int
    failure: EnvFailure
    call: EnvCall = ""
    """Which call failed."""
    turn: int
    """How many steps had succeeded before this one."""
    error: str
    user_code: str
    """The environment's ``"module:Class"`` (or built-in name)."""


class SampleAborted(Event, frozen=True, kw_only=True, tag="rollout.sample_aborted"):
    """A generation was cut. ``partial`` is set when the sample leaves its replica (it
    resumes elsewhere from that prefix); empty when the replica resumes it itself
    (``weights_update``) or when its group is dropped (``failed``).

    ``replica -> coordinator, policy``; ``coordinator -> policy`` for ``replica_down`` (the
    coordinator recovers a dead replica's samples from what it holds)."""

    sample_id: str
    group_id: int
    replica_id: str
    reason: AbortReason
    tokens: int = 0
    partial: Sample | None = None


class SampleResumed(Event, frozen=True, kw_only=True, tag="rollout.sample_resumed"):
    """A cut sample continues from its prefix with the budget it has left, on ``version``.

    ``replica -> coordinator, policy``."""

    sample_id: str
    group_id: int
    replica_id: str
    prefix_len: int
    remaining_tokens: int
    version: int
    turn: int = 0
    """The turn it resumes in (0: the first; a multi-turn sample's environment steps so far)."""


class GroupDropped(Event, frozen=True, kw_only=True, tag="buffer.group_dropped"):
    """A prompt group left the buffer without being trained.

    ``coordinator -> policy, sinks``: when the staleness rule drops it, when a generation or
    reward failed, or for groups still in flight when the run ends."""

    group_id: int
    reason: DropReason
    samples: int = 0


class BatchReady(Event, frozen=True, kw_only=True, tag="buffer.batch_ready"):
    """The buffer holds one more full mini-batch (``ppo_mini_batch_size`` samples, whole groups).

    ``coordinator -> policy, sinks``, once per mini-batch that becomes formable."""

    batch_id: int
    samples: int
    groups: int
    min_version: int
    max_staleness: int
