"""RankTable: one rank pool for hybrid and standalone replicas (verl's start_rank bug class)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shunter.engine.ranks import RankTable


def test_hybrid_and_standalone_never_collide_in_any_order():
    ids = [("h0", "hybrid"), ("h1", "hybrid"), ("s0", "standalone"), ("s1", "standalone"), ("s2", "standalone")]
    for order in itertools.permutations(ids):
        t = RankTable("r")
        leases = [t.assign(i, k) for i, k in order]
        assert sorted(x.rank for x in leases) == list(range(5))
        assert len({x.actor_name for x in leases}) == 5
        t.check()


def test_assign_is_idempotent_and_kind_is_fixed():
    t = RankTable("r")
    a = t.assign("s0", "standalone")
    assert t.assign("s0", "standalone") == a
    with pytest.raises(ValueError, match="already holds rank 0 as standalone"):
        t.assign("s0", "hybrid")
    with pytest.raises(ValueError, match="kind must be one of"):
        t.assign("x", "gpu")


def test_released_rank_is_reused_smallest_first_with_a_new_name():
    t = RankTable("r")
    for i in range(4):
        t.assign(f"s{i}", "standalone")
    old = t.release("s2")
    t.release("s1")
    assert t.release("s1") is None  # twice is harmless
    new = t.assign("h9", "hybrid")
    assert new.rank == 1
    again = t.assign("h10", "hybrid")
    assert again.rank == 2 and again.actor_name != old.actor_name
    t.check()


def test_names_are_scoped_by_run():
    a, b = RankTable("run-a"), RankTable("run-b")
    assert a.assign("s0", "standalone").actor_name != b.assign("s0", "standalone").actor_name
    with pytest.raises(ValueError):
        RankTable("")


def test_snapshot_restore_resumes_identically():
    t = RankTable("r")
    for i in range(3):
        t.assign(f"s{i}", "standalone")
    t.release("s0")
    u = RankTable.restore(t.snapshot())
    assert u.leases() == t.leases()
    assert u.assign("h", "hybrid").rank == t.assign("h", "hybrid").rank == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["assign", "release", "restore"]),
            st.integers(0, 7),
            st.sampled_from(["hybrid", "standalone"]),
        ),
        max_size=60,
    )
)
def test_invariants_hold_under_random_schedules(ops):
    t = RankTable("r")
    kinds: dict[str, str] = {}
    for op, i, kind in ops:
        rid = f"x{i}"
        if op == "assign":
            kind = kinds.setdefault(rid, kind) if t.get(rid) else kind
            kinds[rid] = kind
            t.assign(rid, kind)
        elif op == "release":
            t.release(rid)
        else:
            t = RankTable.restore(t.snapshot())
        t.check()
        held = [x.rank for x in t.leases()]
        assert held == sorted(set(held))
