"""Intents: what a policy (or a user, through ``Engine.submit``) asks the coordinator for.

Invariant: an intent is complete as written — it names replicas, parts or a batch, never a
field the coordinator fills in later. The coordinator carries each one out by sending
orders to components (``shunter.engine.coordinator.intents``) or refuses it with ``IntentRejected``;
its outcome comes back as events: ``SwitchToRollout`` -> ``ModeChanged``,
``PublishWeights`` -> ``WeightsReady``, ``LoadWeights`` -> ``WeightsLoaded``,
``TrainStep`` / ``TrainBatch`` -> ``StepBegin`` + ``StepEnd``, ``Validate`` ->
``ValidateBegin`` + ``ValidateEnd``, ``Offload`` / ``Onload`` -> ``Offloaded`` /
``Onloaded``, ``Stop`` -> ``RunEnded``. A user who submits one gets the coordinator's
judgement of it back at once (``Verdict``).
"""

from __future__ import annotations

import msgspec

from shunter.events.base import Intent
from shunter.events.data import Sample
from shunter.events.lifecycle import IntentRejected
from shunter.events.vocab import StatePart


class SwitchToRollout(Intent, frozen=True, kw_only=True, tag="replica.switch_to_rollout"):
    """Lend replicas to rollout: wake them with the current weights and dispatch to them.

    ``policy | user -> coordinator``, whenever replicas in ``trainer`` mode should generate;
    the coordinator sends each an ``EnterRollout`` order (replicas in another mode are skipped)."""

    replica_ids: list[str]


class SwitchToTrainer(Intent, frozen=True, kw_only=True, tag="replica.switch_to_trainer"):
    """Give replicas back to the trainer: stop dispatching to them, cut their generations
    (the partials resume elsewhere), put the engine to sleep at ``sleep_level``.

    ``policy | user -> coordinator``; each replica in ``rollout`` mode gets an ``EnterTrainer`` order."""

    replica_ids: list[str]
    sleep_level: int = 1


class Offload(Intent, frozen=True, kw_only=True, tag="trainer.offload"):
    """Move parts of the trainer's state to host memory (to make room for hybrid replicas).

    ``policy | user -> coordinator -> trainer`` (``OffloadState``); answered by ``Offloaded``."""

    parts: list[StatePart]


class Onload(Intent, frozen=True, kw_only=True, tag="trainer.onload"):
    """Bring offloaded parts of the trainer's state back to its device.

    ``policy | user -> coordinator -> trainer`` (``OnloadState``); answered by ``Onloaded``."""

    parts: list[StatePart]


class TrainStep(Intent, frozen=True, kw_only=True, tag="trainer.train_step"):
    """One optimizer step on the next ready mini-batch (engine-driven training).

    ``policy -> coordinator``, when the trainer is idle and ``view.buffer.ready_batches > 0``;
    the coordinator takes the batch out of the buffer and sends the trainer a ``Train`` order,
    or answers ``IntentRejected`` (``busy``, ``no_batch``)."""

    loss_fn: str = ""
    """Optional ``"module:function"`` overriding ``trainer.loss_fn`` for this step."""


class TrainBatch(Intent, frozen=True, kw_only=True, tag="trainer.train_batch"):
    """One optimizer step on a batch the user took with ``Engine.next_batch()``.

    ``user -> coordinator`` (``Engine.train``); refused with ``IntentRejected`` if the batch was
    never handed out (``unknown_batch``), was already trained (``already_trained``) or the
    trainer is busy. A step whose user loss fails leaves the batch trainable again."""

    batch_id: int
    samples: list[Sample]
    loss_fn: str = ""


class PublishWeights(Intent, frozen=True, kw_only=True, tag="trainer.publish_weights"):
    """Publish the trainer's weights as the next version.

    ``policy | user -> coordinator -> trainer`` (``Publish``); answered by ``WeightsReady``.
    With no optimizer step since the last publish it is a no-op: nothing is sent, and the
    coordinator answers ``IntentRejected(reason="nothing_new")`` so a waiting caller learns why.

    ``replica_ids``: replicas to load the new version on as soon as it exists — the trainer
    rings their relays itself, so the weights reach them without a round trip through the
    coordinator and the policy (each answers ``WeightsLoaded``); those down, or already loading
    it, are skipped. Where the transport pairs each load with a send (``nccl``, ``gloo``), or a
    replica has no relay, the coordinator loads them after ``WeightsReady`` instead."""

    replica_ids: list[str] = []


class LoadWeights(Intent, frozen=True, kw_only=True, tag="rollout.load_weights"):
    """Load the current published weights on replicas in rollout mode.

    ``policy | user -> coordinator``, typically on ``WeightsReady``; each live replica gets an
    ``InstallWeights`` order and answers ``WeightsLoaded``. Replicas asleep load on their next
    ``SwitchToRollout``. ``version`` (-1: the current one) must be the current version."""

    replica_ids: list[str]
    version: int = -1


class Rebalance(Intent, frozen=True, kw_only=True, tag="rollout.rebalance"):
    """Even out in-flight samples over the replicas in rollout mode.

    ``policy | user -> coordinator``: bare, the coordinator asks every replica above the mean
    load to shed the excess, counting the new groups the staleness gate admits now as load to
    come (a replica those will fill takes no partial: a moved sample costs its prefix's
    prefill again); with ``replica_ids`` and ``count``, each named replica sheds
    ``count`` samples (``ShedGroups``). Shed groups resume on the least loaded replicas."""

    replica_ids: list[str] = []
    count: int = 0


class Consolidate(Intent, frozen=True, kw_only=True, tag="rollout.consolidate"):
    """Make ``replica_ids`` the straggler lane: they start no new prompt groups and take only
    samples moved to them — the oldest samples generating elsewhere, once they have been at it
    for ``after_s`` seconds — at most ``max_in_flight`` each, so the long samples the trainer
    waits for decode in small batches while the other replicas start fresh groups (Laminar's
    repack of long-tail trajectories).

    ``policy | user -> coordinator``; the coordinator moves a sample by cutting it where it runs
    (``CutSamples``) and resuming its partial on the lane (only its prefix is prefilled again).
    Empty ``replica_ids``: no lane; every replica takes new groups again."""

    replica_ids: list[str] = []
    max_in_flight: int = 16
    after_s: float = 0.0


class Validate(Intent, frozen=True, kw_only=True, tag="validate.run"):
    """Score the current weights greedily on the held-out prompts.

    ``policy | user -> coordinator -> one replica`` (``RunValidation``); answered by
    ``ValidateBegin`` + ``ValidateEnd``. ``replica_ids`` restricts where (empty: the least
    loaded replica in rollout mode)."""

    replica_ids: list[str] = []


class Stop(Intent, frozen=True, kw_only=True, tag="run.stop"):
    """End the run: stop starting groups, publish, load and validate the final weights, save
    the last checkpoint, then ``RunEnded(reason="stopped")``.

    ``user | policy -> coordinator`` (``Engine.stop``, Ctrl-C in ``shunter run``)."""

    reason: str = "stopped"
    """Free text: why (recorded in the log)."""


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """What the coordinator did with an intent a user submitted: carried it out (``accepted``;
    true as a bool) or refused it (``rejected``: the ``IntentRejected``, also in the run's event
    log, with its ``reason`` and ``detail``). Carried out means its orders were sent — the
    outcome still comes as events (``ModeChanged``, ``WeightsReady`` …) — and a replica it names
    that is not in the mode it applies to is skipped, not refused; one the run does not have is
    refused (``unknown_replica``), the others it names are still carried out.

    ``coordinator -> Engine.submit's caller`` (``Engine.submit`` returns it once the coordinator
    has handled the intent); not a message: it is not on the bus or in the event log."""

    intent: Intent
    """The intent: as the coordinator stamped it when carried out (``source = "user"``, ``seq``),
    as submitted when refused (``rejected.intent_seq`` is its ``seq`` in the event log)."""
    rejected: IntentRejected | None = None

    @property
    def accepted(self) -> bool:
        return self.rejected is None

    def __bool__(self) -> bool:
        return self.rejected is None
