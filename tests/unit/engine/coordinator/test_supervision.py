"""Dead replicas (issue 14), on the real coordinator with in-process replicas: a replica whose
inference engine dies is a dead replica (every sample it held resumes elsewhere, no group
dropped as failed); a dead replica is replaced — new id, rank from the registry's pool, the
current weights loaded before it serves — a bounded number of times per slot with a doubling
backoff; with no replica left and none replaceable the run ends at once and says why."""

from __future__ import annotations

from collections import Counter

import pytest

from shunter.events import (
    GroupDropped,
    ModeChanged,
    ReplicaDown,
    ReplicaGivenUp,
    ReplicaRestart,
    ReplicaUp,
    RunEnded,
    SampleBegin,
    SampleResumed,
    StepEnd,
    WeightsReady,
)
from tests.support.configs import cfg
from tests.support.fakes import local_run, run_to_end, virtual_time


def _config(**rollout):
    return cfg(
        run={"total_steps": 10},
        validation={"every": 0},
        rollout={"standalone_replicas": 2, "max_staleness": 1, "on_stale": "wait", **rollout},
    )


def _at_step(step: int, act):
    def sink(m):
        if isinstance(m, StepEnd) and m.step == step:
            act()

    return sink


def _trained(trainer) -> Counter:
    return Counter(s.prompt_id for b in trainer.seen for s in b if s.sample_id.endswith(".0"))


@virtual_time
async def test_a_replica_whose_engine_dies_is_down_once_and_loses_nothing():
    """Was: 36 generations failed with EngineDeadError and their groups were dropped as
    failed; the replica was marked down only later, by a failed weight load."""
    coord, backends, trainer = local_run(_config())
    coord.sinks.append(_at_step(3, backends["standalone-0"].die))
    ended, seen = await run_to_end(coord, timeout=600)
    assert ended.reason == "completed", ended
    downs = [m for m in seen if isinstance(m, ReplicaDown)]
    assert [d.replica_id for d in downs] == ["standalone-0"] and "inference engine died" in downs[0].reason
    assert not [m for m in seen if isinstance(m, GroupDropped) and m.reason == "failed"]
    trained = _trained(trainer)
    assert set(trained.values()) == {1} and sorted(trained) == list(range(len(trained)))


@virtual_time
async def test_a_dead_replica_is_replaced_and_serves_the_current_weights_first():
    """Was: with one standalone replica, a kill stalled the run for 60 s, then it ended
    ``stalled``."""
    coord, backends, trainer = local_run(_config(standalone_replicas=1))
    coord.sinks.append(_at_step(4, lambda: coord.executor.kill("standalone-0", reason="kill -9")))
    ended, seen = await run_to_end(coord, timeout=600)
    assert ended.reason == "completed", ended
    (restart,) = [m for m in seen if isinstance(m, ReplicaRestart)]
    assert (restart.replica_id, restart.rank, restart.attempt, restart.delay_s) == ("standalone-0", 0, 1, 2.0)
    ups = [m for m in seen if isinstance(m, ReplicaUp) and m.replica_id != "standalone-0"]
    assert len(ups) == 1 and ups[0].rank == 0
    new = ups[0].replica_id
    first_sample = next(
        i for i, m in enumerate(seen) if isinstance(m, SampleBegin | SampleResumed) and m.replica_id == new
    )
    before = seen[:first_sample]
    assert any(isinstance(m, ModeChanged) and m.replica_id == new and m.mode == "rollout" for m in before), (
        "the replacement served before it was brought to the current weights"
    )
    current = max((m.version for m in before if isinstance(m, WeightsReady)), default=0)
    assert seen[first_sample].version == current
    trained = _trained(trainer)
    assert set(trained.values()) == {1} and sorted(trained) == list(range(len(trained)))


@virtual_time
async def test_a_slot_that_keeps_dying_is_given_up_after_its_restarts_and_the_run_says_so():
    coord, backends, trainer = local_run(_config(standalone_replicas=1, replica_restarts=2))

    def doomed(m):  # every replacement's engine dies as soon as it serves
        if isinstance(m, ReplicaUp) and m.replica_id != "standalone-0":
            backends[m.replica_id].die()

    coord.sinks.append(doomed)
    coord.sinks.append(_at_step(2, backends["standalone-0"].die))
    ended, seen = await run_to_end(coord, timeout=3600)
    restarts = [m for m in seen if isinstance(m, ReplicaRestart)]
    assert [(r.attempt, r.delay_s) for r in restarts] == [(1, 2.0), (2, 4.0)]
    (gave_up,) = [m for m in seen if isinstance(m, ReplicaGivenUp)]
    assert gave_up.attempts == 2
    assert isinstance(ended, RunEnded) and ended.reason == "error"
    assert "no rollout replica left" in ended.error and "stalled" not in ended.error
    assert ended.wall_time - gave_up.wall_time < 1.0  # at once, not after run.stall_timeout_s


@pytest.mark.parametrize("others", [0, 1], ids=["last-replica", "one-left"])
@virtual_time
async def test_with_restarts_off_a_dead_replica_is_given_up(others):
    coord, _, trainer = local_run(_config(standalone_replicas=1 + others, replica_restarts=0))
    coord.sinks.append(_at_step(2, lambda: coord.executor.kill("standalone-0", reason="kill -9")))
    ended, seen = await run_to_end(coord, timeout=600)
    assert not [m for m in seen if isinstance(m, ReplicaRestart)]
    assert [m.replica_id for m in seen if isinstance(m, ReplicaGivenUp)] == ["standalone-0"]
    if others:  # the run goes on with the replica it has
        assert ended.reason == "completed" and trainer.step == 10
    else:
        assert ended.reason == "error" and "no rollout replica left" in ended.error


@virtual_time
async def test_when_the_last_replica_is_lost_with_the_users_reward_in_process_the_error_points_at_it():
    """A reward that exits its process (``os._exit``) kills the replica that ran it: with no
    reward worker, the error names the reward function and the way to contain it."""
    import msgspec

    c = _config(standalone_replicas=1, replica_restarts=0)
    c = msgspec.structs.replace(c, task=msgspec.structs.replace(c.task, reward="my_reward:compute_score"))
    coord, _, _ = local_run(c)
    coord.sinks.append(_at_step(2, lambda: coord.executor.kill("standalone-0", reason="actor died")))
    ended, _ = await run_to_end(coord, timeout=600)
    assert ended.reason == "error" and "no rollout replica left" in ended.error
    assert "reward function my_reward:compute_score" in ended.error and "task.reward_workers = 1" in ended.error
