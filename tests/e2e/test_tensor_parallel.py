"""Issue 47, item 3 with real actors: tensor-parallel replicas (``rollout.tensor_parallel_size =
2``) on CPU — each replica one vLLM engine whose mp executor runs two worker processes. The demo
task runs with a standalone TP replica and a hybrid one lent back and forth (asleep while lent
to the trainer, woken for rollout), weights over gloo weight groups (the nccl code path): the
group's bytes reach the first rank and are handed to the second over vLLM's own group, and both
replicas serve the new versions. Then ``kill -9`` of the standalone replica's second worker
process (vLLM's own, an OS pid): the replica is found dead, replaced by a new TP replica that
loads the current weights over a group of its own and serves, and the run goes on. It is stopped
once the replacement has served and two more steps trained: its 300 steps are a bound for slow
starts (~20-95 s each for a TP engine here), not a wait. One test for all of it: three TP engine
starts in all."""

from __future__ import annotations

import asyncio
import os
import signal

import psutil
import pytest

from shunter import Engine
from shunter.events import (
    ModeChanged,
    RankAssigned,
    ReplicaDown,
    ReplicaRestart,
    RunEnded,
    SampleBegin,
    SampleEnd,
    StepEnd,
    Stop,
    ValidateEnd,
    WeightsLoaded,
    WeightsSent,
)
from tests.support.configs import e2e_config

pytestmark = pytest.mark.e2e


async def _second_worker(ray_cluster, actor_name: str) -> psutil.Process:
    """The replica's vLLM worker process of tensor-parallel rank 1 (a child of its engine core,
    itself a child of the replica's actor)."""
    pid = (await ray_cluster.get_actor(actor_name, namespace="shunter").where.remote())["pid"]
    workers = [p for p in psutil.Process(pid).children(recursive=True) if p.name().endswith("Worker_TP1")]
    assert len(workers) == 1, [(p.pid, p.name()) for p in psutil.Process(pid).children(recursive=True)]
    return workers[0]


def _served_new(events: list, rid: str) -> bool:
    """Whether ``rid`` has generated on weights the trainer published (version 1 or later)."""
    return any(isinstance(e, SampleBegin) and e.replica_id == rid and e.version >= 1 for e in events)


async def test_tensor_parallel_replicas_serve_take_weights_and_a_killed_worker_gets_its_replica_replaced(
    ray_cluster, tiny_model, tmp_path
):
    cfg = e2e_config(
        tiny_model,
        tmp_path,
        run={"total_steps": 300, "policy": "lend_when_idle", "policy_options": {"switch_cost_prior_s": 0.05}},
        rollout={
            "standalone_replicas": 1,
            "hybrid_replicas": 1,
            "tensor_parallel_size": 2,
            "max_staleness": 1,
            "replica_restart_backoff_s": 0.0,
        },
        trainer={"weight_transport": "gloo", "weight_bucket_mb": 1.0, "weight_group_timeout_s": 120, "device": "cpu"},
        validation={"every": 4, "prompts": 32},
    )
    events, names, killed, served_at = [], {}, None, None
    async with asyncio.timeout(900):
        async with Engine(cfg) as engine:
            async for ev in engine.events():
                events.append(ev)
                if isinstance(ev, RankAssigned):
                    names[ev.replica_id] = ev.actor_name
                if killed is None and isinstance(ev, StepEnd) and ev.step >= 6 and _served_new(events, "hybrid-1"):
                    worker = await _second_worker(ray_cluster, names["standalone-0"])
                    killed = (len(events), worker.pid)
                    os.kill(worker.pid, signal.SIGKILL)
                if isinstance(ev, SampleEnd) and ev.replica_id == "standalone-2" and served_at is None:
                    served_at = max((e.step for e in events if isinstance(e, StepEnd)), default=0)
                if isinstance(ev, StepEnd) and served_at is not None and ev.step == served_at + 2:
                    await engine.submit(Stop(reason="the replacement served"))
    assert killed is not None, "the run ended before the kill"
    before, after = events[: killed[0]], events[killed[0] :]
    ended = events[-1]
    assert isinstance(ended, RunEnded) and ended.reason == "stopped" and ended.steps < 300, ended
    # before the kill: both TP replicas took new versions over their groups and generated on
    # them — the standalone one in a load (the first rank received, the second got the bytes from
    # it: the fan-out), the hybrid one received while lent and installed them as it woke
    loads = [e for e in before if isinstance(e, WeightsLoaded) and e.replica_id == "standalone-0" and e.version >= 1]
    assert loads and all(e.detail["backend_ranks"] == 2.0 and "backend_fan_out_s" in e.detail for e in loads)
    woke = [e for e in before if isinstance(e, ModeChanged) and e.replica_id == "hybrid-1" and e.mode == "rollout"]
    assert any(e.detail.get("version", 0) >= 1 for e in woke), woke[:2]
    for rid in ("standalone-0", "hybrid-1"):
        assert any(isinstance(e, WeightsSent) and e.replica_id == rid for e in before)
        assert _served_new(before, rid)
    # the hybrid one was put to sleep (lent to the trainer) and woken again
    modes = [e.mode for e in before if isinstance(e, ModeChanged) and e.replica_id == "hybrid-1"]
    assert "trainer" in modes and "rollout" in modes, modes
    held_out = [e for e in before if isinstance(e, ValidateEnd)]
    assert held_out and max(e.version for e in held_out) >= 1, held_out
    # trainer and replicas agree on the log-probs of what was sampled: every rank serves the
    # trainer's weights
    assert all(abs(e.metrics["trainer/mismatch_kl"]) < 0.1 for e in events if isinstance(e, StepEnd))
    # the kill: that replica is down (its engine core died with the worker), replaced by a TP
    # replica that caught up on weights and served; the hybrid one lives on
    assert not psutil.pid_exists(killed[1]) or psutil.Process(killed[1]).status() == psutil.STATUS_ZOMBIE
    downs = [e for e in after if isinstance(e, ReplicaDown)]
    assert [e.replica_id for e in downs] == ["standalone-0"], downs
    assert [e.replica_id for e in after if isinstance(e, ReplicaRestart)] == ["standalone-0"]
    up = [e for e in after if isinstance(e, ModeChanged) and e.replica_id == "standalone-2"]
    assert up and up[0].mode == "rollout" and up[0].detail["version"] >= 1
    assert any(isinstance(e, SampleEnd) and e.replica_id == "standalone-2" for e in after)
    s = ended.summary
    assert s["buffer/dispatched_groups"] == s["buffer/trained_groups"] + s["buffer/dropped_groups"]
