"""Issue 4, item 1 with real actors: a vLLM replica killed mid-run (``ray.kill``); its samples
resume on the live replica, its rank is released and taken by the replacement the engine starts
on its own (``replica.restart``; it loads the current weights first), the run completes with
every group accounted for once. The run is stopped (``Stop``, as ``Engine.stop`` does) once the replacement
has served and two more steps trained: its 160 steps are a bound for a slow start, not a wait."""

from __future__ import annotations

import asyncio

import pytest

from shunter import Engine
from shunter.events import (
    ModeChanged,
    RankAssigned,
    RankReleased,
    ReplicaDown,
    ReplicaRestart,
    RunEnded,
    SampleAborted,
    SampleEnd,
    StepEnd,
    Stop,
)
from tests.support.configs import e2e_config

pytestmark = pytest.mark.e2e


async def test_a_killed_replica_loses_no_sample_and_releases_its_rank(ray_cluster, tiny_model, tmp_path, replica_pool):
    cfg = e2e_config(
        tiny_model,
        tmp_path,
        run={"total_steps": 160},
        validation={"every": 0},
        rollout={"standalone_replicas": 2, "max_staleness": 1, "max_tokens": 12},
    )
    events = []
    served_at = None  # the step when the replacement's first sample came
    async with asyncio.timeout(400):
        async with Engine(cfg, pool=replica_pool) as engine:
            names = {}
            async for ev in engine.events():
                events.append(ev)
                if isinstance(ev, RankAssigned):
                    names[ev.replica_id] = ev.actor_name
                if isinstance(ev, StepEnd) and ev.step == 4:
                    ray_cluster.kill(ray_cluster.get_actor(names["standalone-1"], namespace="shunter"))
                if isinstance(ev, SampleEnd) and ev.replica_id == "standalone-2" and served_at is None:
                    served_at = max((e.step for e in events if isinstance(e, StepEnd)), default=0)
                if isinstance(ev, StepEnd) and served_at is not None and ev.step == served_at + 2:
                    await engine.submit(Stop(reason="the replacement served"))
    ended = events[-1]
    assert isinstance(ended, RunEnded) and ended.reason == "stopped" and ended.steps < 160, ended
    assert [e.replica_id for e in events if isinstance(e, ReplicaDown)] == ["standalone-1"]
    released = [e for e in events if isinstance(e, RankReleased)]
    assert [(e.replica_id, e.rank) for e in released] == [("standalone-1", 1)]
    s = ended.summary
    assert s["buffer/dispatched_groups"] == s["buffer/trained_groups"] + s["buffer/dropped_groups"]
    assert s.get("buffer/dropped_failed_groups", 0) == 0
    assert s["buffer/trained_groups"] == ended.steps * cfg.groups_per_mini_batch
    moved = [e for e in events if isinstance(e, SampleAborted) and e.reason == "replica_down"]
    assert all(e.partial is not None for e in moved)
    # one replacement, started by the engine itself: it took the released rank, caught up on
    # weights, then generated
    restarts = [e for e in events if isinstance(e, ReplicaRestart)]
    assert [(e.replica_id, e.rank, e.attempt) for e in restarts] == [("standalone-1", 1, 1)], restarts
    replacement = "standalone-2"
    assigned = [e.replica_id for e in events if isinstance(e, RankAssigned)]
    assert assigned == ["standalone-0", "standalone-1", replacement], assigned
    assert [e.rank for e in events if isinstance(e, RankAssigned) and e.replica_id == replacement] == [1]
    up = [e for e in events if isinstance(e, ModeChanged) and e.replica_id == replacement]
    assert up and up[0].mode == "rollout" and up[0].detail["version"] >= 1
    last_step = max(e.step for e in events[: events.index(up[0])] if isinstance(e, StepEnd))
    first_sample = next(
        (i for i, e in enumerate(events) if isinstance(e, SampleEnd) and e.replica_id == replacement), None
    )
    assert first_sample is not None, f"the replacement served from step {last_step} of 160 and generated nothing"
    assert first_sample > events.index(up[0])
