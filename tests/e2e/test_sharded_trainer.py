"""Issue 47 with real actors: a trainer of two ranks (FSDP2 over gloo, two Ray actors) trains a
run with real vLLM replicas; ``kill -9`` of rank 1's OS process mid-run tears the group down and
the run restarts from its sharded checkpoint; the finished run is then resumed with one rank
(2 -> 1) and again with two (1 -> 2), where rank 1 is stopped (``SIGSTOP``: alive but silent) and
the run restarts once rank 0's collective runs past ``trainer.collective_timeout_s``; across all
attempts every step is trained once and every group once (read back from the event log)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter

import pytest

from shunter import Engine
from shunter.engine.io.records import trained_groups
from shunter.events import RunEnded, RunResumed, StepEnd, read_log
from tests.support.configs import e2e_config

pytestmark = pytest.mark.e2e


def _pid(ray_mod, name: str) -> int:
    """The OS pid of the actor ``name`` (asked inside it: the test kills the process, not the actor)."""
    h = ray_mod.get_actor(name, namespace="shunter")
    return int(ray_mod.get(h.__ray_call__.remote(lambda _self: os.getpid()), timeout=30))


async def _run(cfg, pool, resume=None, rank1_at: int = 0, sig=signal.SIGKILL, ray_mod=None):
    """The run's events and folder; at step ``rank1_at`` rank 1's process gets ``sig``."""
    events = []
    async with asyncio.timeout(600):
        async with Engine(cfg, pool=pool, resume=resume) as engine:
            async for ev in engine.events():
                events.append(ev)
                if rank1_at and isinstance(ev, StepEnd) and ev.step == rank1_at:
                    rank1_at = 0
                    name = f"shunter.{engine.run_id}.trainer.rank1"
                    os.kill(await asyncio.to_thread(_pid, ray_mod, name), sig)
            return events, engine.out_dir


async def test_two_ranks_train_survive_kill_9_of_a_rank_and_resume_at_one_and_two_ranks(
    ray_cluster, tiny_model, tmp_path, replica_pool
):
    def cfg(world: int, steps: int):
        return e2e_config(
            tiny_model,
            tmp_path,
            run={"total_steps": steps, "checkpoint_every": 2, "max_restarts": 1},
            validation={"every": 0},
            rollout={"standalone_replicas": 1, "max_staleness": 1, "max_tokens": 12},
            trainer={"world_size": world, "collective_timeout_s": 8.0},
        )

    events, out = await _run(cfg(2, 6), replica_pool, rank1_at=3, ray_mod=ray_cluster)
    assert isinstance(events[-1], RunEnded) and events[-1].reason == "completed", events[-1]
    resumed = [e for e in events if isinstance(e, RunResumed)]
    assert len(resumed) == 1 and resumed[0].step == 2, resumed
    assert "trainer rank 1 of 2 died" in resumed[0].reason, resumed[0].reason  # the rank named, not rank 0

    events, _ = await _run(cfg(1, 8), replica_pool, resume=out)  # 2 -> 1: the sharded checkpoint reshards
    assert events[-1].reason == "completed" and events[-1].steps == 8, events[-1]
    # 1 -> 2, and rank 1 stopped (SIGSTOP: alive, silent) mid-run: rank 0's collective fails at the
    # deadline, the group is taken as lost and the run restarts from its checkpoint
    events, _ = await _run(cfg(2, 12), replica_pool, resume=out, rank1_at=10, sig=signal.SIGSTOP, ray_mod=ray_cluster)
    assert events[-1].reason == "completed" and events[-1].steps == 12, events[-1]
    resumed = [e for e in events if isinstance(e, RunResumed)]
    assert len(resumed) == 2, [(e.attempt, e.reason) for e in resumed]  # the resume, then the restart
    assert "collective_timeout_s = 8s" in resumed[-1].reason, resumed[-1].reason

    steps = trained_groups(out / "events.bin")
    assert [s for s, _ in steps] == list(range(1, 13))
    groups = Counter(g for _, gs in steps for g in gs)
    assert max(groups.values()) == 1
    ends = [e for e in read_log(out / "events.bin") if isinstance(e, RunEnded)]
    assert ends[0].failed_component == "trainer", ends[0]
