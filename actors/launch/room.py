"""``Room``: whether a run's actors fit in the cluster and where each one goes — its placement
group (a config that asks for GPUs) or its plain resource request.

``Launcher`` makes it from the run's config and gives it to its ``RunSite`` (which reserves the
placement group at ``open`` and removes it at ``close``) and its ``ReplicaLauncher``. Invariants:
the cluster's total is checked before any actor is made (an attempt that can never be scheduled
is an ``EngineSetupError`` naming the config keys, not actors waiting for ever); with a placement
group every actor is placed in a bundle of it, and the bundle each component took is recorded
(``bundles``) for the event log.
"""

from __future__ import annotations

import os
from typing import Any

from shunter.actors.launch.cluster import check_total, on_node, request
from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.config.placement import Placement, replica_gpus
from shunter.events.vocab import STANDALONE, ReplicaKind


class Room:
    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.placer: Any = None  # actors.launch.placement.Placer when the config asks for GPUs
        self.bundles: dict[str, int] = {}  # component -> its placement-group bundle

    async def reserve(self, layout: Placement, name: str) -> None:
        """Reserve the placement plan ``layout`` as the placement groups ``name``."""
        from shunter.actors.launch.placement import Placer

        self.placer = Placer(layout, name)
        await self.placer.reserve(self.cfg.run.timeout_s)

    def release(self) -> None:
        """Remove the placement groups, if any were reserved."""
        if self.placer is not None:
            self.placer.remove()
            self.placer = None

    def knobs(self) -> dict[str, str]:
        """Resource -> the config keys that ask for it (for the error that names them)."""
        cfg = self.cfg
        ranks = f" x trainer.world_size ({cfg.trainer.world_size})" if cfg.trainer.world_size > 1 else ""
        out = {
            "CPU": f"trainer.num_cpus{ranks} + rollout.num_cpus per replica"
            + (" + task.reward_worker_cpus per reward worker" if cfg.task.reward_workers else "")
            + f"; a local cluster has run.num_cpus = {cfg.run.num_cpus or os.cpu_count()} CPUs",
            "GPU": f"trainer.num_gpus{ranks} + rollout.num_gpus per replica (rollout.tensor_parallel_size per "
            "standalone replica when above 1)",
        }
        for key, res in (("rollout.resources", cfg.rollout.resources), ("trainer.resources", cfg.trainer.resources)):
            for k in res:
                out[k] = key + (ranks if key.startswith("trainer") else "")
        return out

    def check(self, kinds: list[ReplicaKind]) -> None:
        """``EngineSetupError`` now, instead of actors Ray can never schedule (they would wait
        for ever): the cluster's total must cover the whole attempt."""
        cfg, r = self.cfg, self.cfg.rollout
        n = len(kinds)
        w = cfg.trainer.world_size  # each rank asks for the trainer's CPUs, GPUs and resources
        need = request(
            w * cfg.trainer.num_cpus + n * r.num_cpus + cfg.task.reward_workers * cfg.task.reward_worker_cpus,
            w * cfg.trainer.num_gpus + sum(replica_gpus(r, k == STANDALONE) for k in kinds),
        )
        for k, v in cfg.trainer.resources.items():
            need[k] = need.get(k, 0.0) + w * v
        for k, v in r.resources.items():
            need[k] = need.get(k, 0.0) + v * r.standalone_replicas
        check_total(need, "this run", self.knobs())

    def trainer_request(self) -> dict[str, float]:
        """What the trainer asks the cluster for (its CPUs, GPUs and ``trainer.resources``, for
        each of its ``trainer.world_size`` ranks)."""
        t = self.cfg.trainer
        w = t.world_size
        return request(w * t.num_cpus, w * t.num_gpus, {k: w * v for k, v in t.resources.items()})

    def options(
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
        if self.placer is None:
            out: dict[str, Any] = {"num_gpus": num_gpus, "num_cpus": num_cpus}
            if custom:
                out["resources"] = dict(custom)
            if node:
                out.update(on_node(node))
            return out
        self.bundles[component] = slot.bundle if slot is not None else -1
        return dict(self.placer.options(slot, num_gpus=num_gpus, num_cpus=num_cpus))
