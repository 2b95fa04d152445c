"""Reserves a run's placement plan (``engine.placement``) as one Ray placement group and
hands out the Ray options of each actor.

Invariant: a standalone slot is held by at most one live replica — a replacement takes the
slot of one that is gone; a replica beyond the plan (elastic growth) is scheduled outside the
group, by its plain resource request. The group outlives restarts of the run's attempts
(their actors are killed, the reservation stays) and is removed by :meth:`Placer.remove`.
"""

from __future__ import annotations

import asyncio

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from shunter.engine.placement import Placement, Slot


class PlacementError(RuntimeError):
    pass


class Placer:
    def __init__(self, plan: Placement, name: str) -> None:
        self.plan, self.name = plan, name
        self.pg = None
        self._owners: dict[tuple[str, int], tuple[str, str]] = {}  # (kind, slot index) -> (replica id, actor name)

    async def reserve(self, timeout_s: float) -> None:
        if self.pg is not None:
            return
        self.pg = placement_group(self.plan.bundles, strategy="PACK", name=self.name)
        try:
            await asyncio.wait_for(self.pg.ready(), timeout_s)
        except TimeoutError:
            remove_placement_group(self.pg)
            self.pg = None
            raise PlacementError(
                f"the cluster could not reserve {self.plan.bundles} (trainer bundle first, then one "
                f"GPU per standalone replica) within {timeout_s:g}s; it has "
                f"{ray.available_resources()} free"
            ) from None

    def options(self, slot: Slot | None, *, num_gpus: float, num_cpus: float) -> dict:
        if slot is None or self.pg is None:
            return {"num_gpus": num_gpus, "num_cpus": num_cpus}
        return {
            "num_gpus": slot.num_gpus,
            "num_cpus": slot.num_cpus,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=slot.bundle),
        }

    def trainer_slot(self) -> Slot:
        return self.plan.trainer

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
        if self.pg is not None:
            remove_placement_group(self.pg)
            self.pg = None


def _alive(actor_name: str, namespace: str) -> bool:
    try:
        ray.get_actor(actor_name, namespace=namespace)
        return True
    except ValueError:
        return False


def where() -> dict:
    """Inside an actor: its node and the GPUs Ray gave it."""
    return {"node": ray.util.get_node_ip_address(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}
