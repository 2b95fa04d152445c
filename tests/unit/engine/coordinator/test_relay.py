"""Relays (``engine.coordinator.relay``, issue 28): per-sample facts folded into ``RelayReport``s, in order,
within a window; whole runs through relays — the coordinator applying each report's facts as if
they came alone, the trainer handing new weights to the relays itself, faults at random moments —
keep every promise a run without them keeps."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shunter.engine.coordinator.relay import Relay
from shunter.events import (
    CommandFailed,
    InstallWeights,
    Publish,
    PublishWeights,
    RelayReport,
    ReplicaDown,
    SampleBegin,
    SampleEnd,
    Stamper,
    WeightsLoaded,
    flatten,
)
from shunter.policies.separate import SeparatePolicy
from tests.support.configs import cfg
from tests.support.fakes import local_run, run_to_end, run_with_faults, virtual, virtual_time


def begin(i: int, rid: str = "standalone-0") -> SampleBegin:
    return SampleBegin(sample_id=f"{i}.0", group_id=i, replica_id=rid, version=0)


def failed(i: int) -> CommandFailed:
    return CommandFailed(command_kind="rollout.generate", target="standalone-0", error="x", group_id=i)


def relay(posted: list, window_s: float = 0.05, max_events: int = 4) -> Relay:
    return Relay("node:t", posted.extend, Stamper("t", "relay:t"), window_s=window_s, max_events=max_events)


@virtual_time
async def test_facts_wait_at_most_the_window_and_come_out_in_order():
    posted: list = []
    r = relay(posted)
    r.push([begin(0), begin(1)])
    await asyncio.sleep(0.02)
    r.push([begin(2)])
    assert posted == []  # within the window: held
    await asyncio.sleep(0.031)  # the window of the first fact closes
    (report,) = posted
    assert isinstance(report, RelayReport) and report.events == [begin(0), begin(1), begin(2)]
    assert report.held_s == pytest.approx(0.05) and report.relay == "node:t"
    assert r.flushes == 1 and r.folded == 3 and r.held == 0


@virtual_time
async def test_a_fact_it_does_not_fold_flushes_what_is_held_first_and_passes_alone():
    posted: list = []
    r = relay(posted)
    r.push([begin(0), failed(0), begin(1)])
    assert posted == [begin(0), failed(0)]  # begin(0) never waited: it goes bare, before the failure
    r.flush()
    assert list(flatten(posted)) == [begin(0), failed(0), begin(1)]


@virtual_time
async def test_a_full_report_leaves_at_once_and_a_fact_that_never_waited_goes_bare():
    posted: list = []
    r = relay(posted, max_events=2)
    r.push([begin(0), begin(1), begin(2)])
    assert len(posted) == 1 and posted[0].events == [begin(0), begin(1)] and posted[0].held_s == 0
    posted.clear()
    nowait = relay(posted, window_s=0.0, max_events=8)  # no window: one push's facts together, none waits
    nowait.push([begin(3)])
    nowait.push([begin(4), begin(5)])
    assert posted[0] == begin(3) and posted[1].events == [begin(4), begin(5)]
    posted.clear()
    off = relay(posted, max_events=1)  # 1 folds nothing: every fact alone, as it comes
    off.push([begin(6), begin(7)])
    assert posted == [begin(6), begin(7)]


def test_a_report_is_the_same_run_as_its_facts_alone():
    """The same seeded run with and without relays: every sample's facts reach the policy one by
    one (a policy subscribed to ``SampleEnd`` counts them all), the same groups are trained
    exactly once, and the event log's reports read back as those facts."""

    class Counting(SeparatePolicy):
        ignores = ()

        def __init__(self) -> None:
            super().__init__()
            self.seen: Counter[str] = Counter()

        def decide(self, event, view):
            self.seen[type(event).__name__] += 1
            return super().decide(event, view)

    def once(relays: int):
        policy = Counting()
        c = cfg(run={"total_steps": 6}, rollout={"standalone_replicas": 4, "report_window_s": 0.02})

        async def go():
            coord, _, trainer = local_run(c, policy=policy, relays=relays)
            ended, seen = await run_to_end(coord)
            return ended, trainer, seen

        ended, trainer, seen = virtual(go)
        return ended, trainer, policy, seen

    plain = once(0)
    folded = once(2)
    for ended, trainer, policy, seen in (plain, folded):
        assert ended.reason == "completed"
        groups = Counter(s.group_id for b in trainer.seen for s in b)
        assert set(groups.values()) == {4} and sorted(groups) == list(range(len(groups)))
        ends = sum(isinstance(m, SampleEnd) for m in flatten(seen))
        assert policy.seen["SampleEnd"] == ends and ends >= 6 * 8  # 6 steps of 8 samples
    assert not any(isinstance(m, RelayReport) for m in plain[3])
    reports = [m for m in folded[3] if isinstance(m, RelayReport)]
    assert reports and sum(len(r.events) for r in reports) > len(reports)  # facts were folded


def test_new_weights_reach_the_serving_replicas_from_the_trainer_not_the_coordinator():
    """``PublishWeights(replica_ids)`` becomes a ``Publish`` naming the replicas' relays; the
    trainer hands the version to them and each replica loads it — the coordinator sends no
    ``InstallWeights`` for them, and every replica serves the last version at the end."""
    c = cfg(run={"total_steps": 6}, rollout={"standalone_replicas": 4})
    sent: list = []

    async def go():
        coord, _, trainer = local_run(c, relays=2)
        send = coord.executor.send
        coord.executor.send = lambda target, cmd: (sent.append((target, cmd)), send(target, cmd))[1]
        ended, seen = await run_to_end(coord)
        return ended, list(flatten(seen)), coord

    ended, seen, coord = virtual(go)
    assert ended.reason == "completed"
    publishes = [cmd for t, cmd in sent if isinstance(cmd, Publish)]
    assert publishes and all({d.relay for d in p.deliver} == {"node:0", "node:1"} for p in publishes)
    assert all(sorted(r for d in p.deliver for r in d.replica_ids) == sorted(coord.state.replicas) for p in publishes)
    assert not [cmd for _, cmd in sent if isinstance(cmd, InstallWeights)]
    intents = [m for m in seen if isinstance(m, PublishWeights)]
    assert intents and all(sorted(m.replica_ids) == sorted(coord.state.replicas) for m in intents)
    last = coord.state.trainer.version
    loaded = {m.replica_id for m in seen if isinstance(m, WeightsLoaded) and m.version == last}
    assert loaded == set(coord.state.replicas) and all(r.version == last for r in coord.state.replicas.values())


def test_a_replica_lost_with_facts_held_in_its_relay_has_them_posted_before_its_death():
    """Its ``ReplicaDown`` (the executor's) first flushes the relays: the coordinator never
    learns of the death before the samples the replica finished just before it."""
    c = cfg(run={"total_steps": 4}, rollout={"standalone_replicas": 2, "report_window_s": 0.5})

    async def go():
        coord, _, _ = local_run(c, relays=2)
        seen: list = []
        coord.sinks.append(seen.append)
        task = asyncio.ensure_future(coord.run())
        relay = coord.executor.relays["standalone-0"]
        while relay.held == 0:  # a fact of standalone-0 waits in its relay's (long) window
            await asyncio.sleep(0.001)
        held = list(relay._held)
        coord.executor.kill("standalone-0")
        await asyncio.wait_for(task, 3600)
        return seen, held

    seen, held = virtual(go)
    facts = list(flatten(seen))
    down = next(i for i, m in enumerate(facts) if isinstance(m, ReplicaDown))
    assert all(facts.index(h) < down for h in held)


@settings(max_examples=8, deadline=None)
@given(
    schedule=st.lists(
        st.tuples(st.integers(1, 10), st.sampled_from(("kill_replica", "trainer_dies", "coordinator_crashes", "stop"))),
        max_size=4,
    ),
    staleness=st.integers(0, 2),
)
@example(schedule=[(2, "kill_replica"), (4, "coordinator_crashes"), (5, "kill_replica")], staleness=1)
def test_any_fault_schedule_through_relays_completes_exactly_once(schedule, staleness):
    c = cfg(
        run={"total_steps": 10, "checkpoint_every": 2},
        validation={"every": 0},
        rollout={"standalone_replicas": 3, "max_staleness": staleness, "report_window_s": 0.01},
    )
    root = Path(tempfile.mkdtemp())
    try:
        batches, steps, _, coord = virtual(lambda: run_with_faults(c, schedule, root, relays=2))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert len(batches) == 10
    prompts = Counter(p for b in batches for p in b)
    assert set(prompts.values()) == {c.rollout.n_samples_per_prompt}, "a group trained twice or in part"
    assert sorted(prompts) == list(range(len(prompts)))
    assert all(e.metrics["batch/staleness_max"] <= staleness for e in steps)
