"""``Coordinator``: the one consumer loop of a run.

Invariant: every message is handled by the same numbered steps, in arrival order, by one
coroutine; nothing inside the loop awaits a component (the executor reports back with
events), so a slow replica or trainer can never wedge it. A policy that raises becomes a
``PolicyFailed`` event; the loop goes on.

    1. record      the message goes to every sink (event log, logs, metrics, feed)
    2. apply       events update the state, buffer and dispatcher (commands: their
                   immediate effects)
    3. decide      policy.decide(event, view) -> commands, each recorded and executed
    4. pump        start new groups and resume partial samples while replicas have room
                   and the staleness gate is open
    5. finish      after ``total_steps``: publish, load and validate the final weights,
                   save the last checkpoint, account every group, emit ``RunEnded``

Checkpoints (``run.checkpoint_every``) are cut right after a publish, before the policy
sees the ``WeightsReady``: the coordinator writes its snapshot into a staging folder and
asks the trainer for its part (``SaveCheckpoint``, queued ahead of any later train step);
``TrainerStateSaved`` commits the folder atomically (``CheckpointSaved``). A resumed
attempt (:meth:`restore`) starts with ``RunResumed`` instead of ``RunStarted``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

from shunter.engine import snapshot as snapshot_mod
from shunter.engine.buffer import Batch, SampleBuffer
from shunter.engine.checkpoint import CheckpointStore
from shunter.engine.config import EngineConfig
from shunter.engine.dispatcher import Dispatcher
from shunter.engine.executor import TRAINER as TRAINER_TARGET
from shunter.engine.executor import Executor
from shunter.engine.state import EngineState, ReplicaState
from shunter.events import (
    BatchReady,
    BufferView,
    CheckpointSaved,
    Command,
    CommandFailed,
    ComponentFailed,
    EngineView,
    Event,
    Generate,
    GroupDropped,
    LoadWeights,
    Message,
    ModeChanged,
    Offload,
    Offloaded,
    Onload,
    Onloaded,
    PolicyFailed,
    PromptSpec,
    PublishWeights,
    Rebalance,
    ReplicaDown,
    ReplicaUp,
    RunEnded,
    RunResumed,
    RunStarted,
    Sample,
    SampleAborted,
    SampleEnd,
    SamplingSpec,
    SaveCheckpoint,
    Stamper,
    StepBegin,
    StepEnd,
    Stop,
    SwitchToRollout,
    SwitchToTrainer,
    TrainerStateSaved,
    TrainStep,
    Validate,
    ValidateEnd,
    WeightsLoaded,
    WeightsReady,
    tag_of,
)
from shunter.events.view import DOWN, ROLLOUT, SWITCHING, TRAINER
from shunter.policies import Policy

Sink = Callable[[Message], None]
REPLICA_STATE_COMMANDS = frozenset(tag_of(c) for c in (LoadWeights, SwitchToRollout, SwitchToTrainer))


class Coordinator:
    def __init__(
        self,
        cfg: EngineConfig,
        policy: Policy,
        executor: Executor,
        prompts: Iterator[PromptSpec],
        *,
        run_id: str,
        validation_prompts: list[PromptSpec] | None = None,
        sinks: list[Sink] | None = None,
        clock: Callable[[], float] = time.time,
        checkpoints: CheckpointStore | None = None,
    ) -> None:
        self.cfg = cfg
        self.policy = policy
        self.executor = executor
        self.prompts = prompts
        self.validation_prompts = validation_prompts or []
        self.sinks = list(sinks or [])
        r, t = cfg.rollout, cfg.trainer
        self.state = EngineState(
            run_id=run_id,
            ppo_mini_batch_size=t.ppo_mini_batch_size,
            parameter_sync_step=t.parameter_sync_step,
            train_batch_size=t.train_batch_size,
            n_samples_per_prompt=r.n_samples_per_prompt,
            max_staleness=r.max_staleness,
            validate_every=cfg.validation.every,
            trainer_driver=cfg.run.trainer_driver,
        )
        self.buffer = SampleBuffer(
            group_size=r.n_samples_per_prompt,
            groups_per_batch=cfg.groups_per_mini_batch,
            batches_per_version=t.parameter_sync_step,
            max_staleness=r.max_staleness,
            on_stale=r.on_stale,
        )
        self.dispatcher = Dispatcher()
        self.sampling = SamplingSpec(
            max_tokens=r.max_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
            ignore_eos=r.ignore_eos, length_dist=r.length_dist,
        )
        self.clock = clock
        self.stamp = Stamper(run_id, "coordinator", clock)
        self.policy_stamp = Stamper(run_id, "policy", clock)
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._derived: deque[Event] = deque()
        self._resumes: deque[Sample] = deque()
        self._announced_batches = 0
        self._finishing = False
        self._final_validate_sent = False
        self._final_validated = False
        self._validating_on = ""
        self._failed_groups = 0
        self._stop_reason = ""
        self._serving_dirty, self._serving_cache = True, None
        self._on_replica: dict[int, dict[str, int]] = {}  # group -> replica -> samples generating
        self._where: dict[str, tuple[str, Sample | None]] = {}  # sample -> (replica, resumed partial)
        self.ended: RunEnded | None = None
        self.started_at = clock()
        self.tokens = 0
        self.rewards: list[float] = []  # mean reward of each trained batch, in order
        self.validations: list[ValidateEnd] = []
        self.checkpoints = checkpoints
        self.prompts_taken = 0
        self._ckpt_step = 0  # step of the last committed (or restored) checkpoint
        self._ckpt_pending = ""  # staging folder of the checkpoint being written
        self._final_ckpt_tried = False
        self._resumed: RunResumed | None = None
        self._opened = False  # RunStarted / RunResumed emitted: the run may finish from here on
        executor.bind(self.post_many)

    # -- inputs ----------------------------------------------------------------------
    def post(self, msg: Message) -> None:
        self._inbox.put_nowait(msg)

    def post_many(self, msgs: list[Message]) -> None:
        for m in msgs:
            self._inbox.put_nowait(m)

    def emit(self, event: Event) -> None:
        """An event the coordinator itself produced; handled before the next inbox item."""
        self._derived.append(self.stamp(event))

    # -- the loop --------------------------------------------------------------------
    async def run(self) -> RunEnded:
        while not self._inbox.empty():  # the replicas' opening events come first
            self.handle(self._inbox.get_nowait())
        if self._resumed is not None:
            self.emit(self._resumed)
            self._announce_batches()  # restored ready groups form batches again
        else:
            self.emit(RunStarted(policy=self.policy.name or type(self.policy).__name__,
                                 replicas=len(self.state.replicas), trainer_driver=self.state.trainer_driver))
        self._opened = True
        self._drain_derived()
        stall = self.cfg.run.stall_timeout_s
        while self.ended is None:
            try:
                msg = await asyncio.wait_for(self._inbox.get(), stall)
            except TimeoutError:
                if self.state.trainer_driver == "engine" and self.executor.pending() == 0 and self._inbox.empty():
                    self._end("error", error=f"stalled: nothing in flight and no message for {stall:.0f}s "
                                             f"(run.stall_timeout_s); last view: {self.view()}")
                continue
            self.handle(msg)
            self._drain_derived()
        return self.ended

    def _drain_derived(self) -> None:
        while self._derived and self.ended is None:
            self.handle(self._derived.popleft())

    def handle(self, msg: Message) -> None:
        for sink in self.sinks:  # 1. record
            sink(msg)
        if isinstance(msg, Command):
            self.execute(msg)
            self.pump()
            self.finish_if_done(msg)
            return
        self.state.seq += 1
        self.state.now = max(self.state.now, msg.wall_time)
        if (rid := getattr(msg, "replica_id", None)) is not None:
            self.state.touch(rid)
        if isinstance(msg, ReplicaUp | ReplicaDown | ModeChanged | WeightsLoaded):
            self._serving_dirty = True
        self.apply(msg)  # 2. apply
        for cmd in self.decide(msg):  # 3. decide
            for sink in self.sinks:
                sink(cmd)
            self.execute(cmd)
        self.pump()  # 4. pump
        self.finish_if_done(msg)  # 5. finish

    def view(self) -> EngineView:
        b = self.buffer
        # with no replica serving, whether a replica switched in (on current weights) could start work
        serving = self._serving_version
        gate = b.capacity(self.state.trainer.version if serving is None else serving) > 0
        bv = BufferView(
            ready_samples=b.ready_samples,
            ready_batches=b.ready_batches(),
            in_flight_groups=b.in_flight,
            in_flight_samples=self.dispatcher.total_in_flight,
            dispatched_groups=b.dispatched,
            trained_groups=b.trained,
            dropped_groups=sum(b.dropped.values()),
            gate_open=gate and not self._finishing,
            pending_resumes=len(self._resumes),
        )
        return self.state.view(bv, self.dispatcher.in_flight)

    def decide(self, event: Event) -> list[Command]:
        try:
            cmds = self.policy.decide(event, self.view())
            bad = [c for c in cmds if not isinstance(c, Command)]
            if bad:
                raise TypeError(f"decide() must return Command objects, got {bad[:3]!r}")
            return [self.policy_stamp(c) for c in cmds]
        except Exception as e:  # noqa: BLE001 - a policy bug must not kill the loop
            self.emit(PolicyFailed(policy=self.policy.name or type(self.policy).__name__,
                                   on_kind=tag_of(event), error=f"{type(e).__name__}: {e}"))
            return []

    # -- 2. apply ------------------------------------------------------------------------
    def apply(self, ev: Event) -> None:
        st = self.state
        match ev:
            case ReplicaUp():
                st.replicas[ev.replica_id] = ReplicaState(ev.replica_id, ev.replica_kind, ev.rank, ev.mode, ev.version)
                if ev.mode == ROLLOUT and ev.version < st.trainer.version:
                    # a replica joining late serves the current weights before it takes requests
                    st.replicas[ev.replica_id].mode = TRAINER
                    self.execute(SwitchToRollout(replica_ids=[ev.replica_id]))
                elif ev.mode == ROLLOUT:
                    self._enter_rollout(ev.replica_id, ev.wall_time)
            case ReplicaDown():
                if (r := st.replicas.get(ev.replica_id)) is not None and r.mode != DOWN:
                    r.mode = DOWN
                    r.rate.stop()
                    self._recover(ev.replica_id)
                    if ev.replica_id == self._validating_on:
                        self._final_validate_sent = False  # the final validation died with it: redo
                self.dispatcher.forget(ev.replica_id)
            case SampleEnd():
                s = ev.sample
                self._where.pop(s.sample_id, None)
                self._left(s.group_id, ev.replica_id)
                if (r := st.replicas.get(ev.replica_id)) is not None:
                    r.rate.add(ev.wall_time)
                    r.samples_done += 1
                    r.tokens_done += len(s.token_ids)
                self.tokens += len(s.token_ids)
                if self.buffer.add(s):
                    self._announce_batches()
            case SampleAborted() if ev.reason == "failed":
                self._where.pop(ev.sample_id, None)
                self._left(ev.group_id, ev.replica_id)
            case SampleAborted():
                if ev.partial is not None:
                    self._where.pop(ev.sample_id, None)
                    self._left(ev.group_id, ev.replica_id)
                    if self.buffer.group(ev.group_id) is not None:
                        self._resumes.append(ev.partial)
            case StepBegin():
                st.trainer.state = "training"
            case StepEnd():
                t = st.trainer
                t.state, t.step = "idle", ev.step
                t.steps_since_publish += 1
                if st.trainer_driver == "engine" and t.step >= self.cfg.run.total_steps:
                    st.done = self._finishing = True  # before the policy sees this event
                t.step_s.add(ev.duration_s)
                if "batch/reward_mean" in ev.metrics:
                    self.rewards.append(ev.metrics["batch/reward_mean"])
            case WeightsReady():
                t = st.trainer
                t.state, t.version, t.steps_since_publish, t.handle = "idle", ev.version, 0, ev.handle
                for g in self.buffer.prune(ev.version):
                    self.emit(GroupDropped(group_id=g.group_id, reason="stale", samples=len(g.samples)))
                self._checkpoint_if_due()
            case TrainerStateSaved():
                self._commit_checkpoint(ev)
            case ComponentFailed() if ev.component == TRAINER_TARGET:
                st.trainer.state = "failed"
                self._end("error", error=f"trainer failed: {ev.error}", failed_component=TRAINER_TARGET)
            case WeightsLoaded():
                if (r := st.replicas.get(ev.replica_id)) is not None:
                    r.version = max(r.version, ev.version)
            case ModeChanged():
                if (r := st.replicas.get(ev.replica_id)) is not None:
                    r.mode = ev.mode
                    st.switch_cost[ev.mode].add(ev.duration_s)
                    if ev.mode == ROLLOUT:
                        r.version = max(r.version, int(ev.detail.get("version", r.version)))
                        self._enter_rollout(ev.replica_id, ev.wall_time)
                    else:
                        r.rate.stop()
            case CommandFailed():
                self._on_failure(ev)
            case ValidateEnd():
                self.validations.append(ev)
            case Offloaded():
                st.trainer.offloaded |= set(ev.parts)
            case Onloaded():
                st.trainer.offloaded -= set(ev.parts)

    def _enter_rollout(self, rid: str, t: float) -> None:
        r = self.state.replicas[rid]
        self.dispatcher.add(rid, rank=r.rank, capacity=self.cfg.rollout.max_in_flight_per_replica)
        r.rate.start(t)

    def _announce_batches(self) -> None:
        """One ``BatchReady`` per mini-batch that became formable (ids in taking order)."""
        version = self.state.trainer.version
        for k, groups in enumerate(self.buffer.formable(), start=0):
            if k < self._announced_batches:
                continue
            self._announced_batches += 1
            min_v = min(g.min_version for g in groups)
            self.emit(BatchReady(batch_id=self.buffer.batches_taken + k, samples=sum(len(g.samples) for g in groups),
                                 groups=len(groups), min_version=min_v, max_staleness=version - min_v))

    def _started(self, group_id: int, rid: str, n: int) -> None:
        per = self._on_replica.setdefault(group_id, {})
        per[rid] = per.get(rid, 0) + n
        self.dispatcher.started(rid, n)
        self.state.touch(rid)

    def _left(self, group_id: int, rid: str, n: int = 1) -> None:
        """``n`` samples of a group are no longer generating on ``rid``."""
        per = self._on_replica.get(group_id, {})
        n = min(n, per.get(rid, 0))
        if n <= 0:
            return
        per[rid] -= n
        if not per[rid]:
            del per[rid]
        if not per:
            self._on_replica.pop(group_id, None)
        self.dispatcher.finished(rid, n)
        self.state.touch(rid)

    def _recover(self, rid: str) -> None:
        """A replica died: every sample it was generating comes back — from the prefix the
        coordinator already holds (a resumed partial) or from scratch — as a partial to resume
        elsewhere; the fact is recorded as ``SampleAborted(reason="replica_down")``."""
        for sid, (where, partial) in list(self._where.items()):
            if where != rid:
                continue
            gid = partial.group_id if partial is not None else int(sid.split(".", 1)[0])
            g = self.buffer.group(gid)
            if g is None:
                self._where.pop(sid)
                continue
            p = partial or self._fresh(sid, gid, g.prompt.prompt_id)
            self.emit(SampleAborted(sample_id=sid, group_id=gid, replica_id=rid, reason="replica_down",
                                    tokens=len(p.token_ids), partial=p))

    def _fresh(self, sid: str, gid: int, prompt_id: int) -> Sample:
        """A sample with no tokens yet, to be generated from the start."""
        return Sample(sample_id=sid, group_id=gid, prompt_id=prompt_id, prompt_token_ids=[],
                      max_tokens=self.sampling.max_tokens)

    def _on_failure(self, ev: CommandFailed) -> None:
        if ev.group_id >= 0:
            self._left(ev.group_id, ev.target, 1 << 30)  # whatever of the call is still counted
            for sid in [k for k, (r, _) in self._where.items() if r == ev.target and k.split(".", 1)[0] == str(ev.group_id)]:
                del self._where[sid]
            if (g := self.buffer.drop(ev.group_id, "failed")) is not None:
                self.emit(GroupDropped(group_id=g.group_id, reason="failed", samples=len(g.samples)))
            self._failed_groups += 1
            if self._failed_groups >= 8 and self.buffer.trained == 0:
                self._end("error", error=f"every generation fails; last: {ev.error}")
            return
        if ev.command_kind == tag_of(SaveCheckpoint):  # the previous checkpoint stays usable; go on
            self._ckpt_pending = ""
            return
        if ev.target == TRAINER_TARGET:
            self.state.trainer.state = "failed"
            self._end("error", error=f"trainer failed on {ev.command_kind}: {ev.error}")
        elif ev.command_kind in REPLICA_STATE_COMMANDS and (r := self.state.replicas.get(ev.target)) and r.mode != DOWN:
            # its mode or weights are unknown now: stop using it (a dead actor is reported by the executor)
            self.emit(ReplicaDown(replica_id=ev.target, reason=f"{ev.command_kind} failed: {ev.error}"))

    # -- commands --------------------------------------------------------------------------
    def execute(self, cmd: Command) -> None:
        st, ex = self.state, self.executor
        match cmd:
            case SwitchToRollout():
                for rid in self._replicas_in(cmd.replica_ids, TRAINER):
                    st.replicas[rid].mode = SWITCHING
                    st.touch(rid)
                    ex.send(rid, SwitchToRollout(replica_ids=[rid], version=st.trainer.version, handle=st.trainer.handle))
            case SwitchToTrainer():
                for rid in self._replicas_in(cmd.replica_ids, ROLLOUT):
                    st.replicas[rid].mode = SWITCHING
                    st.touch(rid)
                    self.dispatcher.remove(rid)
                    self._serving_dirty = True
                    ex.send(rid, SwitchToTrainer(replica_ids=[rid], sleep_level=cmd.sleep_level))
            case TrainStep():
                self._train(cmd)
            case PublishWeights():
                st.trainer.state = "publishing"
                ex.send(TRAINER_TARGET, cmd)
            case LoadWeights():
                ids = [i for i in cmd.replica_ids if i in st.replicas and st.replicas[i].mode != DOWN]
                for rid in ids:
                    ex.send(rid, LoadWeights(version=cmd.version, replica_ids=[rid], handle=cmd.handle or st.trainer.handle))
            case Validate():
                self._validate(cmd)
            case Rebalance():
                self._rebalance(cmd)
            case Offload() | Onload() | SaveCheckpoint():
                ex.send(TRAINER_TARGET, cmd)
            case Stop():
                self._finishing = st.done = True
                self._stop_reason = self._stop_reason or cmd.reason
            case _:
                self.emit(CommandFailed(command_kind=tag_of(cmd), target="coordinator",
                                        error="this command is not accepted on the bus"))

    @property
    def _serving_version(self) -> int | None:
        """Newest weight version among replicas taking requests (for the gate)."""
        if self._serving_dirty:
            vs = [r.version for r in self.state.replicas.values() if r.replica_id in self.dispatcher]
            self._serving_cache = max(vs) if vs else None
            self._serving_dirty = False
        return self._serving_cache

    def _replicas_in(self, ids: list[str], mode: str) -> list[str]:
        return [i for i in ids if i in self.state.replicas and self.state.replicas[i].mode == mode]

    def _train(self, cmd: TrainStep) -> None:
        t = self.state.trainer
        if t.state != "idle":
            self.emit(CommandFailed(command_kind=tag_of(cmd), target=TRAINER_TARGET, error=f"trainer is {t.state}"))
            return
        if not cmd.samples:
            batch = self.next_batch()
            if batch is None:
                self.emit(CommandFailed(command_kind=tag_of(cmd), target="coordinator", error="no mini-batch is ready"))
                return
            cmd = TrainStep(batch_id=batch.batch_id, samples=batch.samples, loss_fn=cmd.loss_fn or self.cfg.trainer.loss_fn)
        t.state = "training"
        self.executor.send(TRAINER_TARGET, cmd)

    def next_batch(self) -> Batch | None:
        """Take the next mini-batch out of the buffer (for the trainer or a user loop)."""
        batch, dropped = self.buffer.take(self.state.trainer.version)
        for g in dropped:
            self.emit(GroupDropped(group_id=g.group_id, reason="stale", samples=len(g.samples)))
        if batch is not None:
            self._announced_batches = max(0, self._announced_batches - 1)
        return batch

    def _rebalance(self, cmd: Rebalance) -> None:
        """Ask replicas above the mean in-flight load to shed the excess (their partial
        samples resume on the least loaded replicas through the pump)."""
        d = self.dispatcher
        serving = d.active()
        if cmd.replica_ids:  # an explicit plan (from a user): pass it through
            for rid in cmd.replica_ids:
                if rid in self.state.replicas:
                    self.executor.send(rid, Rebalance(replica_ids=[rid], count=cmd.count))
            return
        if len(serving) < 2:
            return
        mean = d.total_in_flight / len(serving)
        for rid in serving:
            excess = d.in_flight(rid) - int(mean + 0.5)
            if excess >= self.cfg.rollout.n_samples_per_prompt:  # at least a group's worth
                self.executor.send(rid, Rebalance(replica_ids=[rid], count=excess))

    def _validate(self, cmd: Validate) -> None:
        ids = cmd.replica_ids or self.dispatcher.active() or [
            r.replica_id for r in self.state.replicas.values() if r.mode == ROLLOUT
        ]
        if not ids or not self.validation_prompts:
            return
        # all held-out prompts go to one replica, so a validation reads one weight version
        rid = min(ids, key=self.dispatcher.in_flight)
        self._validating_on = rid
        self.executor.send(rid, Validate(replica_ids=[rid], prompts=cmd.prompts or self.validation_prompts))

    # -- 4. pump ---------------------------------------------------------------------------
    def pump(self) -> None:
        if self._finishing:
            return
        d, n = self.dispatcher, self.cfg.rollout.n_samples_per_prompt
        while self._resumes:
            p = self._resumes[0]
            g = self.buffer.group(p.group_id)
            if g is None:
                self._resumes.popleft()
                continue
            rid = d.pick(1)
            if rid is None:
                break
            self._resumes.popleft()
            self._started(g.group_id, rid, 1)
            self._where[p.sample_id] = (rid, p)
            self.executor.send(rid, Generate(group_id=g.group_id, prompt=g.prompt, n=0, sampling=self.sampling, resume=[p]))
        while True:
            rid = d.pick(n)
            if rid is None or self.buffer.capacity(self.state.replicas[rid].version) <= 0:
                return
            try:
                prompt = next(self.prompts)
            except StopIteration:
                return
            self.prompts_taken += 1
            g = self.buffer.open(prompt, self.state.replicas[rid].version)
            self._started(g.group_id, rid, n)
            for k in range(n):
                self._where[f"{g.group_id}.{k}"] = (rid, None)
            self.executor.send(rid, Generate(group_id=g.group_id, prompt=prompt, n=n, sampling=self.sampling))

    # -- 5. finish -------------------------------------------------------------------------
    def finish_if_done(self, ev: Message) -> None:
        st = self.state
        if self.ended is not None or not self._opened or self._derived:
            return  # events the coordinator just produced are handled (and recorded) first
        if not self._finishing or st.trainer.state not in ("idle",):
            return
        serving = [r for r in st.replicas.values() if r.mode == ROLLOUT]
        if st.trainer.steps_since_publish > 0 and st.trainer_driver == "engine":
            self._issue(PublishWeights())
            return
        if isinstance(ev, WeightsReady) and serving:
            self._issue(LoadWeights(version=ev.version, replica_ids=[r.replica_id for r in serving]))
            return
        if any(r.version < st.trainer.version for r in serving):
            return  # final weights still loading
        if self.cfg.validation.every > 0 and serving and self.validation_prompts:
            if not self._final_validate_sent:
                self._final_validate_sent = True
                self._issue(Validate())
                return
            if isinstance(ev, ValidateEnd) and ev.version >= st.trainer.version:
                self._final_validated = True
            if not self._final_validated:
                return
        if self._wants_final_checkpoint():
            return
        self._end("stopped" if self._stop_reason else "completed")

    def _issue(self, cmd: Command) -> None:
        cmd = self.stamp(cmd)
        for sink in self.sinks:
            sink(cmd)
        self.execute(cmd)

    def _end(self, reason: str, error: str = "", failed_component: str = "") -> None:
        for g in self.buffer.drop_all("run_end"):
            self.handle_dropped(g.group_id, len(g.samples))
        self.buffer.check()
        ended = self.stamp(RunEnded(reason=reason, steps=self.state.trainer.step, summary=self.summary(), error=error,
                                    failed_component=failed_component))
        for sink in self.sinks:
            sink(ended)
        self.ended = ended

    def handle_dropped(self, group_id: int, samples: int) -> None:
        ev = self.stamp(GroupDropped(group_id=group_id, reason="run_end", samples=samples))
        for sink in self.sinks:
            sink(ev)

    # -- checkpoints -----------------------------------------------------------------------
    def _checkpoint_if_due(self, *, final: bool = False) -> bool:
        """Cut a checkpoint now (right after a publish) if one is due; True if one was started."""
        store, every, t = self.checkpoints, self.cfg.run.checkpoint_every, self.state.trainer
        if store is None or every <= 0 or self._ckpt_pending or t.step <= self._ckpt_step or t.steps_since_publish:
            return False
        if not final and t.step - self._ckpt_step < every:
            return False
        try:
            staging = store.staging(t.step)
            (staging / snapshot_mod.SNAPSHOT_FILE).write_bytes(snapshot_mod.encode(self.snapshot()))
        except Exception as e:  # noqa: BLE001 - a checkpoint that cannot be written is reported, not fatal
            self.emit(CommandFailed(command_kind="checkpoint.write", target="coordinator", error=f"{type(e).__name__}: {e}"))
            return False
        self._ckpt_pending = str(staging)
        self._issue(SaveCheckpoint(step=t.step, path=str(staging)))
        return True

    def _commit_checkpoint(self, ev: TrainerStateSaved) -> None:
        if not self._ckpt_pending or ev.path != self._ckpt_pending or self.checkpoints is None:
            return
        self._ckpt_pending = ""
        t0 = time.perf_counter()
        try:
            path, manifest = self.checkpoints.commit(Path(ev.path), run_id=self.state.run_id, step=ev.step,
                                                     version=ev.version)
        except Exception as e:  # noqa: BLE001 - the previous checkpoint stays the one to resume from
            self.emit(CommandFailed(command_kind="checkpoint.commit", target="coordinator", error=f"{type(e).__name__}: {e}"))
            return
        self._ckpt_step = ev.step
        self.emit(CheckpointSaved(step=ev.step, version=ev.version, path=str(path), nbytes=manifest.nbytes,
                                  duration_s=ev.duration_s + time.perf_counter() - t0))

    def _wants_final_checkpoint(self) -> bool:
        """At the end of a run with checkpoints on: save the final state once (True while it is written)."""
        if self._ckpt_pending:
            return True
        if self._final_ckpt_tried or self.state.trainer.step <= self._ckpt_step:
            return False
        self._final_ckpt_tried = True
        return self._checkpoint_if_due(final=True)

    def snapshot(self) -> snapshot_mod.CoordinatorSnapshot:
        """The coordinator's state at this cut (see ``shunter.engine.snapshot``)."""
        waiting = {p.sample_id: p for p in self._resumes}
        buffer = self.buffer.snapshot()
        in_flight = []
        for st in buffer.groups:
            done = {s.sample_id for s in st.samples}
            for k in range(st.n):
                sid = f"{st.group_id}.{k}"
                if sid in done:
                    continue
                partial = waiting.get(sid) or self._where.get(sid, ("", None))[1]
                in_flight.append(partial or self._fresh(sid, st.group_id, st.prompt.prompt_id))
        return snapshot_mod.CoordinatorSnapshot(
            run_id=self.state.run_id, step=self.state.trainer.step, version=self.state.trainer.version,
            prompts_taken=self.prompts_taken, buffer=buffer, in_flight=in_flight,
            policy=self.policy.snapshot(), tokens=self.tokens, wall_s=self.clock() - self.started_at,
            rewards=list(self.rewards), validations=list(self.validations), failed_groups=self._failed_groups,
        )

    def restore(self, snap: snapshot_mod.CoordinatorSnapshot, *, checkpoint: str = "", attempt: int = 1,
                reason: str = "") -> None:
        """Continue a run from a snapshot (before :meth:`run`): the buffer, the samples in
        flight (they resume from their prefixes), the prompt stream, the policy's state."""
        self.buffer.restore(snap.buffer)
        self._resumes = deque(p for p in snap.in_flight if self.buffer.group(p.group_id) is not None)
        for _ in itertools.islice(self.prompts, snap.prompts_taken):
            pass
        self.prompts_taken = snap.prompts_taken
        t = self.state.trainer
        t.step, t.version, t.steps_since_publish = snap.step, snap.version, 0
        self._ckpt_step = snap.step
        if self.state.trainer_driver == "engine" and snap.step >= self.cfg.run.total_steps:
            self.state.done = self._finishing = True  # saved at the very end: only the finale is left
        if snap.policy:
            self.policy.restore(snap.policy)
        self.tokens, self.rewards, self.validations = snap.tokens, list(snap.rewards), list(snap.validations)
        self._failed_groups = snap.failed_groups
        self.started_at = self.clock() - snap.wall_s
        self._resumed = RunResumed(checkpoint=checkpoint, step=snap.step, version=snap.version, attempt=attempt,
                                   reason=reason)

    def summary(self) -> dict[str, float]:
        wall = self.clock() - self.started_at
        out: dict[str, float] = {"wall_s": wall, "steps": float(self.state.trainer.step),
                                 "version": float(self.state.trainer.version),
                                 "rollout/tokens_per_s": self.tokens / wall if wall > 0 else 0.0}
        out.update({f"buffer/{k}_groups": float(v) for k, v in self.buffer.counters().items()})
        if self.rewards:
            k = max(1, min(5, len(self.rewards) // 4))
            out["batch/reward_first"] = sum(self.rewards[:k]) / k
            out["batch/reward_last"] = sum(self.rewards[-k:]) / k
        if self.validations:
            for key, val in self.validations[0].metrics.items():
                out[f"validate/{key}_first"] = val
            for key, val in self.validations[-1].metrics.items():
                out[f"validate/{key}_last"] = val
        return out
