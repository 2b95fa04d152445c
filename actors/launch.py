"""``Launcher``: creates, places and removes the actors of one run attempt.

Invariants: every actor of a run is named ``shunter.<run_id>.*`` in the ``shunter`` namespace
(replicas by the name the registry gave their rank), so re-runs and concurrent runs in one
cluster never collide on a name; every actor the launcher made is killed by
:meth:`stop_attempt`; a component that does not start raises ``EngineSetupError`` naming it
and its own cause; every actor gets ``run.import_paths`` so the user's code resolves alike in
every process.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import msgspec

from shunter.actors.cluster import (  # noqa: F401 - local_only & co. are imported from here too
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
from shunter.actors.wire import root_cause
from shunter.engine.checkpoint import Found
from shunter.engine.config import EngineConfig
from shunter.engine.errors import EngineSetupError
from shunter.engine.heartbeat import every_for
from shunter.engine.model_dir import check_model_dir
from shunter.events import (
    Codec,
    ComponentFailed,
    ComponentPlaced,
    ComponentReady,
    Message,
    ReplicaPending,
    ReplicaUp,
)
from shunter.events.vocab import HYBRID, ROLLOUT, STANDALONE, TRAINER, ReplicaKind


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
    ) -> None:
        """``train_data`` / ``val_data``: rows given as objects instead of ``data.*_files``;
        ``environment``: a class instead of ``task.environment`` (``Engine``'s arguments)."""
        self.cfg, self.run_id, self.out_dir = cfg, run_id, out_dir
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

    # -- the cluster ---------------------------------------------------------------------
    async def open(self) -> None:
        """Model, Ray, placement and the run's registry (they outlive attempts)."""
        from shunter.actors import registry
        from shunter.engine.placement import plan

        self.model_dir = self._ensure_model()
        self.data = self._load_data()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.reaped = reap_orphans(self.out_dir / RAY_SESSION)
        self._init_ray()
        if self.owns_ray:
            import ray

            node = ray._private.worker._global_node
            if node is not None:
                (self.out_dir / RAY_SESSION).write_text(node.get_session_dir_path())
        layout = plan(self.cfg)
        if layout is not None:
            from shunter.actors.placement import Placer

            self._placer = Placer(layout, f"shunter.{self.run_id}.placement")
            await self._placer.reserve(self.cfg.run.timeout_s)
        self.registry = (  # it writes into the run folder: on the driver's host
            registry.remote_class()
            .options(name=registry.registry_name(self.run_id), namespace=NAMESPACE, **on_node(self.driver_node))
            .remote(self.run_id, None, str(self.out_dir / "registry.msgpack"))
        )

    def _load_data(self) -> Any:
        """The dataset (``data.train_files``), read and checked before anything starts."""
        if not self.cfg.data.train_files and self.train_data is None:
            return None
        from shunter.actors.coordinator import load_run_data
        from shunter.engine.datasets import DataError

        try:
            return load_run_data(self.cfg, self.model_dir, self.train_data, self.val_data)
        except DataError as e:
            raise EngineSetupError(f"the dataset cannot be used: {e}") from None

    def _ensure_model(self) -> str:
        m = self.cfg.model
        path = Path(m.path)
        # a tiny model this engine built (its marker file) is rebuilt when its build settings
        # changed (another model.sft_steps, say); a folder without one (a user's model) is never touched
        if m.build_tiny and (not (path / "config.json").is_file() or (path / "shunter_model.json").is_file()):
            from shunter.engine.tiny_model import build_tiny_model

            build_tiny_model(path, m.build_tiny, seed=self.cfg.run.seed, sft_steps=m.sft_steps, preset=m.preset)
        return str(check_model_dir(m.path))

    def _init_ray(self) -> None:
        if init_ray(self.cfg.run.ray_address, self.cfg.run.num_cpus):
            self.owns_ray = True
        self.driver_node = driver_node()

    async def close(self) -> None:
        import ray

        await self.stop_attempt()
        if self.registry is not None:
            try:
                ray.kill(self.registry)
            except Exception:  # noqa: BLE001 - it may be gone already
                pass
            self.registry = None
        if self._placer is not None:
            self._placer.remove()
            self._placer = None
        if self.owns_ray:
            shutdown_keeping_signal_handlers()
            self.owns_ray = False

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
        if resume is not None:  # ranks held by replicas of an earlier attempt are free again
            opening += self.codec.decode_batch(await self.registry.release_all.remote("attempt over"))
            self._made = max(self._made, await self.registry.generation.remote())
            self.serve = (str(resume[0] / "model"), resume[1].version)
        else:
            self.serve = (self.model_dir, 0)
        r = cfg.rollout
        kinds: list[ReplicaKind] = [STANDALONE] * r.standalone_replicas + [HYBRID] * r.hybrid_replicas
        if self._placer is None:  # a placement group reserved its room already
            self._check_room(kinds)
        rewards_s = await self.start_reward_workers()
        opening += [
            ComponentReady(
                component=f"reward-{i}", setup_s=rewards_s, run_id=self.run_id, source="engine", wall_time=time.time()
            )
            for i in range(len(self.reward_pool))
        ]
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
        setups = {"trainer": tr.setup.remote(), **{rid: h.setup.remote() for rid, (h, _, _) in replicas.items()}}
        times = {comp: await self._setup(comp, ref) for comp, ref in setups.items()}
        now = time.time()
        opening += [
            ComponentReady(component=comp, setup_s=t, run_id=self.run_id, source="engine", wall_time=now)
            for comp, t in times.items()
        ]
        opening += await self.placed({"trainer": tr, **{rid: h for rid, (h, _, _) in replicas.items()}})
        for rid, (_, kind, rank) in replicas.items():
            opening.append(self.replica_up(rid, kind, rank, times[rid]))
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
        from shunter.actors import rewards

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

    async def stop_attempt(self) -> None:
        import ray

        if self.coordinator is not None:
            try:
                await asyncio.wait_for(self.coordinator.close.remote(), 10)
            except Exception:  # noqa: BLE001 - it may be the one that died
                pass
        for h in reversed(self.actors):
            try:
                ray.kill(h)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self.actors.clear()
        self.coordinator = None

    def _discard(self, h: Any) -> None:
        import ray

        try:
            ray.kill(h)
        except Exception:  # noqa: BLE001 - already gone
            pass
        if h in self.actors:
            self.actors.remove(h)

    def _knobs(self) -> dict[str, str]:
        """Resource -> the config keys that ask for it (for the error that names them)."""
        cfg = self.cfg
        out = {
            "CPU": "trainer.num_cpus + rollout.num_cpus per replica"
            + (" + task.reward_worker_cpus per reward worker" if cfg.task.reward_workers else "")
            + f"; a local cluster has run.num_cpus = {cfg.run.num_cpus or os.cpu_count()} CPUs",
            "GPU": "trainer.num_gpus + rollout.num_gpus per replica",
        }
        for key, res in (("rollout.resources", cfg.rollout.resources), ("trainer.resources", cfg.trainer.resources)):
            for k in res:
                out[k] = key
        return out

    def _check_room(self, kinds: list[ReplicaKind]) -> None:
        """``EngineSetupError`` now, instead of actors Ray can never schedule (they would wait
        for ever): the cluster's total must cover the whole attempt."""
        cfg, r = self.cfg, self.cfg.rollout
        n = len(kinds)
        need = request(
            cfg.trainer.num_cpus + n * r.num_cpus + cfg.task.reward_workers * cfg.task.reward_worker_cpus,
            cfg.trainer.num_gpus + n * r.num_gpus,
        )
        for k, v in cfg.trainer.resources.items():
            need[k] = need.get(k, 0.0) + v
        for k, v in r.resources.items():
            need[k] = need.get(k, 0.0) + v * r.standalone_replicas
        check_total(need, "this run", self._knobs())

    # -- replicas ------------------------------------------------------------------------
    def _resources(
        self,
        component: str,
        slot: Any,
        num_gpus: float,
        num_cpus: float,
        custom: dict[str, float] | None = None,
        node: str = "",
    ) -> dict[str, Any]:
        """Ray options: a placement bundle (GPU configs), or the plain request — its custom
        resources (``trainer.resources`` / ``rollout.resources``) pick the nodes; ``node`` pins it
        (a hybrid replica beside the trainer)."""
        if self._placer is None:
            out: dict[str, Any] = {"num_gpus": num_gpus, "num_cpus": num_cpus}
            if custom:
                out["resources"] = dict(custom)
            if node:
                out.update(on_node(node))
            return out
        self._slots[component] = slot.bundle if slot is not None else -1
        return dict(self._placer.options(slot, num_gpus=num_gpus, num_cpus=num_cpus))

    async def placed(self, actors: dict[str, Any]) -> list[ComponentPlaced]:
        """Where each actor landed (bundle, node, GPU ids), for the event log (asked of all at once)."""

        async def where(h: Any) -> dict[str, Any]:
            try:
                return dict(await asyncio.wait_for(h.where.remote(), 30))
            except Exception:  # noqa: BLE001 - informational only
                return {}

        found = await asyncio.gather(*(where(h) for h in actors.values()))
        return [
            ComponentPlaced(
                component=comp,
                bundle=self._slots.get(comp, -1),
                node=w.get("node", ""),
                node_id=w.get("node_id", ""),
                gpu_ids=w.get("gpu_ids", []),
                run_id=self.run_id,
                source="engine",
                wall_time=time.time(),
            )
            for comp, w in zip(actors, found, strict=True)
        ]

    def replica_up(self, rid: str, kind: ReplicaKind, rank: int, setup_s: float, *, mid_run: bool = False) -> ReplicaUp:
        return ReplicaUp(
            replica_id=rid,
            replica_kind=kind,
            rank=rank,
            mode=ROLLOUT if kind == STANDALONE else TRAINER,
            setup_s=setup_s,
            version=0 if mid_run else self.serve[1],
            run_id=self.run_id,
            source="engine",
            wall_time=time.time(),
        )

    async def new_replica(
        self, kind: ReplicaKind, *, mid_run: bool = False, replacing: str = ""
    ) -> tuple[str, Any, int, list[Message]]:
        """Register a replica (rank + actor name from the registry) and create its actor; one
        added ``mid_run`` must fit in what the cluster has free (outside the placement plan): it
        waits for room (``ReplicaPending`` to the coordinator, once) up to
        ``rollout.replacement_wait_s`` — a lost node's capacity back, or a node added."""
        from shunter.actors import rollout

        cfg = self.cfg
        custom = cfg.rollout.resources if kind == STANDALONE else {}
        node = self.trainer_node if kind == HYBRID else ""
        if mid_run and self._placer is None:  # with a placement plan, it may take a reserved bundle
            need = request(cfg.rollout.num_cpus, cfg.rollout.num_gpus, custom)
            what = f"another {kind} replica" + (f" (replacing {replacing})" if replacing else "")
            check_total(need, what, self._knobs())

            async def waiting(short: dict[str, float], free: dict[str, float]) -> None:
                pending = ReplicaPending(
                    replica_kind=kind,
                    replacing=replacing,
                    missing=short,
                    free=free,
                    deadline_s=cfg.rollout.replacement_wait_s,
                    run_id=self.run_id,
                    source="engine",
                    wall_time=time.time(),
                )
                if self.coordinator is not None:
                    await self.coordinator.ingest.remote(self.codec.encode_batch([pending]), "engine")

            await wait_for_room(need, what, self._knobs(), cfg.rollout.replacement_wait_s, waiting)
        i = self._made
        self._made += 1
        rid = f"{kind}-{i}"
        rank, name, evs = await self.registry.register.remote(rid, kind)
        binds = cfg.rollout.cpu_bind
        # mid-run: the base model (a checkpoint's copy may be pruned by now); the coordinator
        # brings the replica to the current weights before it serves
        model_dir, version = (self.model_dir, 0) if mid_run else self.serve
        slot = self._placer.replica_slot(rid, kind, name, NAMESPACE) if self._placer else None
        h = (
            rollout.remote_class()
            .options(
                name=name,
                namespace=NAMESPACE,
                **self._resources(rid, slot, cfg.rollout.num_gpus, cfg.rollout.num_cpus, custom, node),
            )
            .remote(
                self.run_id,
                rid,
                model_dir,
                reward=cfg.task.reward,
                task=cfg.task.name,
                reward_timeout_s=cfg.task.reward_timeout_s,
                reward_threads=cfg.task.reward_threads,
                environment=self.environment or cfg.task.environment,
                max_turns=cfg.task.max_turns,
                env_timeout_s=cfg.task.env_timeout_s,
                reward_pool=self.reward_pool,
                progress_every_s=every_for(cfg.rollout.generate_timeout_s),
                version=version,
                mode=ROLLOUT if kind == STANDALONE else TRAINER,
                seed=cfg.run.seed + rank,
                max_model_len=cfg.rollout.max_model_len,
                max_tokens=cfg.rollout.max_tokens,
                engine_args=cfg.rollout.engine_args,
                cpu_bind=binds[i % len(binds)] if binds else "nobind",
                gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
                enable_sleep_mode=cfg.rollout.enable_sleep_mode,
                stream_interval=cfg.rollout.stream_interval,
                weight_transfer="ipc" if cfg.trainer.weight_transport == "vllm_ipc" else "",
                weight_update=cfg.rollout.weight_update,
                import_paths=cfg.run.import_paths,
            )
        )
        self.actors.append(h)
        return rid, h, rank, self.codec.decode_batch(evs)

    async def bring_up(self, rid: str, h: Any, kind: ReplicaKind, rank: int, opening: list[Message]) -> ReplicaUp:
        """Start a replica made mid-run and announce it to the coordinator (``ComponentFailed``
        to the coordinator and ``EngineSetupError`` here if it does not start)."""
        try:
            setup_s = await self._setup(rid, h.setup.remote())
        except EngineSetupError as e:
            self._discard(h)  # it holds CPUs / GPUs a next try needs
            failed = ComponentFailed(
                component=rid, error=str(e), run_id=self.run_id, source="engine", wall_time=time.time()
            )
            await self.coordinator.ingest.remote(self.codec.encode_batch([failed]), "engine")
            raise
        up = self.replica_up(rid, kind, rank, setup_s, mid_run=True)
        opening = [*opening, *await self.placed({rid: h}), up]
        await self.coordinator.add_replica.remote(rid, h, self.codec.encode_batch(opening))
        return up
