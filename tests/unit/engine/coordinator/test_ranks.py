"""RankTable: one rank pool for hybrid and standalone replicas (verl's start_rank bug class)."""

from __future__ import annotations

import itertools
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shunter.engine.coordinator.ranks
from shunter.engine.coordinator.ranks import RankTable, RankTableState, RegistryStateError


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


# -- saved state, as operators find it on disk (issue 14) --------------------------------------
def _saved(tmp_path, run_id="r"):
    t = RankTable(run_id)
    for i in range(3):
        t.assign(f"s{i}", "standalone")
    path = tmp_path / "registry.msgpack"
    path.write_bytes(t.snapshot())
    return path, t


def test_a_saved_table_comes_back_whole(tmp_path):
    path, t = _saved(tmp_path)
    back = RankTable.load(path, "r")
    assert back is not None and back.leases() == t.leases() and back.generation == 3
    assert RankTable.load(tmp_path / "none.msgpack", "r") is None


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda b: b"", "empty"),
        (lambda b: b[: len(b) // 2], "does not decode"),
        (lambda b: b"\x00" + b[1:], "does not decode"),
    ],
    ids=["zero-bytes", "half", "first-byte"],
)
def test_a_damaged_state_file_is_refused_never_reset(tmp_path, damage, why):
    """Was: a 0-byte file silently reset the table, so the next replica got the rank and name
    of one still holding them."""
    path, _ = _saved(tmp_path)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(RegistryStateError, match=why) as err:
        RankTable.load(path, "r")
    assert str(path) in str(err.value) and "move the file aside" in str(err.value)


def test_another_runs_state_is_refused(tmp_path):
    path, _ = _saved(tmp_path, run_id="other-run")
    with pytest.raises(RegistryStateError, match="belongs to run 'other-run', not 'r'"):
        RankTable.load(path, "r")


def test_an_inconsistent_table_is_refused_by_explicit_checks_not_asserts(tmp_path):
    """The checks survive ``python -O`` (they are raises, not asserts)."""
    state = msgspec.msgpack.decode(_saved(tmp_path)[0].read_bytes(), type=RankTableState)
    state.free = [1]  # rank 1 is held by s1 too
    with pytest.raises(RegistryStateError, match="a held rank is also free"):
        RankTable.restore(msgspec.msgpack.encode(state), "r")
    src = Path(shunter.engine.coordinator.ranks.__file__).read_text()
    assert "assert " not in src


def test_the_registry_actor_class_refuses_a_damaged_state_file(tmp_path):
    from shunter.actors.registry_actor import ReplicaRegistryActor

    path, _ = _saved(tmp_path)
    path.write_bytes(b"")
    with pytest.raises(RegistryStateError):
        ReplicaRegistryActor("r", None, str(path))
    path.unlink()
    actor = ReplicaRegistryActor("r", None, str(path))  # no file: a new run's empty table
    assert actor.leases() == [] and path.is_file()


def test_a_pooled_replica_keeps_its_actor_name_and_takes_a_rank_of_this_run():
    made = RankTable("run-a").assign("standalone-0", "standalone")  # the run that started its engine
    t = RankTable("run-b")
    t.assign("hybrid-0", "hybrid")
    pooled = t.assign("standalone-1", "standalone", made.actor_name)
    assert pooled.actor_name == made.actor_name and pooled.rank == 1
    assert t.assign("standalone-1", "standalone") == pooled  # idempotent, name and all
    t.check()
