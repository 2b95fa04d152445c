"""The launcher and the cluster (``Launcher``'s part): the model folder, Ray, the placement group
and the run's registry, which a run opens once and which outlive its attempts; the room an
attempt needs; the Ray options that place each actor.

``LauncherCluster`` is a mixin of ``shunter.actors.launch.launcher.Launcher`` (``Launcher.__init__`` sets
the state its methods use). Invariants: the cluster's total is checked before any actor is made
(an attempt that can never be scheduled is an ``EngineSetupError`` naming the config keys, not
actors waiting for ever); ``close`` stops the attempt, then kills the registry and removes the
placement group, and shuts down Ray only if this launcher started it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from shunter.actors.launch.cluster import (
    NAMESPACE,
    RAY_SESSION,
    check_total,
    driver_node,
    init_ray,
    on_node,
    reap_orphans,
    request,
    shutdown_keeping_signal_handlers,
)
from shunter.engine.io.errors import EngineSetupError
from shunter.engine.models.folder import check_model_dir
from shunter.events.vocab import ReplicaKind


class LauncherCluster:
    """``Launcher``'s cluster: open / close, room, placement options (a mixin)."""

    # -- the cluster ---------------------------------------------------------------------
    async def open(self) -> None:
        """Model, Ray, placement and the run's registry (they outlive attempts)."""
        from shunter.actors import registry
        from shunter.engine.config.placement import plan

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
        if self.pool is not None and (self.owns_ray or layout is not None):
            why = "starts Ray itself" if self.owns_ray else "places its actors in a placement group (GPUs)"
            raise EngineSetupError(
                f"a ReplicaPool keeps replicas beyond the run, but this run {why}, which ends them with it: "
                "start Ray before the Engine (ray.init() or run.ray_address) and keep the pool to CPU "
                "replicas, or leave pool= out"
            )
        if layout is not None:
            from shunter.actors.launch.placement import Placer

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
        from shunter.engine.data.files import DataError

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
            from shunter.engine.models.tiny import build_tiny_model

            build_tiny_model(path, m.build_tiny, seed=self.cfg.run.seed, sft_steps=m.sft_steps, preset=m.preset)
        return str(check_model_dir(m.path))

    def _init_ray(self) -> None:
        if init_ray(self.cfg.run.ray_address, self.cfg.run.num_cpus):
            self.owns_ray = True
        self.driver_node = driver_node()

    async def close(self) -> None:
        import ray

        await self.stop_attempt(keep_replicas=self.pool is not None)
        if self.pool is not None:
            await self.park_in_pool()
            await self.stop_attempt()  # what did not go to the pool
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
