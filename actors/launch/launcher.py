"""``Launcher``: creates, places and removes the actors of one run attempt.

Invariants: every actor of a run is named ``shunter.<run_id>.*`` in the ``shunter`` namespace
(replicas by the name the registry gave their rank; one taken from a ``ReplicaPool`` keeps the
name the run that made it gave it), so re-runs and concurrent runs in one cluster never collide
on a name; every actor the launcher made is killed by :meth:`stop_attempt`, but the standalone
replicas a restart keeps for the next attempt (``run.restart_keeps_replicas``: it adopts those
that still answer, at the checkpoint's weights) or a run's close gives to its pool; a component
that does not start raises ``EngineSetupError`` naming it and its own cause; every actor gets
``run.import_paths`` so the user's code resolves alike in every process.

The ``Launcher``'s methods are in three modules: this one starts and stops an attempt (trainer,
reward workers, replicas, coordinator); ``launch_cluster`` opens and closes what outlives the
attempts (model, Ray, placement, registry) and checks the room; ``launch_replicas`` makes, places
and brings up the replicas. The other two are mixins of ``Launcher``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import msgspec

from shunter.actors.launch.cluster import (  # noqa: F401 - local_only & co. are imported from here too
    NAMESPACE,
    RAY_SESSION,
    check_total,
    driver_node,
    init_ray,
    local_only,
    on_node,
    reap_orphans,
    request,
    shutdown_keeping_signal_handlers,
    wait_for_room,
)
from shunter.actors.launch.launcher_cluster import LauncherCluster
from shunter.actors.launch.launcher_replicas import LauncherReplicas
from shunter.actors.wire import root_cause
from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.io.checkpoint import Found
from shunter.engine.io.errors import EngineSetupError
from shunter.events import (
    Codec,
    ComponentReady,
    Message,
)
from shunter.events.vocab import HYBRID, STANDALONE, ReplicaKind


class Launcher(LauncherCluster, LauncherReplicas):
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
    ) -> None:
        """``train_data`` / ``val_data``: rows given as objects instead of ``data.*_files``;
        ``environment``: a class instead of ``task.environment``; ``pool``: a ``ReplicaPool``
        the run takes standalone replicas from and gives them back to (``Engine``'s arguments)."""
        self.cfg, self.run_id, self.out_dir = cfg, run_id, out_dir
        self.pool = pool
        self.train_data, self.val_data, self.environment = train_data, val_data, environment
        self.codec = Codec()
        self.attempt = 0
        self.owns_ray = False
        self.actors: list[Any] = []
        self.registry: Any = None
        self.coordinator: Any = None
        self.model_dir = ""
        self.data: Any = None
        """(training rows, validation prompts) of a run over a dataset, for each attempt's coordinator."""
        self.serve: tuple[str, int] = ("", 0)
        """(model folder, weight version) new replicas start from."""
        self._made = 0
        self.reward_pool: list[Any] = []
        """The attempt's reward workers (``task.reward_workers``), shared by its replicas."""
        self._placer: Any = None  # actors.placement.Placer when the config asks for GPUs
        self.driver_node = ""  # Ray's id of this process's node (the run folder is on its disk)
        self.trainer_node = ""  # where hybrid replicas go (CPU configs that pick the trainer's node)
        self._slots: dict[str, int] = {}  # component -> its placement-group bundle
        self.reaped: list[str] = []
        """Processes a killed earlier attempt of this run left running, ended at ``open``."""
        self.replicas: dict[str, tuple[Any, ReplicaKind, int]] = {}
        """Every replica this launcher made: id -> (handle, kind, rank)."""
        self.kept: dict[str, tuple[Any, ReplicaKind, int]] = {}
        """Standalone replicas an ended attempt left running for the next one (``stop_attempt``)."""
        self.names: dict[str, str] = {}  # replica id -> its actor's name
        self._keys: dict[str, tuple[str, ...]] = {}  # replica id -> what its engine was started with
        self._adopted: dict[str, float] = {}  # taken from the pool, not yet announced -> seconds

    # -- an attempt ----------------------------------------------------------------------
    def _name(self, component: str) -> str:
        return f"shunter.{self.run_id}.{component}" + (f".{self.attempt}" if self.attempt else "")

    async def start_attempt(self, resume: Found | None, reason: str = "") -> Any:
        """Start trainer, replicas and coordinator — from the checkpoint ``resume`` if any;
        returns the coordinator's handle, its loop running."""
        from shunter.actors import coordinator, trainer

        cfg = self.cfg
        opening: list[Message] = []
        ckpt = resume[0] if resume else None
        if resume is not None:
            self.serve = (str(resume[0] / "model"), resume[1].version)
        else:
            self.serve = (self.model_dir, 0)
        r = cfg.rollout
        kinds: list[ReplicaKind] = [STANDALONE] * r.standalone_replicas + [HYBRID] * r.hybrid_replicas
        if self._placer is None:  # a placement group reserved its room already
            self._check_room(kinds)  # the whole attempt's, the replicas it adopts included
        rewards_s = await self.start_reward_workers()
        opening += [
            ComponentReady(
                component=f"reward-{i}", setup_s=rewards_s, run_id=self.run_id, source="engine", wall_time=time.time()
            )
            for i in range(len(self.reward_pool))
        ]
        adopted: dict[str, tuple[Any, ReplicaKind, int, float]] = {}
        if resume is not None:  # ranks held by replicas of an earlier attempt are free again, but the kept ones'
            adopted, released = await self.adopt_kept(r.standalone_replicas)
            opening += released
            opening += self.codec.decode_batch(
                await self.registry.release_all.remote("attempt over", keep=list(adopted))
            )
            self._made = max(self._made, await self.registry.generation.remote())
            for _ in adopted:
                kinds.remove(STANDALONE)
        tr = (
            trainer.remote_class()
            .options(
                name=self._name("trainer"),
                namespace=NAMESPACE,
                **self._resources(
                    "trainer",
                    self._placer.trainer_slot() if self._placer else None,
                    cfg.trainer.num_gpus,
                    cfg.trainer.num_cpus,
                    cfg.trainer.resources,
                ),
            )
            .remote(
                self.run_id,
                msgspec.msgpack.encode(cfg.trainer),
                self.model_dir,
                seed=cfg.run.seed,
                temperature=cfg.rollout.temperature,
                init_from=str(ckpt) if ckpt else "",
                import_paths=cfg.run.import_paths,
            )
        )
        self.actors.append(tr)
        self.trainer_node = ""
        if r.hybrid_replicas and self._placer is None and cfg.trainer.resources:  # hybrids live beside it
            self.trainer_node = str((await self._setup("trainer", tr.where.remote(), value=True)).get("node_id", ""))
        replicas = {}
        for kind in kinds:
            rid, h, rank, evs = await self.new_replica(kind)
            opening += evs
            replicas[rid] = (h, kind, rank)
        pooled = {rid for rid in replicas if rid in self._adopted}
        setups = {"trainer": tr.setup.remote(), **{rid: self.start_call(rid, h) for rid, (h, _, _) in replicas.items()}}
        times = {comp: await self._setup(comp, ref) for comp, ref in setups.items()}
        times.update({rid: t for rid, (_, _, _, t) in adopted.items()})
        now = time.time()
        opening += [
            ComponentReady(component=comp, setup_s=t, run_id=self.run_id, source="engine", wall_time=now)
            for comp, t in times.items()
        ]
        replicas.update({rid: (h, kind, rank) for rid, (h, kind, rank, _) in adopted.items()})
        opening += await self.placed({"trainer": tr, **{rid: h for rid, (h, _, _) in replicas.items()}})
        for rid, (_, kind, rank) in replicas.items():
            opening.append(self.replica_up(rid, kind, rank, times[rid], adopted=rid in adopted or rid in pooled))
        self.coordinator = (  # it writes the run's records: on the driver's host
            coordinator.remote_class()
            .options(name=self._name("coordinator"), namespace=NAMESPACE, **on_node(self.driver_node))
            .remote(
                msgspec.msgpack.encode(cfg),
                self.run_id,
                tr,
                {rid: h for rid, (h, _, _) in replicas.items()},
                str(self.out_dir),
                self.registry,
                resume=str(ckpt) if ckpt else "",
                attempt=self.attempt,
                reason=reason,
                skipped=resume.skipped if resume else {},
                data=self.data,
            )
        )
        self.actors.append(self.coordinator)
        await self._setup("coordinator", self.coordinator.start.remote(self.codec.encode_batch(opening)))
        return self.coordinator

    async def start_reward_workers(self) -> float:
        """The attempt's reward workers, each loaded and answering before any replica starts
        (a reward that cannot load is the run's setup error, naming it); seconds taken."""
        from shunter.actors import reward_workers as rewards

        t = self.cfg.task
        self.reward_pool = []
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
            self.actors.append(h)
            self.reward_pool.append(h)
        t0 = time.perf_counter()
        for i, h in enumerate(self.reward_pool):
            await self._setup(f"reward worker {i}", h.pid.remote())
        return time.perf_counter() - t0

    async def _setup(self, component: str, ref: Any, *, value: bool = False) -> Any:
        """Await an actor's setup (or start) call; its time (``value``: what it returned), or
        ``EngineSetupError`` with its cause."""
        timeout = self.cfg.run.timeout_s
        try:
            out = await asyncio.wait_for(ref, timeout)
            return out if value else float(out or 0.0)
        except TimeoutError:
            raise EngineSetupError(f"{component} did not finish setup within run.timeout_s = {timeout:g}s") from None
        except Exception as e:  # noqa: BLE001 - surface the actor's own error
            raise EngineSetupError(f"{component} failed to start: {root_cause(e)}") from e

    async def stop_attempt(self, *, keep_replicas: bool = False) -> None:
        """Kill every actor of the attempt; with ``keep_replicas`` (a restart, when
        ``run.restart_keeps_replicas``; the run's close, with a ``ReplicaPool``) the standalone
        replicas are left running for the next attempt to adopt (``adopt_kept``) — whichever of
        them still answers then — or for the pool (``park_in_pool``)."""
        import ray

        if self.coordinator is not None:
            try:
                await asyncio.wait_for(self.coordinator.close.remote(), 10)
            except Exception:  # noqa: BLE001 - it may be the one that died
                pass
        self.kept = {rid: x for rid, x in self.replicas.items() if keep_replicas and x[1] == STANDALONE}
        spared = [x[0] for x in self.kept.values()]
        for h in reversed(self.actors):
            if any(h is k for k in spared):
                continue
            try:
                ray.kill(h)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self.actors[:] = spared
        self.replicas = dict(self.kept)
        self.coordinator = None

    def _discard(self, h: Any) -> None:
        import ray

        try:
            ray.kill(h)
        except Exception:  # noqa: BLE001 - already gone
            pass
        if h in self.actors:
            self.actors.remove(h)
        self.replicas = {rid: x for rid, x in self.replicas.items() if x[0] is not h}
