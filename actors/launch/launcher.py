"""``Launcher``: creates, places and removes the actors of one run — it opens what outlives the
run's attempts, then starts and stops each attempt (trainer, reward workers, replicas,
coordinator) — and closes them all at the run's end.

Invariants: every actor of a run is named ``shunter.<run_id>.*`` in the ``shunter`` namespace
(replicas by the name the registry gave their rank; one taken from a ``ReplicaPool`` keeps the
name the run that made it gave it), so re-runs and concurrent runs in one cluster never collide
on a name; every actor the launcher made is killed by :meth:`stop_attempt`, but the standalone
replicas a restart keeps for the next attempt (``run.restart_keeps_replicas``: it adopts those
that still answer, at the checkpoint's weights) or a run's close gives to its pool; a component
that does not start raises ``EngineSetupError`` naming it and its own cause; every actor gets
``run.import_paths`` so the user's code resolves alike in every process.

Its parts, each made here with what it is given: ``room`` (``Room``: whether the actors fit and
where each goes), ``site`` (``RunSite``: model folder, dataset, Ray, placement group, registry —
opened once), ``current`` (``Attempt``: the attempt in progress, shared with the replica part)
and ``replicas`` (``ReplicaLauncher``: the replicas made, adopted, placed, announced, brought
up mid-run and parked in the pool). A restart whose trainer finds no room (its node lost) waits
for room up to ``run.restart_wait_s`` and says so (``trainer.pending`` / ``trainer.waited``, told
to the engine's readers through ``notice`` as no coordinator runs meanwhile).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from shunter.actors.launch.attempt import Attempt, await_setup
from shunter.actors.launch.cluster import NAMESPACE, on_node, wait_for_room
from shunter.actors.launch.replica_launcher import ReplicaLauncher
from shunter.actors.launch.room import Room
from shunter.actors.launch.run_site import RunSite
from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.io.checkpoint import Found
from shunter.events import (
    Codec,
    ComponentReady,
    Event,
    Message,
    ReplicaUp,
    TrainerPending,
    TrainerWaited,
)
from shunter.events.vocab import HYBRID, STANDALONE, ReplicaKind, WaitOutcome


class Launcher:
    def __init__(
        self,
        cfg: EngineConfig,
        run_id: str,
        out_dir: Path,
        *,
        train_data: Any = None,
        val_data: Any = None,
        environment: Any = None,
        pool: Any = None,
        notice: Callable[[Event], None] = lambda ev: None,
    ) -> None:
        """``train_data`` / ``val_data``: rows given as objects instead of ``data.*_files``;
        ``environment``: a class instead of ``task.environment``; ``pool``: a ``ReplicaPool``
        the run takes standalone replicas from and gives them back to (``Engine``'s arguments);
        ``notice``: tells the engine's readers what happens while no coordinator runs (a restart
        waiting for room for its trainer: ``trainer.pending``, ``trainer.waited``)."""
        self.cfg, self.run_id, self.out_dir = cfg, run_id, out_dir
        self.notice = notice
        self.pool = pool
        self.codec = Codec()
        self.attempt = 0
        self.room = Room(cfg)
        self.site = RunSite(cfg, run_id, out_dir, self.room, pool=pool, train_data=train_data, val_data=val_data)
        self.current = Attempt()
        self.replicas = ReplicaLauncher(
            cfg, run_id, self.codec, self.site, self.room, self.current, pool=pool, environment=environment
        )

    # -- the run -------------------------------------------------------------------------
    async def open(self) -> None:
        """Model, Ray, placement and the run's registry (they outlive attempts)."""
        await self.site.open()

    async def close(self) -> None:
        """Stop the attempt (its standalone replicas to the pool, if the run has one), then close
        what the run opened."""
        await self.stop_attempt(keep_replicas=self.pool is not None)
        if self.pool is not None:
            await self.replicas.park_in_pool()
            await self.stop_attempt()  # what did not go to the pool
        self.site.close()

    async def new_replica(
        self, kind: ReplicaKind, *, mid_run: bool = False, replacing: str = ""
    ) -> tuple[str, Any, int, list[Message]]:
        """``ReplicaLauncher.new_replica``: a replica registered and its actor created."""
        return await self.replicas.new_replica(kind, mid_run=mid_run, replacing=replacing)

    async def bring_up(self, rid: str, h: Any, kind: ReplicaKind, rank: int, opening: list[Message]) -> ReplicaUp:
        """``ReplicaLauncher.bring_up``: a replica made mid-run started and announced."""
        return await self.replicas.bring_up(rid, h, kind, rank, opening)

    # -- an attempt ----------------------------------------------------------------------
    def _name(self, component: str) -> str:
        return f"shunter.{self.run_id}.{component}" + (f".{self.attempt}" if self.attempt else "")

    async def start_attempt(self, resume: Found | None, reason: str = "") -> Any:
        """Start trainer, replicas and coordinator — from the checkpoint ``resume`` if any;
        returns the coordinator's handle, its loop running."""
        from shunter.actors import coordinator_actor, trainer_worker

        cfg = self.cfg
        opening: list[Message] = []
        ckpt = resume[0] if resume else None
        if resume is not None:
            self.current.serve = (str(resume[0] / "model"), resume[1].version)
        else:
            self.current.serve = (self.site.model_dir, 0)
        r = cfg.rollout
        kinds: list[ReplicaKind] = [STANDALONE] * r.standalone_replicas + [HYBRID] * r.hybrid_replicas
        if self.room.placer is None:  # a placement group reserved its room already
            if resume is not None and self.attempt > 0:  # a restart: the trainer's node may be lost
                opening += await self._room_for_trainer(resume, reason)
            self.room.check(kinds)  # the whole attempt's, the replicas it adopts included
        rewards_s = await self.start_reward_workers()
        opening += [
            ComponentReady(
                component=f"reward-{i}", setup_s=rewards_s, run_id=self.run_id, source="engine", wall_time=time.time()
            )
            for i in range(len(self.current.reward_pool))
        ]
        adopted: dict[str, tuple[Any, ReplicaKind, int, float]] = {}
        if resume is not None:  # ranks held by replicas of an earlier attempt are free again, but the kept ones'
            adopted, released = await self.replicas.take_over(r.standalone_replicas, self.attempt)
            opening += released
            for _ in adopted:
                kinds.remove(STANDALONE)
        ranks = [
            trainer_worker.remote_class()
            .options(
                name=self._name(_rank_component(rank)),
                namespace=NAMESPACE,
                **self.room.options(
                    _rank_component(rank),
                    self.room.placer.trainer_slot(rank) if self.room.placer else None,
                    cfg.trainer.num_gpus,
                    cfg.trainer.num_cpus,
                    cfg.trainer.resources,
                ),
            )
            .remote(
                self.run_id,
                msgspec.msgpack.encode(cfg.trainer),
                self.site.model_dir,
                seed=cfg.run.seed,
                temperature=cfg.rollout.temperature,
                init_from=str(ckpt) if ckpt else "",
                import_paths=cfg.run.import_paths,
                rank=rank,
            )
            for rank in range(cfg.trainer.world_size)
        ]
        tr = ranks[0]  # the coordinator's trainer: it speaks for every rank
        self.current.actors.extend(ranks)
        self.current.trainer_node = ""
        if r.hybrid_replicas and self.room.placer is None and cfg.trainer.resources:  # hybrids live beside it
            self.current.trainer_node = str(
                (await await_setup("trainer", tr.where.remote(), cfg.run.timeout_s, value=True)).get("node_id", "")
            )
        replicas = {}
        for kind in kinds:
            rid, h, rank, evs = await self.replicas.new_replica(kind)
            opening += evs
            replicas[rid] = (h, kind, rank)
        pooled = {rid for rid in replicas if rid in self.replicas.pooled}
        setups = {
            **(await self._trainer_setups(ranks)),
            **{rid: self.replicas.start_call(rid, h) for rid, (h, _, _) in replicas.items()},
        }
        times = {comp: await await_setup(comp, ref, cfg.run.timeout_s) for comp, ref in setups.items()}
        for rank in range(1, len(ranks)):  # the run hears of one trainer, ready once every rank is
            times["trainer"] = max(times["trainer"], times.pop(_rank_component(rank)))
        times.update({rid: t for rid, (_, _, _, t) in adopted.items()})
        now = time.time()
        opening += [
            ComponentReady(component=comp, setup_s=t, run_id=self.run_id, source="engine", wall_time=now)
            for comp, t in times.items()
        ]
        replicas.update({rid: (h, kind, rank) for rid, (h, kind, rank, _) in adopted.items()})
        opening += await self.replicas.placed(
            {
                **{_rank_component(rank): h for rank, h in enumerate(ranks)},
                **{rid: h for rid, (h, _, _) in replicas.items()},
            }
        )
        for rid, (_, kind, rank) in replicas.items():
            opening.append(
                self.replicas.replica_up(rid, kind, rank, times[rid], adopted=rid in adopted or rid in pooled)
            )
        self.current.coordinator = (  # it writes the run's records: on the driver's host
            coordinator_actor.remote_class()
            .options(name=self._name("coordinator"), namespace=NAMESPACE, **on_node(self.site.driver_node))
            .remote(
                msgspec.msgpack.encode(cfg),
                self.run_id,
                tr,
                {rid: h for rid, (h, _, _) in replicas.items()},
                str(self.out_dir),
                self.site.registry,
                resume=str(ckpt) if ckpt else "",
                attempt=self.attempt,
                reason=reason,
                skipped=resume.skipped if resume else {},
                data=self.site.data,
            )
        )
        self.current.actors.append(self.current.coordinator)
        await await_setup(
            "coordinator", self.current.coordinator.start.remote(self.codec.encode_batch(opening)), cfg.run.timeout_s
        )
        return self.current.coordinator

    async def _trainer_setups(self, ranks: list[Any]) -> dict[str, Any]:
        """Every trainer rank's ``setup`` call, by component: with several ranks, each joins
        rank 0's group at the address rank 0 gives (``TrainerWorker.rendezvous``)."""
        if len(ranks) == 1:
            return {"trainer": ranks[0].setup.remote()}
        at = await await_setup("trainer", ranks[0].rendezvous.remote(), self.cfg.run.timeout_s, value=True)
        return {
            _rank_component(rank): h.setup.remote(at, ranks[1:] if rank == 0 else [ranks[0]])
            for rank, h in enumerate(ranks)
        }

    async def _room_for_trainer(self, resume: Found, reason: str) -> list[Message]:
        """A restart waits for room for its trainer — a lost node back, or one added — up to
        ``run.restart_wait_s``, saying so (``trainer.pending``, then ``trainer.waited``) through
        ``notice``; returns the two for the new coordinator to record (nothing if no wait was
        needed). Past the deadline: ``EngineSetupError`` naming what was missing."""
        said: list[Message] = []

        async def waiting(short: dict[str, float], free: dict[str, float]) -> None:
            said.append(
                TrainerPending(
                    reason=reason,
                    checkpoint_step=resume.manifest.step,
                    missing=short,
                    free=free,
                    deadline_s=self.cfg.run.restart_wait_s,
                    run_id=self.run_id,
                    source="engine",
                    wall_time=time.time(),
                )
            )
            self.notice(said[-1])

        async def waited(outcome: WaitOutcome, seconds: float) -> None:
            ev = TrainerWaited(
                outcome=outcome, waited_s=seconds, run_id=self.run_id, source="engine", wall_time=time.time()
            )
            said.append(ev)
            self.notice(ev)

        need = self.room.trainer_request()
        await wait_for_room(
            need,
            "the trainer",
            self.room.knobs(),
            self.cfg.run.restart_wait_s,
            waiting,
            waited,
            deadline_knob="run.restart_wait_s",
        )
        return said

    async def start_reward_workers(self) -> float:
        """The attempt's reward workers, each loaded and answering before any replica starts
        (a reward that cannot load is the run's setup error, naming it); seconds taken."""
        from shunter.actors import reward_workers as rewards

        t = self.cfg.task
        self.current.reward_pool = []
        if not t.reward_workers:
            return 0.0
        cls = rewards.remote_class(t.reward_worker_cpus)
        for i in range(t.reward_workers):
            h = cls.options(name=self._name(f"reward-{i}"), namespace=NAMESPACE).remote(
                t.reward,
                t.name,
                timeout_s=t.reward_timeout_s,
                threads=t.reward_threads,
                import_paths=self.cfg.run.import_paths,
            )
            self.current.actors.append(h)
            self.current.reward_pool.append(h)
        t0 = time.perf_counter()
        for i, h in enumerate(self.current.reward_pool):
            await await_setup(f"reward worker {i}", h.pid.remote(), self.cfg.run.timeout_s)
        return time.perf_counter() - t0

    async def stop_attempt(self, *, keep_replicas: bool = False) -> None:
        """Kill every actor of the attempt; with ``keep_replicas`` (a restart, when
        ``run.restart_keeps_replicas``; the run's close, with a ``ReplicaPool``) the standalone
        replicas are left running for the next attempt to adopt (``ReplicaLauncher.adopt_kept``) — whichever of
        them still answers then — or for the pool (``ReplicaLauncher.park_in_pool``)."""
        import ray

        if self.current.coordinator is not None:
            try:
                await asyncio.wait_for(self.current.coordinator.close.remote(), 10)
            except Exception:  # noqa: BLE001 - it may be the one that died
                pass
        spared = self.replicas.keep(keep_replicas)
        for h in reversed(self.current.actors):
            if any(h is k for k in spared):
                continue
            try:
                ray.kill(h)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self.current.actors[:] = spared
        self.current.coordinator = None


def _rank_component(rank: int) -> str:
    """Trainer rank ``rank``'s component name (its actor's and setup's): rank 0 is ``trainer``."""
    return "trainer" if rank == 0 else f"trainer.rank{rank}"
