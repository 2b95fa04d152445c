"""SampleBuffer (accounting, gate, staleness) and Dispatcher (least in flight)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shunter.engine.coordinator.buffer import SampleBuffer
from shunter.engine.coordinator.deadlines import plan
from shunter.engine.coordinator.dispatcher import Dispatcher
from shunter.events import PromptSpec, Sample
from tests.support.fakes import one_token_sample


def buf(**kw):
    args = dict(group_size=2, groups_per_batch=2, batches_per_version=1, max_staleness=1, on_stale="wait")
    args.update(kw)
    return SampleBuffer(**args)


def finish(b: SampleBuffer, gid: int, version: int):
    done = False
    for k in range(b.group_size):
        done = b.add(one_token_sample(f"{gid}.{k}", gid, version))
    return done


def test_gate_admits_max_staleness_plus_one_versions_of_groups():
    b = buf(max_staleness=1)  # 2 groups per version
    opened = 0
    while b.capacity(0) > 0:
        b.open(PromptSpec(prompt_id=opened, text="1>"), 0)
        opened += 1
    assert opened == 4
    assert b.capacity(1) == 2


def test_admit_staleness_admits_fewer_groups_and_max_staleness_still_decides_what_trains():
    b = buf(max_staleness=3, admit_staleness=1)  # 2 groups per version
    opened = 0
    while b.capacity(0) > 0:
        b.open(PromptSpec(prompt_id=opened, text="1>"), 0)
        opened += 1
    assert opened == 4  # (1 + 0 + 1) * 2, not (3 + 0 + 1) * 2
    assert b.capacity(1) == 2 and b.capacity(3) == 6
    for gid in range(4):
        finish(b, gid, 0)
    for version in (2, 3):  # two versions later, then three: within max_staleness, trained
        batch, dropped = b.take(version)
        assert len(batch.group_ids) == 2 and not dropped and batch.max_staleness == version
    b.check()
    assert buf(max_staleness=2).admit_staleness == 2  # unset (-1): the gate keeps max_staleness
    with pytest.raises(ValueError, match=r"admit_staleness \(3\) must be at most max_staleness \(2\)"):
        buf(max_staleness=2, admit_staleness=3)


@settings(max_examples=60, deadline=None)
@given(eta=st.integers(0, 5), data=st.data())
def test_a_lower_admission_bound_never_admits_a_group_the_full_gate_would_not(eta, data):
    """Whatever the versions replicas ask at, a gate at ``admit_staleness <= max_staleness``
    admits a prefix of what the gate at ``max_staleness`` admits: the deadlines' guarantees,
    proved for the full gate, hold for it."""
    admit = data.draw(st.integers(0, eta))
    versions = data.draw(st.lists(st.integers(0, 6), min_size=1, max_size=40).map(sorted))
    full, low = buf(max_staleness=eta), buf(max_staleness=eta, admit_staleness=admit)
    for i, v in enumerate(versions):
        for b in (full, low):
            if b.capacity(v) > 0:
                b.open(PromptSpec(prompt_id=i, text="1>"), v)
        assert low.dispatched <= full.dispatched
        assert low.dispatched <= (admit + v + 1) * low.groups_per_version


def test_wait_mode_trains_finished_groups_first_and_waits_only_for_a_due_straggler():
    b = buf()  # 2 groups a batch, staleness 1: groups of version 0 may train on versions 0 and 1
    for i in range(4):
        b.open(PromptSpec(prompt_id=i, text="1>"), 0)
    finish(b, 1, 0)
    finish(b, 2, 0)
    assert b.ready_batches(0) == 1  # group 0 still generates: it can wait for the next batch
    batch, dropped = b.take(0)
    assert batch.group_ids == [1, 2] and not dropped
    finish(b, 3, 0)
    # the next batch trains on version 1, the last group 0 may: it must be in it
    assert b.ready_batches(1) == 0
    finish(b, 0, 0)
    batch, dropped = b.take(1)
    assert sorted(batch.group_ids) == [0, 3] and not dropped and batch.max_staleness == 1
    b.check()


def test_wait_mode_takes_the_due_groups_before_younger_ones_that_finished_first():
    b = buf(max_staleness=1)
    for i in range(4):  # the gate: 4 groups on version 0
        b.open(PromptSpec(prompt_id=i, text="1>"), 0)
    for gid in (0, 1):
        finish(b, gid, 0)
    b.take(0)
    for i in range(4, 6):
        b.open(PromptSpec(prompt_id=i, text="1>"), 1)
    for gid in (4, 5, 3, 2):  # version 1's groups finish before version 0's
        finish(b, gid, 1 if gid >= 4 else 0)
    batch, _ = b.take(1)
    assert sorted(batch.group_ids) == [2, 3]  # due on version 1; 4 and 5 may wait for version 2
    b.check()


def test_a_publish_sooner_than_the_pace_drops_the_groups_it_made_late_and_reopens_the_gate():
    """A user's loop publishes after one of two batches a version: the version-0 groups ready
    and those still generating can no longer train (staleness 0); they are dropped, ready ones
    at the publish and the others as they complete, so the gate lets their replacements start."""
    b = buf(max_staleness=0, groups_per_batch=2, batches_per_version=2)  # 4 groups a version
    for i in range(4):
        b.open(PromptSpec(prompt_id=i, text="1>"), 0)
    for gid in (0, 1, 2):
        finish(b, gid, 0)
    batch, _ = b.take(0)
    assert batch is not None and b.capacity(0) == 0
    assert [g.group_id for g in b.prune(1)] == [next(g for g in (0, 1, 2) if g not in batch.group_ids)]
    assert finish(b, 3, 0) and b.drop_if_late(3, 1).group_id == 3
    assert b.capacity(1) == 6 and b.in_flight == 0 and b.ready == 0  # 8 - the 2 trained
    assert b.counters()["dropped_stale"] == 2
    b.check()


def test_a_group_generated_on_newer_weights_than_it_was_dispatched_on_trains_on_them():
    """Dispatched on version 0, generated after the replica loaded version 1: its staleness
    counts from version 1, and so does the plan (it waited forever for a version-0 slot)."""
    b = buf(max_staleness=0, groups_per_batch=2, batches_per_version=1)
    for i in range(2):
        b.open(PromptSpec(prompt_id=i, text="1>"), 0)
    for gid in (0, 1):
        finish(b, gid, 1)
    assert b.ready_batches(1) == 1
    batch, dropped = b.take(1)
    assert batch.group_ids == [0, 1] and batch.max_staleness == 0 and not dropped
    b.check()


def test_drop_mode_takes_finished_groups_and_drops_stale_ones():
    b = buf(on_stale="drop", max_staleness=0)
    for i in range(4):
        b.open(PromptSpec(prompt_id=i, text="1>"), 0)
    finish(b, 2, 0)
    finish(b, 3, 0)
    assert b.ready_batches() == 1
    batch, dropped = b.take(1)  # trainer already at version 1: both are stale
    assert batch is None and [g.group_id for g in dropped] == [2, 3]
    assert b.counters()["dropped_stale"] == 2
    b.check()


def test_samples_of_dropped_groups_are_ignored_and_counted_once():
    b = buf()
    b.open(PromptSpec(prompt_id=0, text="1>"), 0)
    b.drop(0, "failed")
    assert finish(b, 0, 0) is False
    assert b.counters()["dropped"] == 1
    b.check()


def test_budget_overrun_is_rejected():
    b = buf()
    b.open(PromptSpec(prompt_id=0, text="1>"), 0)
    with pytest.raises(ValueError, match="overrun its budget"):
        b.add(
            Sample(
                sample_id="0.0",
                group_id=0,
                prompt_id=0,
                prompt_token_ids=[1],
                token_ids=[2, 3],
                logprobs=[0.0, 0.0],
                versions=[0, 0],
                max_tokens=1,
            )
        )


def test_groups_due_beyond_the_pace_after_an_early_publish_drain_one_take_at_a_time():
    """Hypothesis's counterexample: four groups on version 0, a publish before any take (a
    user's loop), so four groups are due on version 1, which the pace gives one batch: each
    take still finds the next batch on version 1, and nothing is left behind."""
    b = buf(max_staleness=1)
    for gid in range(4):
        b.open(PromptSpec(prompt_id=gid, text="1>"), 0)
    for gid in range(4):
        finish(b, gid, 0)
    b.prune(1)
    taken = []
    for _ in range(2):
        batch, _ = b.take(1)
        assert batch is not None and batch.max_staleness == 1
        taken += batch.group_ids
    assert sorted(taken) == [0, 1, 2, 3] and b.ready == 0


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["open", "finish", "take", "publish", "drop", "restore"]), st.integers(0, 30)),
        max_size=80,
    ),
    st.sampled_from(["wait", "drop"]),
    st.integers(0, 3),
)
def test_accounting_and_staleness_under_random_schedules(ops, mode, eta):
    """Whatever the order (publishes at any time included), every group is accounted for, no
    trained group exceeds the bound, and the incremental bookkeeping equals a full scan's."""
    b = buf(on_stale=mode, max_staleness=eta)
    version = 0
    for op, x in ops:
        if op == "open" and b.capacity(version) > 0:
            b.open(PromptSpec(prompt_id=b.dispatched, text="1>"), version)
        elif op == "finish":
            live = [g for g in list(b._groups) if g not in b._ready]
            if live:
                gid = live[x % len(live)]  # generated on its dispatch weights or newer ones
                if finish(
                    b, gid, b.group(gid).dispatch_version + x % 3 * (version - b.group(gid).dispatch_version) // 2
                ):
                    b.drop_if_late(gid, version)
        elif op == "take":
            batch, _ = b.take(version)
            if batch is not None:
                assert batch.max_staleness <= eta
        elif op == "publish":
            version += 1
            b.prune(version)
        elif op == "drop" and b._groups:
            b.drop(list(b._groups)[x % len(b._groups)], "failed")
        elif op == "restore":
            b.restore(b.snapshot())
        b.check()
        assert b.formable(version=version) == naive_formable(b, version)
        # nothing past the bound sits ready holding a place under the gate (publishes come at
        # any time here, sooner than batches_per_version included: a user's loop does that)
        assert all(b.staleness(b.group(g), version) <= eta for g in b._ready)
        if not b.in_flight:  # and with nothing generating, a full batch of ready groups is formable (no stall)
            # (not every one at once: the plan counts batches at the trainer's pace, and after a
            # publish sooner than the pace more groups may be due on this version than it has
            # slots; each take's plan gives this version one more slot, so they drain one by one)
            assert b.ready_batches(version) >= min(1, b.ready // b.groups_per_batch)


def naive_formable(b: SampleBuffer, version: int) -> list[list]:
    """What the incremental bookkeeping must equal: every ready group (drop mode), or the
    deadline plan over levels counted afresh (wait mode)."""
    g = b.groups_per_batch
    if b.on_stale == "drop":
        c = list(b._ready)
        return [[b._groups[i] for i in c[k : k + g]] for k in range(0, len(c) - g + 1, g)]
    levels = Counter(grp.rule_level() for grp in b._groups.values())
    ready = list(b._ready)
    level = {gid: b._groups[gid].level for gid in ready}
    by_level: dict[int, list[int]] = {}
    for gid in ready:
        by_level.setdefault(level[gid], []).append(gid)
    ready_levels = Counter(level.values())
    return [
        [b._groups[i] for i in batch]
        for batch in plan(b._pace(version), levels, ready_levels, by_level, ready, level.__getitem__)
    ]


@pytest.mark.parametrize("seed", range(40))
def test_wait_mode_never_drops_for_staleness_and_never_waits_with_nothing_generating(seed):
    """Under the gate, with a publish every ``spv`` batches (or, ``late``, whenever the
    trainer gets to it after at least ``spv``) and replicas on the current weights or the
    previous ones, no group is ever trained past the bound or dropped as stale; whenever
    nothing is generating, every full batch of ready groups is formable. Random walks:
    groups finish in any order, takes come at any time; in half the walks the gate admits at a
    lower bound than the one trained to (``admit_staleness``)."""
    rng = random.Random(seed)
    for _ in range(25):
        eta, per_batch, spv, late = rng.randint(0, 3), rng.randint(1, 3), rng.randint(1, 3), rng.random() < 0.3
        admit = rng.randint(0, eta) if rng.random() < 0.5 else -1
        b = buf(max_staleness=eta, groups_per_batch=per_batch, batches_per_version=spv, admit_staleness=admit)
        version, taken = 0, 0
        for _ in range(150):
            op = rng.choices(["open", "open_lagging", "finish", "take", "publish"], [4, 1, 4, 2, 1])[0]
            v_open = version if op == "open" else max(0, version - 1)
            if op.startswith("open") and b.capacity(v_open) > 0:
                b.open(PromptSpec(prompt_id=b.dispatched, text="1>"), v_open)
            elif op == "finish" and b.in_flight:  # on its dispatch weights, or newer ones loaded since
                gid = rng.choice([g for g in b._groups if g not in b._ready])
                finish(b, gid, rng.randint(b.group(gid).dispatch_version, version))
            elif op == "take":
                batch, dropped = b.take(version)
                assert not dropped
                if batch is not None:
                    assert batch.max_staleness <= eta
                    taken += 1
                    if taken >= spv and not late:
                        version, taken = version + 1, 0
            elif op == "publish" and late and taken >= spv:
                version, taken = version + 1, 0
            b.check()
            if not b.in_flight:
                assert b.ready_batches(version) == b.ready // per_batch
        assert b.counters().get("dropped_stale", 0) == 0


def test_dispatcher_picks_least_loaded_with_room():
    d = Dispatcher()
    d.add("a", rank=0, capacity=8)
    d.add("b", rank=1, capacity=8)
    assert d.pick(4) == "a"
    d.started("a", 4)
    assert d.pick(4) == "b"
    d.started("b", 6)
    assert d.pick(4) == "a"
    d.started("a", 4)
    assert d.pick(4) is None
    d.remove("a")
    assert "a" not in d and d.in_flight("a") == 8  # count kept until samples come back
    d.finished("a", 8)
    assert d.in_flight("a") == 0
    d.finished("a", 5)
    assert d.in_flight("a") == 0  # never negative
    assert d.active() == ["b"]


def test_dispatcher_with_unequal_capacities_finds_the_replica_with_room():
    d = Dispatcher()
    d.add("small", rank=0, capacity=4)
    d.add("big", rank=1, capacity=16)
    d.started("big", 8)
    d.started("small", 2)
    assert d.pick(4) == "big"  # the least loaded has no room for 4; the bigger one has
    d.remove("big")
    assert d.pick(4) is None


def test_dispatcher_picks_only_replicas_with_the_weights_asked_for():
    d = Dispatcher()
    d.add("old", rank=0, capacity=8, version=0)
    d.add("new", rank=1, capacity=8, version=1)
    d.started("new", 6)
    assert d.pick(1) == "old"  # the least loaded
    assert d.pick(1, at_least=1) == "new"  # the least loaded has older weights
    d.started("new", 2)
    assert d.pick(1, at_least=1) is None  # the one with new weights is full
    d.set_version("old", 1)
    assert d.pick(1, at_least=1) == "old"
    assert d.pick(9, at_least=0) is None


def test_a_sample_cut_by_its_replicas_death_resumes_only_on_the_weights_its_group_started_on():
    """Replica ``a`` loaded version 1 and took a group; it dies while ``b`` is still loading
    version 1. The group's samples wait for ``b``'s load instead of resuming on version 0: the
    gate admitted the group at version 1 and the deadlines count it from there, so tokens of
    version 0 would make wait mode drop it as stale (found under a fault schedule)."""
    from itertools import count

    from shunter.engine.coordinator.inflight import InFlight
    from shunter.engine.coordinator.state import EngineState, ReplicaState
    from shunter.events import Generate, SamplingSpec

    class Sent:  # the executor's one method the pump uses: what was sent where
        def __init__(self):
            self.sent = []

        def send(self, rid, cmd):
            self.sent.append((rid, cmd))

    state = EngineState(
        run_id="t",
        ppo_mini_batch_size=4,
        parameter_sync_step=1,
        train_batch_size=4,
        n_samples_per_prompt=2,
        max_staleness=1,
        validate_every=0,
        trainer_driver="engine",
    )
    state.trainer.version = 1
    d, ex = Dispatcher(), Sent()
    for rank, (rid, version) in enumerate([("a", 1), ("b", 0)]):
        state.replicas[rid] = ReplicaState(rid, "standalone", rank, "rollout", version)
        d.add(rid, rank=rank, capacity=4, version=version)
    prompts = (PromptSpec(prompt_id=i, text="3 1 2") for i in count())
    f = InFlight(state, buf(), d, ex, prompts, SamplingSpec(max_tokens=4), 2)
    f.groups_wanted = 1
    f.pump()
    assert [(rid, type(c)) for rid, c in ex.sent] == [("a", Generate)]  # b is older: a takes the group
    ex.sent.clear()
    for aborted in f.recover("a"):
        f.finished(aborted.sample_id, aborted.group_id, "a")
        f.requeue(aborted.partial)
    d.forget("a")
    f.pump()
    assert ex.sent == [], "resumed on weights older than its group's"
    d.set_version("b", 1)
    f.pump()
    assert [rid for rid, c in ex.sent] == ["b", "b"] and all(c.resume for _, c in ex.sent)
