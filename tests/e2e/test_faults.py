"""Issue 4, item 1 with real actors: a vLLM replica killed mid-run (``ray.kill``); its samples
resume on the live replica, its rank is released, the run completes with every group
accounted for once."""

from __future__ import annotations

import asyncio

import pytest
from test_runs import config

from shunter import Engine
from shunter.events import RankAssigned, RankReleased, ReplicaDown, RunEnded, SampleAborted, StepEnd

pytestmark = pytest.mark.e2e


async def test_a_killed_replica_loses_no_sample_and_releases_its_rank(ray_cluster, tiny_model, tmp_path):
    cfg = config(tiny_model, tmp_path, run={"total_steps": 24}, validation={"every": 0},
                 rollout={"standalone_replicas": 2, "max_staleness": 1, "max_tokens": 12})
    events = []
    async with asyncio.timeout(400):
        async with Engine(cfg) as engine:
            names = {}
            async for ev in engine.events():
                events.append(ev)
                if isinstance(ev, RankAssigned):
                    names[ev.replica_id] = ev.actor_name
                if isinstance(ev, StepEnd) and ev.step == 6:
                    ray_cluster.kill(ray_cluster.get_actor(names["standalone-1"], namespace="shunter"))
    ended = events[-1]
    assert isinstance(ended, RunEnded) and ended.reason == "completed", ended
    assert [e.replica_id for e in events if isinstance(e, ReplicaDown)] == ["standalone-1"]
    released = [e for e in events if isinstance(e, RankReleased)]
    assert [(e.replica_id, e.rank) for e in released] == [("standalone-1", 1)]
    s = ended.summary
    assert s["buffer/dispatched_groups"] == s["buffer/trained_groups"] + s["buffer/dropped_groups"]
    assert s.get("buffer/dropped_failed_groups", 0) == 0
    assert s["buffer/trained_groups"] == 24 * cfg.groups_per_mini_batch
    moved = [e for e in events if isinstance(e, SampleAborted) and e.reason == "replica_down"]
    assert all(e.partial is not None for e in moved)
