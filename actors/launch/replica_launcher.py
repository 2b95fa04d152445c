"""``ReplicaLauncher``: the replicas a ``Launcher`` makes — each registered for a rank and created
as a Ray actor (``new_replica``), or taken from the run's ``ReplicaPool`` or kept from the ended
attempt (``take_over``); placed (``placed``), announced (``replica_up``), and, when made mid-run,
started and handed to the coordinator (``bring_up``); at the run's close, given to the pool
(``park_in_pool``).

``Launcher`` makes it with the run's config, id and codec, its ``RunSite`` (the registry, the
model folder), its ``Room`` (room, placement), the ``Attempt`` in progress (the weights, reward
workers and trainer's node its replicas start with, its coordinator, the actors to kill), the
``ReplicaPool`` if any and the environment given as an object. Invariants: a replica is named by
the registry after its rank (``shunter.<run_id>.*`` in the ``shunter`` namespace); one added
mid-run fits in what the cluster has free or waits for room (``ReplicaPending``, once) up to
``rollout_worker.replacement_wait_s``; a replica that does not start is killed (it holds resources a
next try needs) and reported to the coordinator as ``ComponentFailed``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from shunter.actors.launch.attempt import Attempt, await_setup
from shunter.actors.launch.cluster import NAMESPACE, check_total, request, wait_for_room
from shunter.actors.launch.room import Room
from shunter.actors.launch.run_site import RunSite
from shunter.actors.pool import key as pool_key
from shunter.actors.wire import root_cause
from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.config.placement import replica_gpus
from shunter.engine.io.errors import EngineSetupError
from shunter.engine.replica.heartbeat import every_for
from shunter.events import Codec, ComponentFailed, ComponentPlaced, Message, ReplicaPending, ReplicaUp, ReplicaWaited
from shunter.events.vocab import HYBRID, ROLLOUT, STANDALONE, TRAINER, ReplicaKind, WaitOutcome


class ReplicaLauncher:
    def __init__(
        self,
        cfg: EngineConfig,
        run_id: str,
        codec: Codec,
        site: RunSite,
        room: Room,
        current: Attempt,
        *,
        pool: Any = None,
        environment: Any = None,
    ) -> None:
        """``pool``: the ``ReplicaPool`` standalone replicas are taken from and given back to;
        ``environment``: a class instead of ``task.environment``."""
        self.cfg, self.run_id, self.codec = cfg, run_id, codec
        self.site, self.room, self.current = site, room, current
        self.pool, self.environment = pool, environment
        self._made = 0
        self.replicas: dict[str, tuple[Any, ReplicaKind, int]] = {}
        """Every replica this launcher made: id -> (handle, kind, rank)."""
        self.kept: dict[str, tuple[Any, ReplicaKind, int]] = {}
        """Standalone replicas an ended attempt left running for the next one (``keep``)."""
        self.names: dict[str, str] = {}  # replica id -> its actor's name
        self._keys: dict[str, tuple[str, ...]] = {}  # replica id -> what its engine was started with
        self.pooled: dict[str, float] = {}  # taken from the pool, not yet announced -> seconds

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
                bundle=self.room.bundles.get(comp, -1),
                node=w.get("node", ""),
                node_id=w.get("node_id", ""),
                gpu_ids=w.get("gpu_ids", []),
                run_id=self.run_id,
                source="engine",
                wall_time=time.time(),
            )
            for comp, w in zip(actors, found, strict=True)
        ]

    def replica_up(
        self, rid: str, kind: ReplicaKind, rank: int, setup_s: float, *, mid_run: bool = False, adopted: bool = False
    ) -> ReplicaUp:
        return ReplicaUp(
            replica_id=rid,
            replica_kind=kind,
            rank=rank,
            mode=ROLLOUT if kind == STANDALONE else TRAINER,
            setup_s=setup_s,
            version=0 if mid_run else self.current.serve[1],
            adopted=adopted,
            run_id=self.run_id,
            source="engine",
            wall_time=time.time(),
        )

    async def take_over(
        self, wanted: int, attempt: int
    ) -> tuple[dict[str, tuple[Any, ReplicaKind, int, float]], list[Message]]:
        """A resumed attempt (number ``attempt``) takes up to ``wanted`` of the replicas the ended
        attempt kept (``adopt_kept``); the ranks the others held are free again, and the replicas
        made from now on are numbered past every one the registry has seen. Returns what
        ``adopt_kept`` does, with the ``RankReleased`` events of the freed ranks."""
        adopted, released = await self.adopt_kept(wanted, attempt)
        released += self.codec.decode_batch(
            await self.site.registry.release_all.remote("attempt over", keep=list(adopted))
        )
        self._made = max(self._made, await self.site.registry.generation.remote())
        return adopted, released

    async def adopt_kept(
        self, wanted: int, attempt: int
    ) -> tuple[dict[str, tuple[Any, ReplicaKind, int, float]], list[Message]]:
        """Take over, for attempt ``attempt``, up to ``wanted`` of the replicas the ended attempt
        left running (``keep``, at ``Launcher.stop_attempt(keep_replicas=True)``): each, still
        holding its rank, cuts what it was doing and loads the weights the attempt starts from
        (``Attempt.serve``) into its running engine (``RolloutWorker.adopt``) within
        ``run.timeout_s``. One whose rank is no longer its own (it died mid-run, and its rank went
        then) is killed; one that is dead, hung or fails the load is killed (it holds CPUs / GPUs
        a new replica needs) and its rank released with the reason; returns id -> (handle, kind,
        rank, seconds taken), and the ``RankReleased`` events of those not adopted."""
        kept, self.kept = list(self.kept.items()), {}
        if not kept:
            return {}, []
        model_dir, version = self.current.serve
        leases = {rid: rank for rid, _, rank, _ in await self.site.registry.leases.remote()}
        timeout = self.cfg.run.timeout_s

        async def adopt(rid: str, h: Any, rank: int) -> float:
            return float(await asyncio.wait_for(h.adopt.remote(version, model_dir, self.current.reward_pool), timeout))

        # a replica that died mid-run (its rank released then) is still in the list, ahead of the
        # replacement that took its place: only those still holding their rank are candidates
        chosen = [(rid, x) for rid, x in kept if leases.get(rid) == x[2]][:wanted]
        taken = {rid for rid, _ in chosen}
        for rid, (h, _, _) in kept:
            if rid not in taken:
                self._discard(h)  # dead, its rank gone, or more than the attempt wants
        took = await asyncio.gather(*(adopt(rid, h, rank) for rid, (h, _, rank) in chosen), return_exceptions=True)
        out: dict[str, tuple[Any, ReplicaKind, int, float]] = {}
        released: list[Message] = []
        for (rid, (h, kind, rank)), t in zip(chosen, took, strict=True):
            if isinstance(t, BaseException):
                released += await self._not_adopted(rid, h, t, f"not adopted by attempt {attempt}")
            else:
                out[rid] = (h, kind, rank, t)
        self.replicas.update({rid: (h, kind, rank) for rid, (h, kind, rank, _) in out.items()})
        return out, released

    async def new_replica(
        self, kind: ReplicaKind, *, mid_run: bool = False, replacing: str = ""
    ) -> tuple[str, Any, int, list[Message]]:
        """Register a replica (rank + actor name from the registry) and create its actor; one
        added ``mid_run`` must fit in what the cluster has free (outside the placement plan): it
        waits for room (``ReplicaPending`` to the coordinator, once) up to
        ``rollout_worker.replacement_wait_s`` — a lost node's capacity back, or a node added."""
        from shunter.actors import rollout_worker

        cfg = self.cfg
        custom = cfg.rollout.resources if kind == STANDALONE else {}
        node = self.current.trainer_node if kind == HYBRID else ""
        i = self._made
        self._made += 1
        rid = f"{kind}-{i}"
        # mid-run: the base model (a checkpoint's copy may be pruned by now); the coordinator
        # brings the replica to the current weights before it serves
        model_dir, version = (self.site.model_dir, 0) if mid_run else self.current.serve
        engine, resources = self._engine_settings(i), self._resources_of(kind)
        pooled, evs = await self._from_pool(rid, kind, engine, resources, model_dir, version)
        if pooled is not None:
            return (*pooled, evs)
        if mid_run and self.room.placer is None:  # with a placement plan, it may take a reserved bundle
            need = request(cfg.rollout.num_cpus, replica_gpus(cfg.rollout, kind == STANDALONE), custom)
            what = f"another {kind} replica" + (f" (replacing {replacing})" if replacing else "")
            check_total(need, what, self.room.knobs())

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
                await self._tell(pending)

            async def waited(outcome: WaitOutcome, seconds: float) -> None:
                await self._tell(
                    ReplicaWaited(
                        replica_kind=kind,
                        replacing=replacing,
                        outcome=outcome,
                        waited_s=seconds,
                        run_id=self.run_id,
                        source="engine",
                        wall_time=time.time(),
                    )
                )

            await wait_for_room(need, what, self.room.knobs(), cfg.rollout.replacement_wait_s, waiting, waited)
        rank, name, new_evs = await self.site.registry.register.remote(rid, kind)
        evs += self.codec.decode_batch(new_evs)
        slot = self.room.placer.replica_slot(rid, kind, name, NAMESPACE) if self.room.placer else None
        h = (
            rollout_worker.remote_class()
            .options(
                name=name,
                namespace=NAMESPACE,
                **self.room.options(
                    rid, slot, replica_gpus(cfg.rollout, kind == STANDALONE), cfg.rollout.num_cpus, custom, node
                ),
            )
            .remote(
                model_dir=model_dir,
                version=version,
                reward_pool=self.current.reward_pool,
                visible_gpus=self.room.placer.visible_gpus(slot) if self.room.placer else "",
                **self._serving(rid, kind, rank),
                **engine,
            )
        )
        self.current.actors.append(h)
        self.replicas[rid] = (h, kind, rank)
        self.names[rid], self._keys[rid] = name, pool_key(self.site.model_dir, engine, resources)
        return rid, h, rank, evs

    async def _tell(self, ev: ReplicaPending | ReplicaWaited) -> None:
        """A wait's start or end, to the coordinator of the attempt (it records it, the policy sees it)."""
        if self.current.coordinator is not None:
            await self.current.coordinator.ingest.remote(self.codec.encode_batch([ev]), "engine")

    # -- what a replica is started with ------------------------------------------------------
    def _engine_settings(self, i: int) -> dict[str, Any]:
        """The vLLM engine's settings (a pooled replica must have been started with the same)."""
        r = self.cfg.rollout
        return {
            "max_model_len": r.max_model_len,
            "engine_args": r.engine_args,
            "cpu_bind": r.cpu_bind[i % len(r.cpu_bind)] if r.cpu_bind else "nobind",
            "gpu_memory_utilization": r.gpu_memory_utilization,
            "enable_sleep_mode": r.enable_sleep_mode,
            "stream_interval": r.stream_interval,
            "weight_transfer": "ipc" if self.cfg.trainer.weight_transport == "vllm_ipc" else "",
            "tensor_parallel_size": r.tensor_parallel_size,
        }

    def _resources_of(self, kind: ReplicaKind) -> dict[str, Any]:
        r = self.cfg.rollout
        gpus = replica_gpus(r, kind == STANDALONE)
        return {"num_cpus": r.num_cpus, "num_gpus": gpus, **(r.resources if kind == STANDALONE else {})}

    def _serving(self, rid: str, kind: ReplicaKind, rank: int) -> dict[str, Any]:
        """What the run tells its replica besides the engine's settings (``RolloutWorker.SERVING``)."""
        cfg = self.cfg
        return {
            "run_id": self.run_id,
            "replica_id": rid,
            "reward": cfg.task.reward,
            "task": cfg.task.name,
            "mode": ROLLOUT if kind == STANDALONE else TRAINER,
            "seed": cfg.run.seed + rank,
            "max_tokens": cfg.rollout.max_tokens,
            "weight_update": cfg.rollout.weight_update,
            "import_paths": cfg.run.import_paths,
            "reward_timeout_s": cfg.task.reward_timeout_s,
            "reward_threads": cfg.task.reward_threads,
            "environment": self.environment or cfg.task.environment,
            "max_turns": cfg.task.max_turns,
            "env_timeout_s": cfg.task.env_timeout_s,
            "progress_every_s": every_for(cfg.rollout.generate_timeout_s),
        }

    # -- a ReplicaPool ---------------------------------------------------------------------
    async def _from_pool(
        self, rid: str, kind: ReplicaKind, engine: dict, resources: dict, model_dir: str, version: int
    ) -> tuple[tuple[str, Any, int] | None, list[Message]]:
        """A standalone replica from the run's ``ReplicaPool`` started with these settings, made
        this run's ``rid`` (a rank, the run's settings, ``model_dir``'s weights) — or None. One
        that does not answer within ``run.timeout_s`` or fails the load is killed and its rank
        released with the reason, and the next is tried."""
        evs: list[Message] = []
        if self.pool is None or kind != STANDALONE:
            return None, evs
        k = pool_key(self.site.model_dir, engine, resources)
        while (got := self.pool.take(k)) is not None:
            h, name = got
            rank, _, reg = await self.site.registry.register.remote(rid, kind, name)
            evs += self.codec.decode_batch(reg)
            try:
                ref = h.adopt.remote(version, model_dir, self.current.reward_pool, self._serving(rid, kind, rank))
                self.pooled[rid] = float(await asyncio.wait_for(ref, self.cfg.run.timeout_s))
            except Exception as e:  # noqa: BLE001 - dead, hung or failed: a new one instead
                evs += await self._not_adopted(rid, h, e, "pooled, not adopted")
                continue
            self.current.actors.append(h)
            self.replicas[rid], self.names[rid], self._keys[rid] = (h, kind, rank), name, k
            return (rid, h, rank), evs
        return None, evs

    async def _not_adopted(self, rid: str, h: Any, error: BaseException, what: str) -> list[Message]:
        """A replica that failed its adoption: killed (it holds CPUs / GPUs a new replica needs)
        and its rank released, the reason saying why; the ``RankReleased`` events."""
        self._discard(h)
        why = "did not answer" if isinstance(error, TimeoutError) else root_cause(error)
        return self.codec.decode_batch(await self.site.registry.release.remote(rid, f"{what}: {why}"))

    def start_call(self, rid: str, h: Any) -> Any:
        """What to await for the replica ``new_replica`` made: its engine start, or (one taken
        from the pool, adopted already) the seconds its adoption took."""
        if rid in self.pooled:
            took = self.pooled.pop(rid)

            async def done() -> float:
                return took

            return done()
        return h.setup.remote()

    async def park_in_pool(self) -> None:
        """At the run's close: each standalone replica still alive stops serving (``park``) and
        goes to the pool; one that does not answer within 30 s is killed."""
        for rid, (h, kind, _) in list(self.replicas.items()):
            if kind != STANDALONE or self.pool is None:
                continue
            try:
                await asyncio.wait_for(h.park.remote(), 30)
            except Exception:  # noqa: BLE001 - dead or hung: not for a later run
                self._discard(h)
                continue
            self.pool.give(self._keys[rid], h, self.names[rid])
            self.current.actors.remove(h)
            del self.replicas[rid]

    async def bring_up(self, rid: str, h: Any, kind: ReplicaKind, rank: int, opening: list[Message]) -> ReplicaUp:
        """Start a replica made mid-run and announce it to the coordinator (``ComponentFailed``
        to the coordinator and ``EngineSetupError`` here if it does not start)."""
        pooled = rid in self.pooled
        try:
            setup_s = await await_setup(rid, self.start_call(rid, h), self.cfg.run.timeout_s)
        except EngineSetupError as e:
            self._discard(h)  # it holds CPUs / GPUs a next try needs
            failed = ComponentFailed(
                component=rid, error=str(e), run_id=self.run_id, source="engine", wall_time=time.time()
            )
            await self.current.coordinator.ingest.remote(self.codec.encode_batch([failed]), "engine")
            raise
        up = self.replica_up(rid, kind, rank, setup_s, mid_run=True, adopted=pooled)
        opening = [*opening, *await self.placed({rid: h}), up]
        await self.current.coordinator.add_replica.remote(rid, h, self.codec.encode_batch(opening))
        return up

    def keep(self, keep_replicas: bool) -> list[Any]:
        """An attempt stops: with ``keep_replicas`` its standalone replicas are kept for the next
        attempt (``adopt_kept``) or the pool (``park_in_pool``), the others forgotten; returns the
        handles of those kept (the actors not to kill)."""
        self.kept = {rid: x for rid, x in self.replicas.items() if keep_replicas and x[1] == STANDALONE}
        self.replicas = dict(self.kept)
        return [x[0] for x in self.kept.values()]

    def _discard(self, h: Any) -> None:
        import ray

        try:
            ray.kill(h)
        except Exception:  # noqa: BLE001 - already gone
            pass
        if h in self.current.actors:
            self.current.actors.remove(h)
        self.replicas = {rid: x for rid, x in self.replicas.items() if x[0] is not h}
