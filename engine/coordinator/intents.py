"""``Intents``: where the coordinator carries out what a policy or a user asks for.

Invariants: every intent either becomes complete orders to components (weights by the
current handle, the batch's samples, the held-out prompts) or an ``IntentRejected`` naming
why — never a half-done change; the state changes an order implies are made when it is sent
(a replica told to switch is ``switching`` at once, a trainer told to train is ``training``),
so the next view never invites the same intent twice. Refusals of the policy's own intents
are counted like its failures: the 1st, 10th, 100th … is reported; ``carry_out`` returns the
refusal of the intent it carried out (None: carried out), which a user's ``Verdict`` is made of.
"""

from __future__ import annotations

from collections.abc import Callable

from shunter.engine.coordinator.batches import Batches
from shunter.engine.coordinator.dispatcher import Dispatcher
from shunter.engine.coordinator.executor import TRAINER as TRAINER_TARGET
from shunter.engine.coordinator.executor import Executor
from shunter.engine.coordinator.inflight import InFlight
from shunter.engine.coordinator.state import EngineState
from shunter.events import (
    Batch,
    Consolidate,
    Delivery,
    EnterRollout,
    EnterTrainer,
    Event,
    InstallWeights,
    Intent,
    IntentRejected,
    LoadWeights,
    Offload,
    OffloadState,
    Onload,
    OnloadState,
    PromptSpec,
    Publish,
    PublishWeights,
    Rebalance,
    RunValidation,
    ShedGroups,
    Stop,
    SwitchToRollout,
    SwitchToTrainer,
    Train,
    TrainBatch,
    TrainStep,
    Validate,
    tag_of,
)
from shunter.events.vocab import DOWN, ROLLOUT, SWITCHING, TRAINER, RejectReason


def _milestone(n: int) -> bool:
    while n >= 10 and n % 10 == 0:
        n //= 10
    return n == 1


class Intents:
    def __init__(
        self,
        state: EngineState,
        dispatcher: Dispatcher,
        batches: Batches,
        executor: Executor,
        inflight: InFlight,
        *,
        emit: Callable[[Event], object],
        stop: Callable[[str], None],
        loss_fn: str,
        validation_prompts: list[PromptSpec],
        group_size: int,
    ) -> None:
        self.state = state
        self.dispatcher = dispatcher
        self.batches = batches
        self.executor = executor
        self.inflight = inflight
        self.emit = emit
        self.stop = stop
        self.loss_fn = loss_fn
        self.validation_prompts = validation_prompts
        self.group_size = group_size
        self.validating_on = ""
        """The replica running the last validation (the finale redoes it if that replica dies)."""
        self._refused: dict[tuple[str, str], int] = {}
        self._refusal: IntentRejected | None = None  # the first refusal of the intent being carried out

    def carry_out(self, intent: Intent) -> IntentRejected | None:
        """Carry ``intent`` out; its refusal if it was refused (the event as emitted), else None."""
        outer, self._refusal = self._refusal, None
        try:
            self._carry_out(intent)
            return self._refusal
        finally:
            self._refusal = outer

    def _carry_out(self, intent: Intent) -> None:
        ids = getattr(intent, "replica_ids", None)
        if ids and (unknown := [i for i in ids if i not in self.state.replicas]):
            known = ", ".join(sorted(self.state.replicas)) or "none"
            self.reject(intent, "unknown_replica", f"no replica {', '.join(unknown)} in this run (known: {known})")
        match intent:
            case SwitchToRollout():
                self.to_rollout(intent.replica_ids)
            case SwitchToTrainer():
                self.to_trainer(intent.replica_ids, intent.sleep_level)
            case TrainStep():
                self._train_step(intent)
            case TrainBatch():
                self._train_batch(intent)
            case PublishWeights():
                self._publish(intent)
            case LoadWeights():
                self._load(intent)
            case Validate():
                self.validate(intent.replica_ids)
            case Rebalance():
                self._rebalance(intent)
            case Consolidate():
                self._consolidate(intent)
            case Offload():
                self.executor.send(TRAINER_TARGET, OffloadState(parts=intent.parts))
            case Onload():
                self.executor.send(TRAINER_TARGET, OnloadState(parts=intent.parts))
            case Stop():
                self.stop(intent.reason)
            case _:  # an Intent subclass this coordinator does not know (a newer peer's)
                raise TypeError(f"no rule carries out {type(intent).__name__}")

    def reject(self, intent: Intent, reason: RejectReason, detail: str) -> None:
        key = (tag_of(intent), reason)
        n = 1
        if intent.source == "policy":
            n = self._refused[key] = self._refused.get(key, 0) + 1
        refusal = IntentRejected(
            intent_kind=tag_of(intent),
            reason=reason,
            detail=detail,
            intent_source=intent.source,
            intent_seq=intent.seq,
            repeats=n,
        )
        if _milestone(n):
            emitted = self.emit(refusal)
            refusal = emitted if isinstance(emitted, IntentRejected) else refusal  # stamped
        if self._refusal is None:
            self._refusal = refusal

    # -- replicas --------------------------------------------------------------------------
    def _in(self, ids: list[str], mode: str) -> list[str]:
        reps = self.state.replicas
        return [i for i in ids if i in reps and reps[i].mode == mode]

    def to_rollout(self, ids: list[str]) -> None:
        """Wake replicas in ``trainer`` mode with the current weights (others are skipped)."""
        t = self.state.trainer
        for rid in self._in(ids, TRAINER):
            self.state.replicas[rid].mode = SWITCHING
            self.state.joining.add(rid)
            self.state.touch(rid)
            self.executor.send(rid, EnterRollout(version=t.version, handle=t.handle))

    def to_trainer(self, ids: list[str], sleep_level: int) -> None:
        for rid in self._in(ids, ROLLOUT):
            self.state.replicas[rid].mode = SWITCHING
            self.state.touch(rid)
            self.dispatcher.remove(rid)
            self.executor.send(rid, EnterTrainer(sleep_level=sleep_level))

    def _load(self, intent: LoadWeights) -> None:
        t = self.state.trainer
        if intent.version not in (-1, t.version):
            self.reject(intent, "not_current", f"version {intent.version} asked, the current one is {t.version}")
            return
        self.load(intent.replica_ids)

    def load(self, ids: list[str]) -> None:
        """Load the current weights on the live replicas among ``ids`` that neither hold them
        nor have a load of them on its way (so a policy and the finale never load twice)."""
        t, reps = self.state.trainer, self.state.replicas
        for rid in ids:
            r = reps.get(rid)
            if r is None or r.mode == DOWN or r.version >= t.version or r.loading >= t.version:
                continue
            r.loading = t.version
            self.executor.send(rid, InstallWeights(version=t.version, handle=t.handle))

    def _rebalance(self, intent: Rebalance) -> None:
        """Replicas above the mean load shed the excess (it resumes on the least loaded
        through the pump); an explicit plan is passed through.

        The mean counts the new groups the gate admits now (``InFlight.startable``) as load to
        come: a replica that new groups will fill takes no partials. Moving a partial costs its
        prefix's prefill, and a lent replica's return cuts all it holds again: against the bare
        mean, ``long_tail_bimodal`` at 9:7 (whose gate stays open) moved ~1,800 samples onto every
        lend and lending after the first batch lost to not lending; ``lend_2to1``, whose gate
        admits little while the trainer waits, still moves what makes lending pay
        (docs/benchmarks.md)."""
        if intent.replica_ids:
            for rid in intent.replica_ids:
                if rid in self.state.replicas:
                    self.executor.send(rid, ShedGroups(count=intent.count))
            return
        d = self.dispatcher
        serving = d.active()
        if len(serving) < 2:
            return
        mean = (d.total_in_flight + self.inflight.startable()) / len(serving)
        for rid in serving:
            excess = d.in_flight(rid) - int(mean + 0.5)
            if excess >= self.group_size:  # at least a group's worth
                self.executor.send(rid, ShedGroups(count=excess))

    def _consolidate(self, intent: Consolidate) -> None:
        """The straggler lane is the live replicas among ``replica_ids`` (none: no lane)."""
        reps = self.state.replicas
        ids = [i for i in intent.replica_ids if i in reps and reps[i].mode != DOWN]
        if ids and intent.max_in_flight < 1:
            self.reject(intent, "bad_value", f"max_in_flight must be at least 1, got {intent.max_in_flight}")
            return
        self.dispatcher.set_tail(ids, max(1, intent.max_in_flight))
        self.inflight.consolidate(max(0.0, intent.after_s) if ids else -1.0)

    def validate(self, ids: list[str]) -> None:
        """All held-out prompts go to one replica, so a validation reads one weight version."""
        reps = self.state.replicas
        ids = ids or self.dispatcher.active() or [r.replica_id for r in reps.values() if r.mode == ROLLOUT]
        ids = [i for i in ids if i in reps and reps[i].mode == ROLLOUT]
        if not ids or not self.validation_prompts:
            return
        rid = min(ids, key=self.dispatcher.in_flight)
        self.validating_on = rid
        self.executor.send(rid, RunValidation(prompts=self.validation_prompts))

    # -- trainer ---------------------------------------------------------------------------
    def _busy(self, intent: Intent) -> bool:
        t = self.state.trainer
        if t.state == "idle":
            return False
        self.reject(intent, "busy", f"the trainer is {t.state}")
        return True

    def _train_step(self, intent: TrainStep) -> None:
        if self._busy(intent):
            return
        batch = self.batches.take()
        if batch is None:
            self.reject(intent, "no_batch", "no mini-batch is ready")
            return
        self._send_train(batch, intent.loss_fn or self.loss_fn)

    def _train_batch(self, intent: TrainBatch) -> None:
        why = self.batches.trainable(intent.batch_id)
        if why is not None:
            self.reject(intent, *why)
            return
        if self._busy(intent):
            return
        if not intent.samples:
            self.reject(intent, "no_batch", f"batch {intent.batch_id} holds no samples")
            return
        batch = self.batches.handed[intent.batch_id]
        self._send_train(
            Batch(
                batch_id=batch.batch_id,
                samples=intent.samples,
                group_ids=batch.group_ids,
                min_version=batch.min_version,
                max_staleness=batch.max_staleness,
            ),
            intent.loss_fn or self.loss_fn,
        )

    def _send_train(self, batch: Batch, loss_fn: str) -> None:
        self.state.trainer.state = "training"
        self.batches.begin(batch)
        self.executor.send(TRAINER_TARGET, Train(batch_id=batch.batch_id, samples=batch.samples, loss_fn=loss_fn))

    def _publish(self, intent: PublishWeights) -> None:
        if self._busy(intent):
            return
        t = self.state.trainer
        if t.steps_since_publish == 0:
            self.reject(intent, "nothing_new", f"no optimizer step since version {t.version} was published")
            return
        self.publish(intent.replica_ids)

    def publish(self, ids: list[str] | None = None) -> None:
        """Publish the next version; the replicas among ``ids`` in rollout, not loading it yet
        and behind a relay that can take it (``Executor.relay_of``) get it from the trainer
        straight away (marked loading now: nothing loads them twice)."""
        t, reps = self.state.trainer, self.state.replicas
        t.state = "publishing"
        relay_of = getattr(self.executor, "relay_of", None)
        by_relay: dict[str, list[str]] = {}
        for rid in ids or ():
            r = reps.get(rid)
            if r is None or r.mode != ROLLOUT or r.loading > t.version or relay_of is None:
                continue
            if relay := relay_of(rid):
                r.loading = t.version + 1
                by_relay.setdefault(relay, []).append(rid)
        deliver = [Delivery(relay=k, replica_ids=v) for k, v in by_relay.items()]
        self.executor.send(TRAINER_TARGET, Publish(deliver=deliver))
