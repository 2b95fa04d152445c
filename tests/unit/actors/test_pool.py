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


def test_a_model_folder_is_the_same_model_by_any_path_to_it(tmp_path, monkeypatch):
    """A run of the README's config names ``.shunter/models/sort-tiny`` (relative, perhaps a link
    to a model built elsewhere): a replica started from the real folder serves it."""
    real = tmp_path / "models" / "sort-tiny"
    real.mkdir(parents=True)
    (tmp_path / "work" / ".shunter" / "models").mkdir(parents=True)
    (tmp_path / "work" / ".shunter" / "models" / "sort-tiny").symlink_to(real)
    monkeypatch.chdir(tmp_path / "work")
    pool = ReplicaPool()
    pool.give(key(str(real), ENGINE, CPU), "h1", "n1")
    assert pool.take(key(".shunter/models/sort-tiny", ENGINE, CPU)) == ("h1", "n1")
    pool.give(key(str(real), ENGINE, CPU), "h1", "n1")
    other = tmp_path / "models" / "sort-tiny-copy"
    other.mkdir()
    assert pool.take(key(str(other), ENGINE, CPU)) is None  # other files: another model
