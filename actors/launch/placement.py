"""Reserves a run's placement plan (``engine.config.placement``) as Ray placement groups — the
trainer's side on one node (``STRICT_PACK``), the standalone replicas' laid over the nodes by
``rollout.placement_strategy`` — and hands out the Ray options of each actor.

Invariant: a standalone slot is held by at most one live replica — a replacement takes the
slot of one that is gone; a replica beyond the plan (elastic growth) is scheduled outside the
groups, by its plain resource request. The groups outlive restarts of the run's attempts
(their actors are killed, the reservation stays) and are removed by :meth:`Placer.remove`. A
node lost takes its bundles with it; Ray lays them again where room is left, and a
replacement placed in such a bundle waits until it is.
"""

from __future__ import annotations

import asyncio

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from shunter.engine.config.placement import Placement, Slot
from shunter.engine.io.errors import secs


class PlacementError(RuntimeError):
    pass


class Placer:
    def __init__(self, plan: Placement, name: str) -> None:
        self.plan, self.name = plan, name
        self.pgs: list = []
        self._owners: dict[tuple[str, int], tuple[str, str]] = {}  # (kind, slot index) -> (replica id, actor name)

    async def reserve(self, timeout_s: float) -> None:
        if self.pgs:
            return
        groups = self.plan.groups()
        self.pgs = [
            placement_group(bundles, strategy=strategy, name=f"{self.name}.{i}")
            for i, (bundles, strategy) in enumerate(groups)
        ]
        try:
            await asyncio.wait_for(asyncio.gather(*(pg.ready() for pg in self.pgs)), timeout_s)
        except TimeoutError:
            self.remove()
            what = "; ".join(f"{strategy} {bundles}" for bundles, strategy in groups)
            raise PlacementError(
                f"the cluster could not reserve {what} (the trainer's side on one node, then one GPU "
                f"per standalone replica) within {secs(timeout_s)}s; it has {ray.available_resources()} free"
            ) from None

    def options(self, slot: Slot | None, *, num_gpus: float, num_cpus: float) -> dict:
        if slot is None or not self.pgs:
            return {"num_gpus": num_gpus, "num_cpus": num_cpus}
        group, index = self.plan.locate(slot.bundle)
        return {
            "num_gpus": slot.num_gpus,
            "num_cpus": slot.num_cpus,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                self.pgs[group], placement_group_bundle_index=index
            ),
        }

    def trainer_slot(self, rank: int = 0) -> Slot:
        return self.plan.ranks[rank] if self.plan.ranks else self.plan.trainer

    def replica_slot(self, replica_id: str, kind: str, actor_name: str, namespace: str) -> Slot | None:
        """The slot for a new replica: a slot of its kind whose last holder is gone (hybrid
        slots are on the trainer's GPUs); None when every one is held."""
        slots = self.plan.standalone if kind == "standalone" else self.plan.hybrid
        for i, slot in enumerate(slots):
            owner = self._owners.get((kind, i))
            if owner is None or not _alive(owner[1], namespace):
                self._owners[(kind, i)] = (replica_id, actor_name)
                return slot
        return None

    def remove(self) -> None:
        for pg in self.pgs:
            remove_placement_group(pg)
        self.pgs = []


def _alive(actor_name: str, namespace: str) -> bool:
    try:
        ray.get_actor(actor_name, namespace=namespace)
        return True
    except ValueError:
        return False


def where() -> dict:
    """Inside an actor: its node (address and Ray's node id) and the GPUs Ray gave it."""
    return {
        "node": ray.util.get_node_ip_address(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
    }
