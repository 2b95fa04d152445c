"""``RunSite``: what a run opens once, before its first attempt, and keeps over all its attempts —
the model folder, the run's dataset, Ray, the placement group (through its ``Room``) and the
run's registry.

``Launcher`` makes it with the run's config, id and folder, its ``Room``, the ``ReplicaPool`` if
any and the rows given as objects; the launcher's parts read ``model_dir``, ``data``,
``driver_node`` and ``registry`` once it is open. Invariants: the model folder and the dataset are
checked before Ray starts (a run that cannot start says why without touching the cluster); a
cluster to join has answered (``join.reach``, bounded) before ``ray.init`` joins it;
``close`` kills the registry, then removes the placement group, and shuts down Ray only if this
run started it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shunter.actors.launch.cluster import (
    NAMESPACE,
    RAY_SESSION,
    driver_node,
    init_ray,
    on_node,
    reap_orphans,
    shutdown_keeping_signal_handlers,
)
from shunter.actors.launch.join import reach
from shunter.actors.launch.room import Room
from shunter.engine.config.base import ConfigError
from shunter.engine.config.checks import check_heads
from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.io.errors import EngineSetupError
from shunter.engine.models.folder import check_model_dir


class RunSite:
    def __init__(
        self,
        cfg: EngineConfig,
        run_id: str,
        out_dir: Path,
        room: Room,
        *,
        pool: Any = None,
        train_data: Any = None,
        val_data: Any = None,
    ) -> None:
        """``pool``: the run's ``ReplicaPool`` (refused where the run would end its replicas);
        ``train_data`` / ``val_data``: rows given as objects instead of ``data.*_files``."""
        self.cfg, self.run_id, self.out_dir, self.room = cfg, run_id, out_dir, room
        self.pool, self.train_data, self.val_data = pool, train_data, val_data
        self.owns_ray = False
        self.registry: Any = None
        self.model_dir = ""
        self.data: Any = None
        """(training rows, validation prompts) of a run over a dataset, for each attempt's coordinator."""
        self.driver_node = ""  # Ray's id of this process's node (the run folder is on its disk)
        self.connecting = ""
        """The Ray address this run is reaching, while it does (nothing of the run exists yet)."""
        self.reaped: list[str] = []
        """Processes a killed earlier attempt of this run left running, ended at ``open``."""

    async def open(self) -> None:
        """Model, Ray, placement and the run's registry (they outlive attempts)."""
        from shunter.actors import registry_actor
        from shunter.engine.config.placement import plan

        self.model_dir = self._ensure_model()
        self.data = self._load_data()
        self.reaped = reap_orphans(self.out_dir / RAY_SESSION)
        await self._init_ray()
        self.out_dir.mkdir(
            parents=True, exist_ok=True
        )  # after the cluster answered: a run that never began leaves none
        if self.owns_ray and not self.cfg.run.ray_address:  # a cluster this run started, never one it joined
            import ray

            node = ray._private.worker._global_node
            if node is not None:
                (self.out_dir / RAY_SESSION).write_text(node.get_session_dir_path())
        else:  # a record an earlier start left (a joined cluster's, before this was fixed) is not ours to reap
            (self.out_dir / RAY_SESSION).unlink(missing_ok=True)
        layout = plan(self.cfg)
        if self.pool is not None and (self.owns_ray or layout is not None):
            why = "starts Ray itself" if self.owns_ray else "places its actors in a placement group (GPUs)"
            raise EngineSetupError(
                f"a ReplicaPool keeps replicas beyond the run, but this run {why}, which ends them with it: "
                "start Ray before the Engine (ray.init() or run.ray_address) and keep the pool to CPU "
                "replicas, or leave pool= out"
            )
        if layout is not None:
            await self.room.reserve(layout, f"shunter.{self.run_id}.placement")
        self.registry = (  # it writes into the run folder: on the driver's host
            registry_actor.remote_class()
            .options(name=registry_actor.registry_name(self.run_id), namespace=NAMESPACE, **on_node(self.driver_node))
            .remote(self.run_id, None, str(self.out_dir / "registry_actor.msgpack"))
        )

    def _load_data(self) -> Any:
        """The dataset (``data.train_files``), read and checked before anything starts."""
        if not self.cfg.data.train_files and self.train_data is None:
            return None
        from shunter.actors.launch.run_data import load_run_data
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
        model_dir = str(check_model_dir(m.path))
        try:  # a model built just now is checked here (one already there, when the config loaded)
            check_heads(self.cfg.rollout.tensor_parallel_size, model_dir)
        except ConfigError as e:
            raise EngineSetupError(str(e)) from None
        return model_dir

    async def _init_ray(self) -> None:
        import ray

        address = self.cfg.run.ray_address
        if address and not ray.is_initialized():
            self.connecting = address
            try:
                await reach(address, self.cfg.run.connect_timeout_s)
            finally:
                self.connecting = ""
        if init_ray(address, self.cfg.run.num_cpus):
            self.owns_ray = True
        self.driver_node = driver_node()

    def close(self) -> None:
        """Kill the registry, remove the placement group, and shut down Ray if this run started it
        (after the launcher stopped the last attempt)."""
        import ray

        if self.registry is not None:
            try:
                ray.kill(self.registry)
            except Exception:  # noqa: BLE001 - it may be gone already
                pass
            self.registry = None
        self.room.release()
        if self.owns_ray:
            shutdown_keeping_signal_handlers()
            self.owns_ray = False
