"""Issue 4, item 6: whole runs under random fault schedules (hypothesis). Replicas die,
the trainer dies, the coordinator crashes, an operator stops the run (issue 14), at random
optimizer steps, in any order; each time the run goes on (from the checkpoint when the
trainer or coordinator was lost or the run was stopped).
Whatever the schedule: the run completes, every prompt group is trained exactly once over
the steps that count, no trained sample exceeds the staleness bound — resumed samples
and those after a recovery included — and the buffer accounts for every group."""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.support.configs import cfg
from tests.support.fakes import ACTIONS, run_with_faults, virtual

TOTAL = 10


@settings(max_examples=12, deadline=None)
@given(
    schedule=st.lists(st.tuples(st.integers(1, TOTAL), st.sampled_from(ACTIONS)), max_size=4),
    on_stale=st.sampled_from(["wait", "drop"]),
    staleness=st.integers(0, 2),
)
@example(
    schedule=[(3, "trainer_dies"), (4, "kill_replica"), (6, "coordinator_crashes"), (7, "kill_replica")],
    on_stale="wait",
    staleness=1,
)
@example(schedule=[(3, "stop"), (6, "stop")], on_stale="wait", staleness=1)
@example(schedule=[(5, "stop")], on_stale="wait", staleness=0)
@example(schedule=[(9, "stop")], on_stale="wait", staleness=0)
def test_any_fault_schedule_completes_exactly_once_within_the_staleness_bound(schedule, on_stale, staleness):
    check_schedule(schedule, on_stale, staleness, {})


@settings(max_examples=8, deadline=None)
@given(
    schedule=st.lists(st.tuples(st.integers(1, TOTAL), st.sampled_from(ACTIONS)), max_size=4),
    on_stale=st.sampled_from(["wait", "drop"]),
)
@example(schedule=[(2, "kill_replica"), (4, "coordinator_crashes"), (5, "kill_replica")], on_stale="wait")
@example(schedule=[(2, "kill_replica"), (2, "stop"), (3, "stop")], on_stale="wait")  # a stop repeated mid-cycle
def test_a_straggler_lane_holds_under_any_fault_schedule(schedule, on_stale):
    """The same, with samples moving to a straggler lane while replicas (the lane's among them)
    die and the run restarts: a sample cut on its way to the lane is neither lost nor doubled."""
    check_schedule(schedule, on_stale, 1, {"tail_replicas": 1, "tail_max_in_flight": 4, "tail_after_s": 0.0})


def check_schedule(schedule, on_stale, staleness, options):
    c = cfg(
        run={"total_steps": TOTAL, "checkpoint_every": 2, "policy_options": options},
        validation={"every": 0},
        rollout={"standalone_replicas": 3, "max_staleness": staleness, "on_stale": on_stale},
    )
    root = Path(tempfile.mkdtemp())
    try:
        batches, steps, attempts, coord = virtual(lambda: run_with_faults(c, schedule, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert len(batches) == TOTAL
    fatal = sum(a != "kill_replica" for _, a in schedule)
    hard = sum(a in ("trainer_dies", "coordinator_crashes") for _, a in schedule)
    # a stop lands at the next finished sample: after the last step it stops nothing
    assert attempts <= fatal + 1 and (attempts > 1 or hard == 0)
    prompts = Counter(p for b in batches for p in b)
    assert set(prompts.values()) == {c.rollout.n_samples_per_prompt}, "a group trained twice or in part"
    if on_stale == "wait":
        assert sorted(prompts) == list(range(len(prompts)))  # oldest first, none skipped
    for e in steps:
        assert e.metrics["batch/staleness_max"] <= staleness, e
    k = coord.buffer.counters()
    assert k["dispatched"] == k["trained"] + k["dropped"] + k["in_flight"] + k["ready"]
    assert k.get("dropped_failed", 0) == 0


def test_the_fault_soak_script_runs_and_reports_nothing_lost():
    from tests.support import fault_soak

    res = fault_soak.soak(runs=6, seed=3)
    assert res["runs_completed"] == 6 and res["groups_trained_twice_or_in_part"] == 0
    assert res["groups_unaccounted"] == res["steps_missing"] == res["samples_over_staleness_bound"] == 0
    assert sum(v for k, v in res.items() if k.startswith("injected_")) > 0
