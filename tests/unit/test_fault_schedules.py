"""Issue 4, item 6: whole runs under random fault schedules (hypothesis). Replicas die,
the trainer dies, the coordinator crashes, at random optimizer steps, in any order; each
time the run goes on (from the checkpoint when the trainer or coordinator was lost).
Whatever the schedule: the run completes, every prompt group is trained exactly once over
the steps that count, no trained sample exceeds the staleness bound — resumed samples
and those after a recovery included — and the buffer accounts for every group."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections import Counter
from pathlib import Path

from fakes import local_run
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_coordinator import cfg

from shunter.engine.checkpoint import CheckpointStore
from shunter.events import ComponentFailed, StepEnd

TOTAL = 10
ACTIONS = ("kill_replica", "trainer_dies", "coordinator_crashes")


class Crash(Exception):
    """The coordinator loop dies here, with whatever it held in memory."""


async def run_with_faults(c, schedule: list[tuple[int, str]], root: Path):
    """Run to the end, resuming from the last checkpoint after each lost trainer or
    coordinator. Returns (prompt ids per counted step, every StepEnd, attempts, last coordinator)."""
    pending = sorted(schedule)
    steps_seen: list[StepEnd] = []
    resume, attempts = None, 0
    while True:
        attempts += 1
        assert attempts <= len(schedule) + 1, "more attempts than faults"
        coord, _, trainer = local_run(c, token_s=0.001, checkpoints=root, resume=resume)
        killed = set()

        def chaos(m, coord=coord, killed=killed):
            if not isinstance(m, StepEnd):
                return
            steps_seen.append(m)
            while pending and pending[0][0] <= m.step:
                _, action = pending.pop(0)
                live = [r for r in coord.executor.replicas if r not in killed]
                if action == "kill_replica" and len(live) > 1:
                    killed.add(live[0])
                    coord.executor.kill(live[0], reason="chaos")
                elif action == "trainer_dies":
                    coord.post(coord.stamp(ComponentFailed(component="trainer", error="chaos")))
                elif action == "coordinator_crashes":
                    raise Crash

        coord.sinks.append(chaos)
        try:
            async with asyncio.timeout(30):
                ended = await coord.run()
        except Crash:
            ended = None
        if ended is not None and not ended.failed_component:
            assert ended.reason == "completed", ended
            batches = trainer.restored_batches + [[s.prompt_id for s in b] for b in trainer.seen]
            return batches, steps_seen, attempts, coord
        found = CheckpointStore(root).latest()
        resume = found[0] if found else None
        if resume is None:  # lost before the first checkpoint: start over
            shutil.rmtree(root, ignore_errors=True)


@settings(max_examples=12, deadline=None)
@given(schedule=st.lists(st.tuples(st.integers(1, TOTAL), st.sampled_from(ACTIONS)), max_size=4),
       on_stale=st.sampled_from(["wait", "drop"]), staleness=st.integers(0, 2))
@example(schedule=[(3, "trainer_dies"), (4, "kill_replica"), (6, "coordinator_crashes"), (7, "kill_replica")],
         on_stale="wait", staleness=1)
def test_any_fault_schedule_completes_exactly_once_within_the_staleness_bound(schedule, on_stale, staleness):
    c = cfg(run={"total_steps": TOTAL, "checkpoint_every": 2}, validation={"every": 0},
            rollout={"standalone_replicas": 3, "max_staleness": staleness, "on_stale": on_stale})
    root = Path(tempfile.mkdtemp())
    try:
        batches, steps, attempts, coord = asyncio.run(run_with_faults(c, schedule, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert len(batches) == TOTAL
    fatal = sum(a != "kill_replica" for _, a in schedule)
    assert (attempts > 1) == (fatal > 0) and attempts <= fatal + 1
    prompts = Counter(p for b in batches for p in b)
    assert set(prompts.values()) == {c.rollout.n_samples_per_prompt}, "a group trained twice or in part"
    if on_stale == "wait":
        assert sorted(prompts) == list(range(len(prompts)))  # oldest first, none skipped
    for e in steps:
        assert e.metrics["batch/staleness_max"] <= staleness, e
    k = coord.buffer.counters()
    assert k["dispatched"] == k["trained"] + k["dropped"] + k["in_flight"] + k["ready"]
    assert k.get("dropped_failed", 0) == 0
