"""Stopping a run (issue 14): an operator's stop (SIGTERM, Ctrl-C, ``Engine.stop``) lands at
any moment; the run ends at a consistent cut — the end of a sync cycle, never a half-cycle
publish that would put the version ahead of the step and make the resumed run's staleness
gate let in groups that go stale (seen: 306 prompts skipped in ``wait`` mode over 5 resumes).
If the cycle cannot complete, the run ends without publishing and keeps its last checkpoint."""

from __future__ import annotations

import pytest

from shunter.engine.io.checkpoint import CheckpointStore
from shunter.events import CheckpointSaved, RunEnded, SampleEnd, Stamper, StepEnd, Stop, ValidateEnd, WeightsReady
from tests.support.configs import cfg
from tests.support.fakes import local_run, run_to_end, virtual_time


def _stop_at(coord, step: int, *, kill_all: bool = False, times: int = 1):
    """After ``StepEnd(step)``, at the next finished sample (the trainer is then as likely idle
    mid-cycle as busy): the replicas die if ``kill_all``, and the operator stops the run — again
    at each of the next ``times - 1`` finished samples (a stop repeated while the cycle ends)."""
    armed = []

    def sink(m):
        if isinstance(m, StepEnd) and m.step == step:
            armed.extend([True] * times)
        elif armed and isinstance(m, SampleEnd):
            first = len(armed) == times
            armed.pop()
            if kill_all and first:
                for rid in list(coord.executor.replicas):
                    coord.executor.kill(rid, reason="chaos")
            coord.post(Stamper("test", "user")(Stop(reason="stopped")))

    return sink


@pytest.mark.parametrize("times", [1, 3], ids=["once", "repeated"])
@pytest.mark.parametrize("kill_all", [False, True], ids=["replicas-alive", "no-replica-left"])
@pytest.mark.parametrize("step", [1, 2, 3, 4, 5])
@virtual_time
async def test_a_stop_ends_at_a_sync_boundary_or_without_publishing(tmp_path, step, kill_all, times):
    """Repeated: a second ``Stop`` during the cycle once forced the half-cycle publish the
    first one avoids (found by the fault-schedule test: a group dropped as stale in wait mode)."""
    c = cfg(
        run={"total_steps": 12, "checkpoint_every": 2},
        validation={"every": 0},
        rollout={"standalone_replicas": 2, "max_staleness": 1, "on_stale": "wait"},
        trainer={"parameter_sync_step": 2},
    )
    coord, _, trainer = local_run(c, checkpoints=tmp_path)
    coord.sinks.append(_stop_at(coord, step, kill_all=kill_all, times=times))
    ended, seen = await run_to_end(coord, timeout=600)
    assert isinstance(ended, RunEnded) and ended.reason == "stopped", ended
    sync = c.trainer.parameter_sync_step
    steps = [m.step for m in seen if isinstance(m, StepEnd)]
    publishes = [m.version for m in seen if isinstance(m, WeightsReady)]
    assert len(publishes) == len(steps) // sync, "a half-cycle publish"
    for m in seen:
        if isinstance(m, CheckpointSaved):
            assert m.step % sync == 0 and m.version == m.step // sync, m
    found = CheckpointStore(tmp_path).latest()
    assert found is not None and found.manifest.step == max(s for s in steps if s % sync == 0)
    stop_at = next(i for i, m in enumerate(seen) if isinstance(m, Stop))
    after = [m.step for m in seen[stop_at:] if isinstance(m, StepEnd)]
    assert len(after) <= sync, f"the stop let {len(after)} more steps run: only the cycle under way finishes"


@pytest.mark.parametrize("step", [3, 4], ids=["mid-cycle", "at-a-cut"])
@virtual_time
async def test_once_the_finale_takes_over_the_policy_is_not_called(tmp_path, step):
    """Issue 31: a policy that takes 50 ms a call (called on every sample event) backs the
    coordinator up; a Ctrl-C then waited for it on every event the finale needed (29 s in a real
    run). From ``draining`` on the finale issues the run's last intents itself: the policy sees
    no event once the finale issues the last intents itself, and in a stop's last cycle none
    about single samples (no new group starts)."""
    from shunter.policies import SeparatePolicy
    from shunter.policies.base import SAMPLE_EVENTS

    calls = []

    class Counting(SeparatePolicy):
        def decide(self, event, view):
            calls.append((isinstance(event, SAMPLE_EVENTS), coord.finale.phase, coord._stop_posted))
            return super().decide(event, view)

    c = cfg(
        run={"total_steps": 12, "checkpoint_every": 2},
        validation={"every": 2},
        rollout={"standalone_replicas": 1, "max_staleness": 1, "on_stale": "wait"},
        trainer={"parameter_sync_step": 2},
    )
    coord, _, _ = local_run(c, checkpoints=tmp_path, policy=Counting())
    coord.sinks.append(_stop_at(coord, step))
    ended, seen = await run_to_end(coord, timeout=600)
    assert ended.reason == "stopped"
    phases = {phase for _, phase, _ in calls}
    assert phases <= {"running", "cycling"} and ("cycling" in phases) == (step % 2 == 1), phases
    # from the moment the Stop is posted (still queued behind events), no single sample is asked about
    assert not any(sample for sample, phase, posted in calls if posted or phase == "cycling")
    assert any(posted for _, _, posted in calls) or step % 2 == 0
    stop_at = next(i for i, m in enumerate(seen) if isinstance(m, Stop))
    assert any(isinstance(m, ValidateEnd) for m in seen[stop_at:])  # the finale's own work: the last validation
