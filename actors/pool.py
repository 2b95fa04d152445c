"""``ReplicaPool``: vLLM replicas that outlive a run, for the next runs in the same Ray cluster.

A vLLM engine takes 20 s to start on the 2-core CPU machine and minutes for a 7B model on a
GPU; a program that runs several runs one after another (a sweep, a notebook re-run, a test
suite) can keep the engines instead::

    pool = ReplicaPool()
    for cfg in configs:
        async with Engine(cfg, pool=pool) as engine:
            ...
    pool.close()

Invariants: a replica is in the pool only while no run holds it — ``take`` hands each out once
and a run gives back at its close the standalone replicas still alive, their work cut
(``RolloutWorker.park``); a run takes only replicas whose engine was started with its engine
settings (``key``: the model folder, ``rollout.max_model_len``, ``engine_args``, memory, sleep
mode, stream interval, weight transfer, CPU binding, and the resources they hold), and every
replica it takes loads the run's starting weights and takes the run's identity, reward,
environment and sampling settings (``RolloutWorker.adopt``) before it serves — so a run on
pooled replicas trains what it would on new ones, but for the sampler's random state, which a
pooled engine carries on from its earlier runs. ``close`` kills every replica the pool holds.

Where it works: the pool lives in the driver's process, its replicas in the Ray cluster the
caller started (``ray.init()`` or ``run.ray_address``): an ``Engine`` that would start and stop
Ray itself, or that places its actors in a placement group (GPU configs: the group, and the
actors in it, end with the run), refuses a pool at ``start()`` with an ``EngineSetupError``
that says so. A pooled replica keeps the actor name of the run that made it.
"""

from __future__ import annotations

import os
from typing import Any

Key = tuple[str, ...]
"""What a replica's engine was started with (``key``)."""


def key(model_dir: str, engine: dict[str, Any], resources: dict[str, Any]) -> Key:
    """The settings a replica's vLLM engine and actor were started with, as a comparable key;
    the model folder by its real path (a relative path or a link to the same files is the same
    model)."""
    return (os.path.realpath(model_dir), repr(sorted(engine.items())), repr(sorted(resources.items())))


class ReplicaPool:
    """Idle replicas between runs (module docstring). Not thread-safe: use it from one event loop."""

    def __init__(self) -> None:
        self._idle: list[tuple[Key, Any, str]] = []  # (key, actor handle, actor name)

    def __len__(self) -> int:
        return len(self._idle)

    def take(self, k: Key) -> tuple[Any, str] | None:
        """An idle replica started with ``k`` (handle, actor name), removed from the pool; None if none."""
        for i, (have, h, name) in enumerate(self._idle):
            if have == k:
                del self._idle[i]
                return h, name
        return None

    def give(self, k: Key, handle: Any, name: str) -> None:
        """A run's replica, its work cut, for a later run."""
        self._idle.append((k, handle, name))

    def close(self) -> None:
        """Kill every replica the pool holds (a replica a run holds now is the run's to end)."""
        import ray

        for _, h, _ in self._idle:
            try:
                ray.kill(h)
            except Exception:  # noqa: BLE001 - gone already
                pass
        self._idle.clear()
