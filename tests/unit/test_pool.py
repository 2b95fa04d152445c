"""``ReplicaPool`` (``shunter.actors.pool``): a replica is handed out once, and only to a run whose
engine settings are the ones it was started with."""

from __future__ import annotations

import shunter
from shunter.actors.pool import ReplicaPool, key

ENGINE = {"max_model_len": 256, "engine_args": {}, "cpu_bind": "nobind", "gpu_memory_utilization": 0.4}
CPU = {"num_cpus": 1, "num_gpus": 0}


def test_a_replica_goes_only_to_a_run_with_its_engine_settings_and_only_once():
    pool = ReplicaPool()
    k = key("/models/a", ENGINE, CPU)
    pool.give(k, "h1", "shunter.run-a.rollout.r0.g1")
    assert pool.take(key("/models/b", ENGINE, CPU)) is None  # another model
    assert pool.take(key("/models/a", {**ENGINE, "max_model_len": 512}, CPU)) is None  # another engine
    assert pool.take(key("/models/a", ENGINE, {**CPU, "num_cpus": 2})) is None  # other resources
    assert pool.take(key("/models/a", dict(reversed(ENGINE.items())), CPU)) == ("h1", "shunter.run-a.rollout.r0.g1")
    assert pool.take(k) is None and len(pool) == 0  # handed out once


def test_the_pool_is_part_of_the_public_api():
    assert shunter.ReplicaPool is ReplicaPool and "ReplicaPool" in shunter.__all__
