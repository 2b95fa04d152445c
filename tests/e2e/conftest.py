"""Session fixtures of the end-to-end tier: one tiny model shared by every test, and one
``ReplicaPool`` that the in-process runs take their standalone replicas from and give back to
(a vLLM engine start is ~26 CPU-seconds here, the most of what the tier does; the Ray cluster
comes from tests/conftest.py): ``replica_pool`` for tests that pass it, ``pooled`` for code run as a user
wrote it in the test process (snippets, examples, ``shunter.cli.main``). A ``shunter run`` in a process
of its own starts its own engines, as a user's does."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    from shunter.engine.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("models") / "sort-tiny", "sort_digits", seed=0, sft_steps=25))


@pytest.fixture(scope="session")
def replica_pool(ray_cluster):
    from shunter import ReplicaPool

    pool = ReplicaPool()
    yield pool
    pool.close()


@pytest.fixture
def pooled(replica_pool, monkeypatch):
    """Every ``Engine`` the test makes without a pool of its own takes its standalone replicas from
    the tier's ``ReplicaPool`` — for code the test runs as a user wrote it (a doc snippet, an
    example, ``shunter.cli.main`` in this process), whose engine starts are not what is tested (a
    pooled replica serves as a new one would: ``test_runs.py``)."""
    from shunter import Engine

    plain = Engine.__init__

    def init(self, *args, pool=None, **kw):
        plain(self, *args, pool=pool if pool is not None else replica_pool, **kw)

    monkeypatch.setattr(Engine, "__init__", init)
    return replica_pool
