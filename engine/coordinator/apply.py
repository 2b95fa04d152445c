"""``Applier``: where each event changes the coordinator's state.

Invariant: applying an event changes only the coordinator's own records — replica and
trainer state, buffer, dispatcher, samples in flight, batches, tallies — plus what follows
from the fact by rule (a dead replica's samples resume elsewhere, a late replica is brought
to the current weights, a completed publish may cut a checkpoint, a dead trainer ends the
run); what to *do* next is the policy's call, made after this.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.coordinator.batches import Batches
from shunter.engine.coordinator.buffer import SampleBuffer
from shunter.engine.coordinator.cuts import CHECKPOINT_KINDS, CheckpointCuts
from shunter.engine.coordinator.dispatcher import Dispatcher
from shunter.engine.coordinator.executor import TRAINER as TRAINER_TARGET
from shunter.engine.coordinator.finale import Finale
from shunter.engine.coordinator.inflight import InFlight
from shunter.engine.coordinator.intents import Intents
from shunter.engine.coordinator.snapshot import CoordinatorSnapshot
from shunter.engine.coordinator.state import EngineState, ReplicaState
from shunter.engine.coordinator.supervisor import Supervisor
from shunter.engine.coordinator.tally import Tally
from shunter.events import (
    CommandFailed,
    ComponentFailed,
    EnvFailed,
    Event,
    GroupDropped,
    ModeChanged,
    Offloaded,
    Onloaded,
    ReplicaDown,
    ReplicaGivenUp,
    ReplicaUp,
    RewardFailed,
    RewardWorkerLost,
    SampleAborted,
    SampleBegin,
    SampleEnd,
    SampleResumed,
    SendWeights,
    StepBegin,
    StepEnd,
    TrainerStateSaved,
    ValidateEnd,
    WeightsLoaded,
    WeightsReady,
    tag_of,
)
from shunter.events.orders import EnterRollout, EnterTrainer, InstallWeights
from shunter.events.vocab import DOWN, ROLLOUT, TRAINER

REPLICA_STATE_ORDERS = frozenset(tag_of(c) for c in (InstallWeights, EnterRollout, EnterTrainer))
"""Orders whose failure leaves a replica's mode or weights unknown: it is taken out."""
GROUP_SENDS = frozenset({tag_of(SendWeights)})
"""The trainer's half of a weight load over one replica's weight group: its failure is that
group's (the replica died mid-broadcast, or never joined), not the trainer's — the executor drops
the group (the next load joins a new one) and the replica's half of the load fails with it,
taking that replica out; a trainer that died is reported by its own death."""
FAILED_GROUPS_BEFORE_TRAINING = 8
"""This many failed generations before any group trained means every generation fails."""
WORKER_LOSSES_BEFORE_ENDING = 8
"""Reward workers lost this many times (``RewardWorkerLost``) before any sample was scored mean
the reward kills the process it runs in on every call: the run ends naming it at once, not after
a mini-batch of calls each tried alone on a restarted worker (about 20 s a call on 2 cores)."""
MIN_REWARD_FAILURES_BEFORE_ENDING = 8
"""Reward failures on a mini-batch's worth of samples (at least this many) before any sample was
scored mean the reward cannot score: the run ends naming the function (training on zeros would
learn nothing, silently)."""

End = Callable[..., None]
_RECORDED_ONLY = frozenset({SampleBegin, SampleResumed})
"""Per-sample facts the coordinator's state already holds (it placed the sample): they are
recorded and shown to the policy, and change nothing here but the view's clock — nor does a
sample cut by a weight load that resumes on its own replica (``weights_update``, no partial).
Two in three messages of a busy fleet are such facts; they cost O(1) and touch no replica."""


class Applier:
    def __init__(
        self,
        cfg: EngineConfig,
        state: EngineState,
        buffer: SampleBuffer,
        dispatcher: Dispatcher,
        inflight: InFlight,
        batches: Batches,
        intents: Intents,
        cuts: CheckpointCuts,
        finale: Finale,
        tally: Tally,
        supervisor: Supervisor,
        *,
        emit: Callable[[Event], object],
        end: End,
        snapshot: Callable[[], CoordinatorSnapshot],
    ) -> None:
        self.cfg = cfg
        self.state, self.buffer, self.dispatcher, self.inflight = state, buffer, dispatcher, inflight
        self.batches, self.intents, self.cuts, self.finale, self.tally = batches, intents, cuts, finale, tally
        self.emit, self.end, self.snapshot = emit, end, snapshot
        self.supervisor = supervisor
        self.tally.env_in_play = bool(cfg.task.environment)  # an Engine(environment=...) class: from its samples
        self._unscored: set[str] = set()  # samples whose RewardFailed came, their SampleEnd not yet
        # failed environment calls that end their trajectory (init, reset, step; not close), this attempt
        self._env_cut: Counter[str] = Counter()

    def apply(self, ev: Event) -> None:
        st = self.state
        st.seq += 1
        if ev.wall_time > st.now:
            st.now = ev.wall_time
        cls = ev.__class__
        if cls in _RECORDED_ONLY or (cls is SampleAborted and ev.partial is None and ev.reason == "weights_update"):  # type: ignore[attr-defined]
            return  # a sample (re)started, or cut to resume where it is: nothing it was placed with changes
        if (rid := getattr(ev, "replica_id", None)) is not None:
            st.touch(rid)
        self._apply(ev)
        if (decision := self.supervisor.observe(ev)) is not None:
            self.emit(decision)
        self.finale.observe(ev)

    def _apply(self, ev: Event) -> None:
        st = self.state
        match ev:
            case ReplicaUp():
                self._replica_up(ev)
            case ReplicaDown():
                self._replica_down(ev)
            case SampleEnd():
                self._sample_end(ev)
            case RewardFailed():
                self._reward_failed(ev)
            case EnvFailed():
                self._env_failed(ev)
            case RewardWorkerLost():
                self._worker_lost(ev)
            case SampleAborted():
                if ev.reason == "failed" or ev.partial is not None:
                    self.inflight.finished(ev.sample_id, ev.group_id, ev.replica_id)
                if ev.partial is not None:
                    self.inflight.requeue(ev.partial)
                elif ev.reason == "failed":
                    self.inflight.done(ev.sample_id)
            case StepBegin():
                st.trainer.state = "training"
            case StepEnd():
                self._step_end(ev)
            case WeightsReady():
                t = st.trainer
                t.state, t.version, t.steps_since_publish, t.handle = "idle", ev.version, 0, ev.handle
                for g in self.buffer.prune(ev.version):
                    self.emit(GroupDropped(group_id=g.group_id, reason="stale", samples=len(g.samples)))
                self.cuts.maybe_cut(t, self.snapshot)
            case TrainerStateSaved():
                self.cuts.commit(ev)
            case ComponentFailed() if ev.component == TRAINER_TARGET:
                st.trainer.state = "failed"
                self.end("error", error=f"trainer failed: {ev.error}", failed_component=TRAINER_TARGET)
            case WeightsLoaded():
                if (r := st.replicas.get(ev.replica_id)) is not None:
                    r.version = max(r.version, ev.version)
                    if r.loading <= ev.version:
                        r.loading = -1
                    self.dispatcher.set_version(ev.replica_id, r.version)
            case ModeChanged():
                self._mode_changed(ev)
            case CommandFailed():
                self._failed(ev)
            case ValidateEnd():
                self.tally.validations.append(ev)
            case Offloaded():
                st.trainer.offloaded |= set(ev.parts)
            case Onloaded():
                st.trainer.offloaded -= set(ev.parts)
            case ReplicaGivenUp() if self.supervisor.none_left():
                lost = f"no rollout replica left, none can be replaced; the last lost: {ev.reason}"
                self.end("error", error=lost + self._in_process())

    def _in_process(self) -> str:
        """What else may have killed the replicas: the user's reward, run in their own process."""
        task = self.cfg.task
        if not task.reward or task.reward_workers:
            return ""
        return (
            f". The replicas ran the reward function {task.reward} in their own processes "
            "(task.reward_workers = 0): a reward that exits or crashes its process (os._exit, a "
            "segfault, memory) kills the replica. Set task.reward_workers = 1 to run it in a worker "
            "of its own, where such a call scores 0 and is named"
        )

    def restored(self) -> None:
        """After a restore: ready groups form batches again."""
        self.batches.announce()

    # -- replicas ----------------------------------------------------------------------------
    def _replica_up(self, ev: ReplicaUp) -> None:
        st = self.state
        st.replicas[ev.replica_id] = ReplicaState(ev.replica_id, ev.replica_kind, ev.rank, ev.mode, ev.version)
        if ev.mode == ROLLOUT and ev.version < st.trainer.version:
            st.replicas[ev.replica_id].mode = TRAINER  # a late joiner serves the current weights first
            self.intents.to_rollout([ev.replica_id])
        elif ev.mode == ROLLOUT:
            self._dispatch_to(ev.replica_id, ev.wall_time)

    def _replica_down(self, ev: ReplicaDown) -> None:
        r = self.state.replicas.get(ev.replica_id)
        self.state.joining.discard(ev.replica_id)
        if r is not None and r.mode != DOWN:
            r.mode = DOWN
            r.rate.stop()
            for aborted in self.inflight.recover(ev.replica_id):
                self.emit(aborted)
        self.dispatcher.forget(ev.replica_id)

    def _mode_changed(self, ev: ModeChanged) -> None:
        st = self.state
        r = st.replicas.get(ev.replica_id)
        st.joining.discard(ev.replica_id)
        if r is None or r.mode == DOWN:
            return
        r.mode = ev.mode
        st.switch_cost[ev.mode].add(ev.duration_s)
        if ev.mode == ROLLOUT:
            r.version = max(r.version, int(ev.detail.get("version", r.version)))
            if r.loading <= r.version:
                r.loading = -1
            self._dispatch_to(ev.replica_id, ev.wall_time)
        else:
            r.rate.stop()

    def _dispatch_to(self, rid: str, t: float) -> None:
        r = self.state.replicas[rid]
        self.dispatcher.add(rid, rank=r.rank, capacity=self.cfg.rollout.max_in_flight_per_replica, version=r.version)
        r.rate.start(t)

    # -- samples and steps --------------------------------------------------------------------
    def _reward_failed(self, ev: RewardFailed) -> None:
        self.tally.reward_failures[ev.failure] += 1
        self._unscored.add(ev.sample_id)
        self._end_if_never_worked(
            ev, self.tally.reward_failures, self.tally.rewards_scored, ("it", "samples", "and scored none")
        )

    def _worker_lost(self, ev: RewardWorkerLost) -> None:
        lost = self.tally.workers_lost
        lost[ev.loss] += 1
        if self.tally.rewards_scored == 0 and lost.total() >= WORKER_LOSSES_BEFORE_ENDING:
            self.end(
                "error",
                error=f"reward function {ev.user_code}: its reward worker was lost {lost.total()} times "
                f"({', '.join(f'{k} {n}' for k, n in lost.items())}) before any sample was scored — the reward "
                f"kills or hangs the process it runs in; the last: {ev.error}",
                failed_component=ev.user_code,
            )

    def _env_failed(self, ev: EnvFailed) -> None:
        self.tally.env_failures[ev.failure] += 1
        if ev.call == "close":  # the trajectory was scored all the same: counted, never ends the run
            return
        self._env_cut[ev.failure] += 1
        self._end_if_never_worked(
            ev, self._env_cut, self.tally.env_steps, ("the environment", "trajectories", "and never answered")
        )

    def _end_if_never_worked(
        self, ev: RewardFailed | EnvFailed, failures: Counter[str], worked: int, words: tuple[str, str, str]
    ) -> None:
        """User code on the hot path (a reward, an environment) that failed on a mini-batch's worth
        of samples before working once ends the run, naming it; a failure after that is counted."""
        enough = max(MIN_REWARD_FAILURES_BEFORE_ENDING, self.cfg.trainer.ppo_mini_batch_size)
        if worked == 0 and failures.total() >= enough:
            who, unit, outcome = words
            self.end(
                "error",
                error=f"{ev.error} — {who} failed on each of the run's first {failures.total()} {unit} "
                f"({', '.join(f'{n} {k}' for k, n in failures.items())}) {outcome}",
                failed_component=ev.user_code,
            )

    def _sample_end(self, ev: SampleEnd) -> None:
        s = ev.sample
        self.tally.env_steps += len(s.turns)
        self.tally.env_in_play |= bool(s.loss_mask or s.turns)
        if s.sample_id in self._unscored:
            self._unscored.discard(s.sample_id)
        else:
            self.tally.rewards_scored += 1
        self.inflight.finished(s.sample_id, s.group_id, ev.replica_id)
        self.inflight.done(s.sample_id)
        if (r := self.state.replicas.get(ev.replica_id)) is not None:
            r.rate.add(ev.wall_time)
            r.samples_done += 1
            r.tokens_done += len(s.token_ids)
        self.tally.tokens += len(s.token_ids)
        if self.buffer.add(s):
            if (late := self.buffer.drop_if_late(s.group_id, self.state.trainer.version)) is not None:
                self.emit(GroupDropped(group_id=late.group_id, reason="stale", samples=len(late.samples)))
            self.batches.announce()

    def _step_end(self, ev: StepEnd) -> None:
        st, t = self.state, self.state.trainer
        t.state, t.step = "idle", ev.step
        t.steps_since_publish += 1
        t.step_s.add(ev.duration_s)
        self.batches.done(ev.batch_id, ev.step)
        if "batch/reward_mean" in ev.metrics:
            self.tally.rewards.append(ev.metrics["batch/reward_mean"])
        if st.trainer_driver == "engine" and t.step >= self.cfg.run.total_steps:
            self.finale.begin()  # before the policy sees this event

    def _failed(self, ev: CommandFailed) -> None:
        st = self.state
        if ev.group_id >= 0:
            self.inflight.failed(ev.group_id, ev.target)
            if (g := self.buffer.drop(ev.group_id, "failed")) is not None:
                self.emit(GroupDropped(group_id=g.group_id, reason="failed", samples=len(g.samples)))
            self.tally.failed_groups += 1
            if self.tally.failed_groups >= FAILED_GROUPS_BEFORE_TRAINING and self.buffer.trained == 0:
                self.end("error", error=f"every generation fails; last: {ev.error}")
            return
        if ev.command_kind in CHECKPOINT_KINDS:  # the previous checkpoint stays usable; tried again
            self.cuts.failed(ev)
            return
        if ev.target == TRAINER_TARGET and ev.user_code:  # the user's loss: the trainer itself is fine
            st.trainer.state = "idle"
            self.batches.failed(ev.batch_id)
            if st.trainer_driver == "engine":  # the policy would only train into the same error again
                self.end("error", error=f"trainer.loss_fn failed: {ev.error}")
            return
        if ev.target == TRAINER_TARGET and ev.command_kind in GROUP_SENDS:
            return
        if ev.target == TRAINER_TARGET:
            st.trainer.state = "failed"
            self.end("error", error=f"trainer failed on {ev.command_kind}: {ev.error}")
        elif ev.command_kind in REPLICA_STATE_ORDERS and (r := st.replicas.get(ev.target)) and r.mode != DOWN:
            # its mode or weights are unknown now: stop using it (a dead actor is reported by the executor)
            self.emit(ReplicaDown(replica_id=ev.target, reason=f"{ev.command_kind} failed: {ev.error}"))
