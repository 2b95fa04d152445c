"""Commands: intents issued by a policy or a user, carried out by the executor.

Invariant: a command names *what* should happen; its outcome is reported by events
(``SwitchToRollout`` -> ``ModeChanged``, ``PublishWeights`` -> ``WeightsReady``,
``LoadWeights`` -> ``WeightsLoaded``, ``TrainStep`` -> ``StepBegin``/``StepEnd``,
``Validate`` -> ``ValidateBegin``/``ValidateEnd``). A command that fails yields
``CommandFailed``.

Fields left at their defaults by a policy (``TrainStep.samples``, ``LoadWeights.handle``,
``Validate.prompts``) are filled in by the coordinator before the command reaches an
actor; policies decide, the coordinator supplies data.
"""

from __future__ import annotations

from shunter.events.base import Command
from shunter.events.data import PromptSpec, Sample, SamplingSpec


class SwitchToRollout(Command, frozen=True, kw_only=True, tag="replica.switch_to_rollout"):
    """Lend replicas to rollout: wake them, bring their weights current, add them to the dispatcher."""

    replica_ids: list[str]
    version: int = -1
    """Filled by the coordinator: the weights the replica must serve once switched."""
    handle: str = ""


class SwitchToTrainer(Command, frozen=True, kw_only=True, tag="replica.switch_to_trainer"):
    """Give replicas back to the trainer: remove from the dispatcher, cut their in-flight
    samples (they resume elsewhere), put vLLM to sleep at ``sleep_level``."""

    replica_ids: list[str]
    sleep_level: int = 1


class Offload(Command, frozen=True, kw_only=True, tag="trainer.offload"):
    parts: list[str]
    """Any of ``optimizer``, ``params``, ``grads``."""


class Onload(Command, frozen=True, kw_only=True, tag="trainer.onload"):
    parts: list[str]


class TrainStep(Command, frozen=True, kw_only=True, tag="trainer.train_step"):
    """One optimizer step on the next ready mini-batch (``batch_id`` < 0: the oldest)."""

    batch_id: int = -1
    samples: list[Sample] = []
    loss_fn: str = ""
    """Optional ``"module:function"`` overriding the built-in loss for this step."""


class PublishWeights(Command, frozen=True, kw_only=True, tag="trainer.publish_weights"):
    pass


class SaveCheckpoint(Command, frozen=True, kw_only=True, tag="trainer.save_checkpoint"):
    """Write the trainer's state (HF model dir + optimizer, step, version, RNG) under ``path``
    (a staging folder the coordinator commits atomically once every part is written).
    Issued by the coordinator right after a publish every ``run.checkpoint_every`` steps."""

    step: int
    path: str


class LoadWeights(Command, frozen=True, kw_only=True, tag="rollout.load_weights"):
    version: int
    replica_ids: list[str]
    handle: str = ""


class JoinWeightGroup(Command, frozen=True, kw_only=True, tag="weight_group.join"):
    """Join the collective group that carries weights from the trainer to one replica on
    another device (``trainer.weight_transport`` = ``nccl`` / ``gloo``). Sent by the executor,
    never by a policy: first to the trainer (``host`` empty: it opens the group as rank 0 and
    answers ``WeightGroupOpened`` with the address), then to the replica (rank 1), which
    answers ``WeightGroupJoined``."""

    replica_ids: list[str]
    backend: str
    host: str = ""
    port: int = 0
    timeout_s: float = 120.0
    """Deadline of the join and of every later receive over the group."""


class SendWeights(Command, frozen=True, kw_only=True, tag="trainer.send_weights"):
    """Broadcast the flat copy of ``version`` over the replica's weight group — the sending
    half of a ``LoadWeights`` to that replica, issued by the executor beside it."""

    replica_ids: list[str]
    version: int
    handle: str = ""


class LeaveWeightGroup(Command, frozen=True, kw_only=True, tag="weight_group.leave"):
    """The trainer drops (aborts) the groups of replicas that are gone."""

    replica_ids: list[str]


class Rebalance(Command, frozen=True, kw_only=True, tag="rollout.rebalance"):
    """Even out in-flight samples over the replicas in rollout mode: busy replicas cut some
    prompt groups (most recently started first) and hand back their partial samples, which
    resume on the least loaded replicas. A policy issues it bare; the coordinator sends each
    replica that must shed its own ``Rebalance(replica_ids=[id], count=k)``."""

    replica_ids: list[str] = []
    count: int = 0


class Generate(Command, frozen=True, kw_only=True, tag="rollout.generate"):
    """Generate ``n`` samples for one prompt group, or resume the given partial samples."""

    group_id: int
    prompt: PromptSpec
    n: int
    sampling: SamplingSpec
    resume: list[Sample] = []


class Validate(Command, frozen=True, kw_only=True, tag="validate.run"):
    replica_ids: list[str] = []
    """Where to run; empty: any replica currently in rollout mode."""
    prompts: list[PromptSpec] = []


class Stop(Command, frozen=True, kw_only=True, tag="run.stop"):
    reason: str = "stopped"
