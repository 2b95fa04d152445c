"""A simulated cluster: the real engine over simulated replicas and trainer, in virtual time.

Invariant: everything but the backends is the production code path — ``Coordinator``,
the policy, ``SampleBuffer``, ``Dispatcher``, ``RolloutCore``, ``TrainerHost``,
``LocalExecutor`` and ranks from ``RankTable`` — and it runs on a ``looptime`` event loop,
so simulated hours take seconds and the engine's own CPU time costs no simulated time.
The same (config, cost model, seed) gives the same event log, message for message —
unless ``charge_coordinator`` is set: then every CPU second the coordinator spends (its turns,
and decoding the bytes its relays send: ``RelayWire``) is a simulated second before it takes the
next message (``ChargedInbox``), so a coordinator that cannot keep up slows the simulated run, as
it would a real one, and its messages queue. CPU seconds, not wall seconds (``CPU_TIMER``): on a
loaded machine the wall clock measures the load; the wall figure is reported beside it. Each
message's latency is measured from its posting to the end of its handling, queueing included,
in simulated time (a relay's report: from its first fact's arrival at the relay). The process's
own cyclic-GC passes inside the coordinator's work are taken out of the charge (``GcPauses``):
they scan the simulated cluster's heap, not a coordinator's.

The result record and the accounting (``SimResult``, ``kv_occupancy``, ``ChargedInbox``,
``CoordinatorTime``, ``RelayWire``, ``GcPauses``) live in ``bench/sim/accounting.py``.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import looptime

from shunter.bench.sim.accounting import (
    CPU_TIMER,
    ChargedInbox,
    CoordinatorTime,
    GcPauses,
    RelayWire,
    SimResult,
    kv_occupancy,
)
from shunter.bench.sim.backends import (
    SimBackend,
    SimTokenizer,
    SimTrainer,
    sim_reward,
)
from shunter.bench.sim.cost_model import CostModel
from shunter.bench.sim.turns import SimTool
from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.coordinator.assemble import build_coordinator, replica_kinds, resume_version
from shunter.engine.coordinator.local_executor import LocalExecutor
from shunter.engine.coordinator.ranks import RankTable
from shunter.engine.coordinator.relay import Relay, route_through_relays
from shunter.engine.io.records import RunSinks
from shunter.engine.replica.core import RolloutCore
from shunter.engine.trainer.host import TrainerHost
from shunter.events import (
    Message,
    PromptSpec,
    RankAssigned,
    RelayReport,
    ReplicaUp,
    Stamper,
    flatten,
)
from shunter.events.vocab import ROLLOUT, STANDALONE, TRAINER
from shunter.policies import Policy


def prompts() -> Iterator[PromptSpec]:
    return (PromptSpec(prompt_id=i, text=f"p{i}") for i in itertools.count())


def run_sim(
    cfg: EngineConfig,
    cost: CostModel,
    *,
    seed: int = 0,
    keep: bool = True,
    sinks=(),
    policy: Policy | None = None,
    checkpoints: Path | None = None,
    resume: Path | None = None,
    time_limit_s: float | None = None,
    charge_coordinator: bool = False,
    out_dir: Path | None = None,
    timer=CPU_TIMER,
    replicas_per_relay: int = 8,
) -> SimResult:
    """Run one simulated job to ``RunEnded``; ``keep=False`` keeps no messages (pass a folding sink such as
    ``shunter.bench.analysis.summary.Summary`` instead). ``policy``: an instance to use instead of ``run.policy``;
    ``checkpoints``: a folder for checkpoints; ``resume``: a checkpoint folder to continue from; ``time_limit_s``:
    simulated seconds before ``TimeoutError``; ``charge_coordinator``: the coordinator's CPU time passes on the
    simulated clock; ``out_dir``: attach a production run's sinks (event log, structured log, metrics, feed) writing
    there; ``timer``: what measures the coordinator's CPU time (a test passes a fake one; GC passes are taken out
    only with ``CPU_TIMER``); ``replicas_per_relay``: replicas per simulated node, each node's answers folded by a
    relay of its own (``engine.coordinator.relay``, with ``rollout.report_window_s``; 0: one relay for all;
    ``run.relays = "none"``: one in the coordinator's process, which then sends every order and weight load itself).
    The caller's ``sinks`` are observers: they see each turn's messages (a report's facts one by one) after the
    turn, outside its charged time."""
    # nothing in a simulation waits on I/O or threads: time may jump as soon as no callback is ready
    loop = looptime.new_event_loop(start=0.0, noop_cycles=1)
    extra = RunSinks.open(out_dir) if out_dir is not None else None
    try:
        job = _run(
            cfg,
            cost,
            seed,
            keep,
            loop,
            extra,
            list(sinks),
            policy,
            checkpoints,
            resume,
            charge_coordinator,
            timer,
            replicas_per_relay,
        )
        return loop.run_until_complete(asyncio.wait_for(job, time_limit_s))
    finally:
        loop.close()
        if extra is not None:
            extra.close()


async def _run(
    cfg: EngineConfig,
    cost: CostModel,
    seed: int,
    keep: bool,
    loop,
    extra: RunSinks | None,
    sinks: list,
    policy: Policy | None,
    checkpoints: Path | None,
    resume: Path | None,
    charge: bool,
    timer,
    per_relay: int,
) -> SimResult:
    run_id = f"sim-{seed}"
    clock = loop.time
    version = resume_version(resume)
    table = RankTable(run_id)
    kinds = replica_kinds(cfg)
    cores, opening, models = {}, [], []
    for i, kind in enumerate(kinds):
        rid = f"{kind}-{i}"
        lease = table.assign(rid, kind)
        mode = ROLLOUT if kind == STANDALONE else TRAINER
        backend = SimBackend(cost, seed=seed * 100_003 + lease.rank, sleeping=mode == TRAINER)
        models.append(backend.model)
        turns = cost.tool_calls_max > 0
        cores[rid] = RolloutCore(
            rid,
            backend,
            SimTokenizer(cost.prompt_tokens, turns=turns),
            sim_reward,
            Stamper(run_id, rid, clock),
            mode=mode,
            reward_name="sim_reward",
            version=version,
            weight_update=cfg.rollout.weight_update,
            environment=functools.partial(SimTool, cost, seed) if turns else None,
            env_name="sim_tool",
            env_timeout_s=cfg.task.env_timeout_s,
            max_turns=cfg.task.max_turns,
        )
        opening += [
            RankAssigned(
                replica_id=rid,
                replica_kind=kind,
                rank=lease.rank,
                actor_name=lease.actor_name,
                run_id=run_id,
                source="registry",
                wall_time=clock(),
            ),
            ReplicaUp(
                replica_id=rid,
                replica_kind=kind,
                rank=lease.rank,
                mode=mode,
                run_id=run_id,
                source="sim",
                version=version,
                wall_time=clock(),
            ),
        ]
    table.check()
    n = cfg.rollout.standalone_replicas
    hosts = 0 if cfg.run.relays == "none" else -(-(n + cfg.rollout.hybrid_replicas) // (per_relay or max(1, n)))
    core = SimTrainer(cost, replicas=n, relays=hosts)  # hybrids on the trainer GPUs: IPC
    if resume is not None:
        core.load(str(resume))
    trainer = TrainerHost(core, Stamper(run_id, "trainer", clock), transport="sim")
    executor = LocalExecutor(run_id, trainer, cores, max_tokens=cfg.rollout.max_tokens, clock=clock)
    trainer.deliver = executor.deliver  # the trainer hands new weights to the nodes' relays
    r = cfg.rollout
    encoded = extra.log.remember if extra else None
    inbox = ChargedInbox(clock)
    pauses = GcPauses(timer=timer, active=timer is CPU_TIMER)  # a test's fake timer: nothing to take out
    work = CoordinatorTime(timer, inbox, charge=charge, pauses=pauses)
    wire = None
    if cfg.run.relays == "none":  # the coordinator's process holds every stream and folds them itself
        local = Relay("local", executor.post_through_relay, Stamper(run_id, "relay:local", clock),
                      window_s=r.report_window_s, max_events=r.report_max_events, encoded=encoded)  # fmt: skip
        executor.relay, relays = local, [local]
    else:
        relays = route_through_relays(
            executor,
            list(cores),
            per_relay,
            run_id,
            clock,
            window_s=r.report_window_s,
            max_events=r.report_max_events,
        )
        # each a relay actor's: what it posts crosses the wire into the coordinator's process
        wire = RelayWire(executor.post_through_relay, work, remember=encoded)
        for relay in relays:
            relay.timer, relay.post = timer, wire.post_of(relay)
    kept: list[Message] = []
    count = [0]
    recorded: list[Message] = []  # this turn's messages, for the observers once the turn's time is taken

    def sink(m: Message) -> None:
        count[0] += 1
        if keep:
            kept.append(m)

    observers = [sink, *sinks]

    def observe() -> None:  # an observer sees a report's facts one by one, outside the charged time
        for m in flatten(recorded):
            for obs in observers:
                obs(m)
        recorded.clear()

    coord = build_coordinator(
        cfg,
        executor,
        run_id=run_id,
        prompts=(prompts(), []),
        policy=policy,
        sinks=[*(extra or ()), recorded.append],
        clock=clock,
        checkpoints=checkpoints,
        resume=resume,
        inbox=inbox,
    )
    coord.post_many(opening)
    spent: list[float] = []
    sizes: list[int] = []
    latency: list[float] = []
    handle_many = coord.handle_many

    def timed(msgs: list[Message]) -> None:
        observe()  # what was recorded outside a turn (the opening)
        _, dt, _ = work.measure(handle_many, msgs)
        observe()
        spent.append(dt)
        sizes.append(len(msgs))
        now = clock() + (dt if charge else 0.0)
        for m, posted in zip(msgs, inbox.took()[-len(msgs) :], strict=True):  # before: the opening's
            if m.__class__ is RelayReport:  # each fact as late as the report's first: the window counts
                latency.extend([now - posted + m.held_s] * len(m.events))
            else:
                latency.append(now - posted)

    coord.handle_many = timed
    t0, wall0 = clock(), time.perf_counter()
    try:
        with pauses:
            ended = await coord.run()
    finally:
        await executor.close()
        observe()  # an end outside a turn (a stall, a crash)
    return SimResult(
        ended,
        kept,
        clock() - t0,
        time.perf_counter() - wall0,
        count[0],
        work.cpu_s,
        spent,
        sizes,
        latency,
        coordinator_wall_s=work.wall_s,
        decode_cpu_s=wire.decode_cpu_s if wire is not None else 0.0,
        relays=len(relays),
        gc_pause_s=pauses.total,
        gc_in_turns_s=pauses.in_turns,
        relay_cpu_s=[r.cpu_s for r in relays],
        relay_flushes=sum(r.flushes for r in relays),
        relay_folded=sum(r.folded for r in relays),
        kv_occupancy=kv_occupancy(models, cost.kv_tokens),
        books=[m.books() for m in models],
    )
