"""Orders: what the coordinator (or its executor) gives one component to carry out.

Invariant: an order is complete — it carries every datum the component needs (weights by
handle, the samples to train, the prompts to score) — and addresses exactly one component
(the executor's target), so nothing half-filled ever reaches an actor. Policies never build
orders: the coordinator refuses one returned by ``decide()``. A component answers every order
with events (failures as ``CommandFailed``).
"""

from __future__ import annotations

import msgspec

from shunter.events.base import Order
from shunter.events.data import PromptSpec, Sample, SamplingSpec
from shunter.events.vocab import StatePart


class Generate(Order, frozen=True, kw_only=True, tag="rollout.generate"):
    """Generate ``n`` samples for one prompt group, or resume the given partial samples.

    ``coordinator -> replica`` whenever the dispatcher has room and the staleness gate is open;
    answered by ``SampleBegin`` / ``SampleResumed``, then ``SampleEnd`` or ``SampleAborted`` per sample."""

    group_id: int
    prompt: PromptSpec
    n: int
    sampling: SamplingSpec
    resume: list[Sample] = []


class EnterRollout(Order, frozen=True, kw_only=True, tag="replica.enter_rollout"):
    """Wake up and serve ``version`` (the weights behind ``handle``; empty: already loaded).

    ``coordinator -> replica`` for a ``SwitchToRollout`` or a replica that joined late;
    answered by ``ModeChanged(mode="rollout")``."""

    version: int
    handle: str = ""


class EnterTrainer(Order, frozen=True, kw_only=True, tag="replica.enter_trainer"):
    """Cut every generation (partials go back), then sleep at ``sleep_level``.

    ``coordinator -> replica`` for a ``SwitchToTrainer``; answered by the cut samples'
    ``SampleAborted(reason="reclaimed")`` and ``ModeChanged(mode="trainer")``."""

    sleep_level: int = 1


class InstallWeights(Order, frozen=True, kw_only=True, tag="rollout.install_weights"):
    """Load the weights of ``version`` behind ``handle`` (generations in flight are cut and
    resume on them).

    ``coordinator -> replica`` for a ``LoadWeights``; answered by ``WeightsLoaded``."""

    version: int
    handle: str


class ShedGroups(Order, frozen=True, kw_only=True, tag="rollout.shed"):
    """Cut whole prompt groups, most recently started first, until ``count`` samples are cut.

    ``coordinator -> replica`` for a ``Rebalance``; the cut samples come back as
    ``SampleAborted(reason="rebalanced")`` with their partials."""

    count: int


class CutSamples(Order, frozen=True, kw_only=True, tag="rollout.cut_samples"):
    """Cut the named samples where they run (unknown or finished ones are skipped).

    ``coordinator -> replica`` when it moves samples to the straggler lane (``Consolidate``);
    the cut samples come back as ``SampleAborted(reason="rebalanced")`` with their partials."""

    sample_ids: list[str]


class RunValidation(Order, frozen=True, kw_only=True, tag="validate.generate"):
    """Generate greedily for ``prompts`` on the weights served now and score them.

    ``coordinator -> replica`` for a ``Validate``; answered by ``ValidateBegin`` + ``ValidateEnd``."""

    prompts: list[PromptSpec]


class Train(Order, frozen=True, kw_only=True, tag="trainer.train"):
    """One optimizer step on ``samples`` (with the user's ``loss_fn`` if given).

    ``coordinator -> trainer`` for a ``TrainStep`` / ``TrainBatch``; answered by ``StepBegin`` +
    ``StepEnd``, or ``CommandFailed`` (with ``user_code`` when the user's loss failed)."""

    batch_id: int
    samples: list[Sample]
    loss_fn: str = ""


class Publish(Order, frozen=True, kw_only=True, tag="trainer.publish"):
    """Publish the trainer's weights as the next version.

    ``coordinator -> trainer`` for a ``PublishWeights`` (or the end of a run); answered by
    ``WeightsReady``. ``deliver``: the trainer then hands the new version to each relay named
    there, once, for its replicas (the relay gives each an ``InstallWeights``; each replica
    answers ``WeightsLoaded`` to the coordinator through its relay); a ``Delivery`` to
    ``DIRECT`` names replicas the trainer gives the ``InstallWeights`` itself (those the
    coordinator's process serves: their answers come back to it beside ``WeightsReady``)."""

    deliver: list[Delivery] = []


DIRECT = "direct"
"""``Delivery.relay`` for replicas the trainer orders to load itself, one call each (no relay
between: the fewest hops from a publish to a load)."""


class Delivery(msgspec.Struct, frozen=True, kw_only=True):
    """Replicas behind one relay (or ``DIRECT``) that load a version straight from the trainer
    (``Publish``)."""

    relay: str
    replica_ids: list[str]


class OffloadState(Order, frozen=True, kw_only=True, tag="trainer.offload_state"):
    """Move ``parts`` of the trainer's state to host memory.

    ``coordinator -> trainer`` for an ``Offload``; answered by ``Offloaded``."""

    parts: list[StatePart]


class OnloadState(Order, frozen=True, kw_only=True, tag="trainer.onload_state"):
    """Bring ``parts`` of the trainer's state back to its device.

    ``coordinator -> trainer`` for an ``Onload``; answered by ``Onloaded``."""

    parts: list[StatePart]


class SaveCheckpoint(Order, frozen=True, kw_only=True, tag="trainer.save_checkpoint"):
    """Write the trainer's state (HF model dir + optimizer, step, version, RNG) under ``path``,
    a staging folder the coordinator commits atomically once every part is written.

    ``coordinator -> trainer`` right after a publish every ``run.checkpoint_every`` steps, and
    at the end; answered by ``TrainerStateSaved``."""

    step: int
    path: str


class JoinWeightGroup(Order, frozen=True, kw_only=True, tag="weight_group.join"):
    """Join the collective group that carries weights from the trainer to one replica on
    another device (``trainer.weight_transport`` = ``nccl`` / ``gloo``).

    ``executor -> trainer`` first (``host`` empty: it opens the group as rank 0 and answers
    ``WeightGroupOpened`` with the address), then ``executor -> replica`` (rank 1), which
    answers ``WeightGroupJoined``; before a replica's first weight load over the group."""

    replica_ids: list[str]
    backend: str
    host: str = ""
    port: int = 0
    timeout_s: float = 120.0
    """Deadline of the join and of every later receive over the group."""


class SendWeights(Order, frozen=True, kw_only=True, tag="trainer.send_weights"):
    """Broadcast the flat copy of ``version`` over the replica's weight group.

    ``executor -> trainer``, the sending half of every weight load to a grouped replica, sent
    beside it; answered by ``WeightsSent``."""

    replica_ids: list[str]
    version: int
    handle: str = ""


class LeaveWeightGroup(Order, frozen=True, kw_only=True, tag="weight_group.leave"):
    """Drop (abort) the weight groups of replicas that are gone.

    ``executor -> trainer`` when a grouped replica is reported down; no answer."""

    replica_ids: list[str]
