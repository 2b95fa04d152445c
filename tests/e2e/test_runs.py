"""Whole runs: real vLLM replicas (CPU build) and the real torch trainer as Ray actors,
driven by the real coordinator and policies, on the built-in task."""

from __future__ import annotations

import asyncio
import json

import pytest

from shunter import Engine
from shunter.events import (
    ModeChanged,
    RankAssigned,
    ReplicaUp,
    RunEnded,
    SampleAborted,
    SampleEnd,
    SampleResumed,
    StepEnd,
    WeightsLoaded,
    read_log,
)
from tests.support.configs import e2e_config

pytestmark = pytest.mark.e2e


async def run_collect(cfg, timeout, pool=None):
    events = []
    async with asyncio.timeout(timeout):
        async with Engine(cfg, pool=pool) as engine:
            async for ev in engine.events():
                events.append(ev)
            out_dir = engine.out_dir
    return events, out_dir


async def test_separate_run_learns_with_partial_rollout(ray_cluster, tiny_model, tmp_path, replica_pool):
    # the trainer is two FSDP2 ranks (issue 47): the same steps as one process (the unit tier's
    # exactness test), so the same run must learn as the one-process run did
    cfg = e2e_config(
        tiny_model,
        tmp_path,
        run={"total_steps": 160},
        validation={"every": 40, "prompts": 64},
        trainer={"world_size": 2, "num_cpus": 0.5},
    )
    events, out_dir = await run_collect(cfg, 500, replica_pool)
    ended = events[-1]
    assert isinstance(ended, RunEnded) and ended.reason == "completed", ended
    steps = [e for e in events if isinstance(e, StepEnd)]
    assert [e.step for e in steps] == list(range(1, 161))
    rewards = [e.metrics["batch/reward_mean"] for e in steps]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + 0.05, f"reward did not rise: {first:.3f} -> {last:.3f}"
    assert max(e.metrics["batch/staleness_max"] for e in steps) <= cfg.rollout.max_staleness
    # bypass mode: on the first step trainer and rollout hold the same weights, so vLLM's
    # log-probs must be the trainer's own (ratio 1, no mismatch)
    assert abs(steps[0].metrics["trainer/mismatch_kl"]) < 1e-3
    assert abs(steps[0].metrics["trainer/ratio_mean"] - 1) < 1e-3
    # partial rollout: a sample cut by a weight update, resumed, trained with two versions
    cut = {e.sample_id for e in events if isinstance(e, SampleAborted) and e.reason == "weights_update"}
    resumed = {e.sample_id for e in events if isinstance(e, SampleResumed)}
    two = [e.sample for e in events if isinstance(e, SampleEnd) and len(set(e.sample.versions)) > 1]
    assert cut & resumed and two
    assert all(len(s.token_ids) <= s.max_tokens for s in two)
    # every prompt group accounted for exactly once
    s = ended.summary
    assert s["buffer/dispatched_groups"] == s["buffer/trained_groups"] + s["buffer/dropped_groups"]
    assert s["buffer/trained_groups"] == 160 * cfg.groups_per_mini_batch
    # records: the event log reads back, metrics are JSON lines
    logged = list(read_log(out_dir / "events.bin"))
    assert isinstance(logged[-1], RunEnded) and len(logged) >= len(events)
    rows = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert sum("trainer/loss" in r for r in rows) == 160


async def test_lend_when_idle_lends_hybrid_replicas_and_ranks_never_collide(
    ray_cluster, tiny_model, tmp_path, replica_pool
):
    cfg = e2e_config(
        tiny_model,
        tmp_path,
        run={"total_steps": 30, "policy": "lend_when_idle", "policy_options": {"switch_cost_prior_s": 0.05}},
        rollout={"standalone_replicas": 1, "hybrid_replicas": 1, "max_staleness": 0},
    )
    events, _ = await run_collect(cfg, 400, replica_pool)
    ended = events[-1]
    assert ended.reason == "completed", ended
    ranks = [(e.replica_id, e.rank) for e in events if isinstance(e, RankAssigned)]
    assert sorted(r for _, r in ranks) == [0, 1]
    kinds = {e.replica_id: e.replica_kind for e in events if isinstance(e, ReplicaUp)}
    assert sorted(kinds.values()) == ["hybrid", "standalone"]
    modes = [(e.replica_id, e.mode) for e in events if isinstance(e, ModeChanged)]
    assert ("hybrid-1", "rollout") in modes and ("hybrid-1", "trainer") in modes
    s = ended.summary
    assert s["buffer/dispatched_groups"] == s["buffer/trained_groups"] + s["buffer/dropped_groups"]


async def test_two_runs_share_a_cluster_without_name_collisions(ray_cluster, tiny_model, tmp_path, replica_pool):
    cfg = e2e_config(tiny_model, tmp_path, run={"total_steps": 4}, validation={"every": 0})
    a, b = await asyncio.gather(run_collect(cfg, 300, replica_pool), run_collect(cfg, 300, replica_pool))
    for events, _ in (a, b):
        assert events[-1].reason == "completed"
    assert {e.run_id for e in a[0]} & {e.run_id for e in b[0]} == set()


async def test_keep_updates_weights_in_place_on_vllm(ray_cluster, tiny_model, tmp_path, replica_pool):
    """``rollout.weight_update = "keep"`` on real vLLM: a load pauses the running requests with
    their KV cache (``pause_generation(mode="keep")``), swaps the weights and lets them go on —
    nothing is cut or resumed, and each token's version is vLLM's own label of the weights that
    sampled it (its weight-version spans).

    A load finds requests running only where rollout is the slower side: a replica ahead of
    the trainer sits at the staleness gate, idle, when the next version comes (measured with
    256 samples in flight: 3 loads of 4 found it idle, and CI failed once with none kept).
    At most 16 samples in flight make a 256-sample batch 16 waves of 20 decode steps — measured
    2.1 s a version against 1.0 s for the trainer's two optimizer steps — so the trainer waits
    for batches and each load but the last (after the final dispatch) lands mid-generation.
    The backend half (a request paused mid-generation keeps its KV and its tokens' labels)
    is checked without any race in ``vllm_backend_check.py``."""
    cfg = e2e_config(
        tiny_model,
        tmp_path,
        run={"total_steps": 8},
        rollout={"weight_update": "keep", "ignore_eos": True, "max_tokens": 20, "max_in_flight_per_replica": 16},
        validation={"every": 0},
    )
    events, _ = await run_collect(cfg, 300, replica_pool)
    assert events[-1].reason == "completed", events[-1]
    assert not [e for e in events if isinstance(e, SampleAborted) and e.reason == "weights_update"]
    loads = [e for e in events if isinstance(e, WeightsLoaded) and e.version > 0]
    assert loads and all(e.interrupted == 0 for e in loads) and sum(e.detail["kept"] for e in loads) > 0
    two = [e.sample for e in events if isinstance(e, SampleEnd) and len(set(e.sample.versions)) > 1]
    assert two, "no sample spanned a weight update"
    for s in two:
        assert s.versions == sorted(s.versions) and len(s.versions) == len(s.token_ids)
    assert max(e.metrics["batch/staleness_max"] for e in events if isinstance(e, StepEnd)) <= cfg.rollout.max_staleness


async def test_a_pooled_replica_serves_the_next_run_as_a_new_one_would(ray_cluster, tiny_model, tmp_path, replica_pool):
    """``Engine(cfg, pool=...)``: a run in keep mode trains and gives its replica back to the pool
    (engine running, its tokens labelled with the run's last version); the next run, in abort
    mode, takes it: the replica serves the base model's weights again (vLLM's log-probs are the
    trainer's own on the first step), its tokens carry this run's versions (none is stale, none
    dropped), under a rank of this run and the actor name the run that made it gave it."""
    keep = e2e_config(
        tiny_model, tmp_path, run={"total_steps": 2}, validation={"every": 0}, rollout={"weight_update": "keep"}
    )
    a, _ = await run_collect(keep, 300, replica_pool)
    assert a[-1].reason == "completed", a[-1]
    assert len(replica_pool) >= 1
    # long enough that a token labelled with the keep run's last version (1) would be stale here
    plain = e2e_config(tiny_model, tmp_path, run={"total_steps": 8}, validation={"every": 0})
    b, _ = await run_collect(plain, 150, replica_pool)
    ended = b[-1]
    assert ended.reason == "completed", ended
    up = [e for e in b if isinstance(e, ReplicaUp)]
    assert [(e.adopted, e.version) for e in up] == [(True, 0)], up
    names = [e.actor_name for e in b if isinstance(e, RankAssigned)]
    assert len(names) == 1 and not names[0].startswith(f"shunter.{ended.run_id}."), names
    steps = [e for e in b if isinstance(e, StepEnd)]
    assert abs(steps[0].metrics["trainer/mismatch_kl"]) < 1e-3  # base weights, not the keep run's
    assert max(e.metrics["batch/staleness_max"] for e in steps) <= plain.rollout.max_staleness
    assert ended.summary["buffer/dropped_groups"] == 0
    assert len(replica_pool) >= 1  # given back again
