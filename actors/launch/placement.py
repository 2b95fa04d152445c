"""Reserves a run's placement plan (``engine.config.placement``) as Ray placement groups — the
trainer's side on one node (``STRICT_PACK``), the standalone replicas' laid over the nodes by
``rollout.placement_strategy`` — and hands out the Ray options of each actor.

Invariant: a standalone slot is held by at most one live replica — a replacement takes the
slot of one that is gone; a replica beyond the plan (elastic growth) is scheduled outside the
groups, by its plain resource request. The groups outlive restarts of the run's attempts
(their actors are killed, the reservation stays) and are removed by :meth:`Placer.remove`. A
node lost takes its bundles with it; Ray lays them again where room is left, and a
replacement placed in such a bundle waits until it is. A tensor-parallel standalone replica's
actor takes its whole bundle of ``rollout.tensor_parallel_size`` GPUs (a bundle no node can hold
is refused before anything is reserved: :func:`check_nodes`); a tensor-parallel hybrid replica's
actor holds Ray's share of the first GPU of its span, and is shown the span's GPUs
(:meth:`Placer.visible_gpus`, found once by a probe in each trainer-side bundle).
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
        self.side_gpus: list[str] = []  # the node's GPU id each trainer-side bundle holds (hybrid TP spans)

    async def reserve(self, timeout_s: float) -> None:
        if self.pgs:
            return
        check_nodes(self.plan, [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")])
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
        if any(slot.gpus > 1 for slot in self.plan.hybrid):
            self.side_gpus = await self._side_gpus()

    async def _side_gpus(self) -> list[str]:
        """The GPU id (on the trainer's node) of each trainer-side bundle, asked of a probe placed
        in each before any actor takes them — a hybrid replica of tensor_parallel_size T holds
        Ray's share of its first GPU only (an actor lies in one bundle), and its vLLM workers
        are shown the T GPUs of its span (``visible_gpus``)."""

        def gpu() -> str:
            return str(ray.get_gpu_ids()[0])

        probe = ray.remote(num_cpus=0, num_gpus=1e-4)(gpu)
        refs = [
            probe.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.pgs[0], placement_group_bundle_index=i)
            ).remote()
            for i in range(self.plan.trainer_bundles)
        ]
        return [str(g) for g in await asyncio.gather(*refs)]

    def visible_gpus(self, slot: Slot | None) -> str:
        """``CUDA_VISIBLE_DEVICES`` for a hybrid replica spanning several trainer-side GPUs ("" for
        any other: Ray's own setting, its bundle's GPUs, is right)."""
        if slot is None or slot.gpus <= 1 or slot.bundle >= self.plan.trainer_bundles or not self.side_gpus:
            return ""
        return ",".join(self.side_gpus[slot.bundle : slot.bundle + slot.gpus])

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


def check_nodes(plan: Placement, nodes: list[dict[str, float]]) -> None:
    """A bundle lies on one node: a bundle of more GPUs than any node of the cluster has (a
    tensor-parallel replica's, ``rollout.tensor_parallel_size``) is refused now, naming the field,
    instead of a reservation that waits for ever."""
    most = max((n.get("GPU", 0.0) for n in nodes), default=0.0)
    wide = max((b.get("GPU", 0.0) for b in plan.bundles[plan.trainer_bundles :]), default=0.0)
    if wide > most:
        raise PlacementError(
            f"rollout.tensor_parallel_size = {wide:g}: a standalone replica's GPUs must be on one node, and the "
            f"largest node of the cluster has {most:g} — lower it, or add a node with {wide:g} GPUs"
        )


def _alive(actor_name: str, namespace: str) -> bool:
    try:
        ray.get_actor(actor_name, namespace=namespace)
        return True
    except ValueError:
        return False


def where() -> dict:
    """Inside an actor: its node (address and Ray's node id), the GPUs Ray gave it and its
    process id (the parent of a replica's vLLM processes)."""
    import os

    return {
        "pid": os.getpid(),
        "node": ray.util.get_node_ip_address(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
    }
