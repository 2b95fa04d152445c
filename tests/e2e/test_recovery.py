"""Issue 4, items 2 and 4 with real actors: the trainer actor is killed mid-run, later the
coordinator actor; each time the Engine restarts the run from its last checkpoint (real
torch model + optimizer state, real vLLM replicas serving the checkpoint's weights), the
registry keeps its table, and the run completes with every prompt group trained exactly
once over the steps that count (read back from the event log). Then a finished run is
resumed from its folder by a new Engine."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from shunter import Engine
from shunter.engine.io.checkpoint import CheckpointStore
from shunter.engine.io.records import trained_groups
from shunter.events import (
    CheckpointSaved,
    RankAssigned,
    ReplicaUp,
    RunEnded,
    RunResumed,
    StepEnd,
    read_log,
)
from tests.support.configs import e2e_config

pytestmark = pytest.mark.e2e


async def test_trainer_then_coordinator_killed_the_run_resumes_and_trains_each_group_once(
    ray_cluster, tiny_model, tmp_path, replica_pool
):
    cfg = e2e_config(
        tiny_model,
        tmp_path,
        run={"total_steps": 16, "checkpoint_every": 2, "max_restarts": 2},
        validation={"every": 0},
        rollout={"standalone_replicas": 2, "max_staleness": 1, "max_tokens": 12},
    )
    events, kills = [], []
    async with asyncio.timeout(600):
        async with Engine(cfg, pool=replica_pool) as engine:
            async for ev in engine.events():
                events.append(ev)
                if isinstance(ev, StepEnd) and ev.step == 5 and not kills:
                    kills.append("trainer")
                    ray_cluster.kill(ray_cluster.get_actor(f"shunter.{engine.run_id}.trainer", namespace="shunter"))
                if isinstance(ev, StepEnd) and ev.step == 11 and len(kills) == 1:
                    kills.append("coordinator")
                    ray_cluster.kill(engine.coordinator)
            out = engine.out_dir
    ended = events[-1]
    assert isinstance(ended, RunEnded) and ended.reason == "completed", ended
    resumed = [e for e in events if isinstance(e, RunResumed)]
    assert [r.attempt for r in resumed] == [1, 2]
    assert "trainer failed" in resumed[0].reason and "coordinator died" in resumed[1].reason
    assert all(r.step % 2 == 0 and r.step >= 2 for r in resumed), resumed
    # exactly once over the steps that count, read back from the event log on disk
    steps = trained_groups(out / "events.bin")
    assert [s for s, _ in steps] == list(range(1, 17))
    groups = Counter(g for _, gs in steps for g in gs)
    assert max(groups.values()) == 1 and len(groups) == 16 * cfg.groups_per_mini_batch
    assert sorted(groups) == list(range(len(groups)))  # wait mode: oldest first, none dropped
    # the log holds every attempt; ranks never collided across them
    log = list(read_log(out / "events.bin"))
    assert [e.failed_component for e in log if isinstance(e, RunEnded)][:1] == ["trainer"]
    live: dict[int, str] = {}
    for e in log:
        if isinstance(e, RankAssigned):
            assert e.rank not in live or live[e.rank] == e.replica_id
            live[e.rank] = e.replica_id
        elif type(e).__name__ == "RankReleased":
            live.pop(e.rank, None)
    assert [e.step for e in log if isinstance(e, CheckpointSaved)][-1] == 16
    # each restart kept both replicas' engines: they loaded the checkpoint in place (no new vLLM;
    # the first attempt's may come from the tests' ReplicaPool)
    ups = [e for e in log if isinstance(e, ReplicaUp)]
    assert [(e.replica_id, e.adopted) for e in ups[2:]] == [(r, True) for r in ("standalone-0", "standalone-1")] * 2
    assert [e.replica_id for e in ups[:2]] == ["standalone-0", "standalone-1"], ups
    assert [e.version for e in ups[2:]] == [resumed[0].version] * 2 + [resumed[1].version] * 2, ups
    assert sum(isinstance(e, RankAssigned) for e in log) == 2  # the same two ranks throughout

    # a new Engine resumes the finished run from its folder: only the finale is left
    async with asyncio.timeout(300):
        async with Engine(cfg, resume=out, pool=replica_pool) as again:
            assert again.run_id == engine.run_id
            tail = [ev async for ev in again.events()]
    assert isinstance(tail[0], RunResumed) or any(isinstance(e, RunResumed) for e in tail)
    assert tail[-1].reason == "completed" and tail[-1].steps == 16
    assert CheckpointStore(out / "checkpoints").latest()[1].step == 16
