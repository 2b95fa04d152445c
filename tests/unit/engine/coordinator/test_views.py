"""The replicas of a view: built from what changed, equal to a full rebuild whatever the
order of registrations and changes, and a view handed out never changes afterwards."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shunter.engine.coordinator.state import EngineState, ReplicaState
from shunter.events import EngineView, ReplicaView, ReplicaViews


def full(state: EngineState, in_flight) -> tuple[ReplicaView, ...]:
    return tuple(
        ReplicaView(
            replica_id=r.replica_id,
            kind=r.kind,
            rank=r.rank,
            mode=r.mode,
            in_flight=in_flight(r.replica_id),
            version=r.version,
            samples_per_s=r.rate.rate(state.now),
        )
        for r in sorted(state.replicas.values(), key=lambda r: r.rank)
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "touch", "view"]), st.integers(0, 400)), max_size=120))
def test_incremental_views_equal_a_full_rebuild(ops):
    state = EngineState("r", 1, 1, 1, 1, 0, 0, "engine")
    flight: dict[str, int] = {}
    handed: list[tuple[ReplicaViews, tuple[ReplicaView, ...]]] = []
    for op, x in ops:
        if op == "add" and f"r{x}" not in state.replicas:
            state.replicas[f"r{x}"] = ReplicaState(f"r{x}", "standalone", x, "rollout")
            state.touch(f"r{x}")
        elif op == "touch" and state.replicas:
            rid = sorted(state.replicas)[x % len(state.replicas)]
            state.replicas[rid].version += 1
            flight[rid] = flight.get(rid, 0) + 1
            state.touch(rid)
        views = state.replica_views(lambda rid: flight.get(rid, 0))
        assert views == full(state, lambda rid: flight.get(rid, 0))
        for v in views:
            assert EngineView(replicas=views).replica(v.replica_id) is v
        handed.append((views, tuple(views)))
    for views, then in handed:  # a view never changes once handed out
        assert views == then and len(views) == len(then)


def test_sequence_behaviour():
    vs = [ReplicaView(replica_id=f"r{i}", kind="standalone", rank=i, mode="rollout") for i in range(150)]
    rv = ReplicaViews.of(vs)
    assert len(rv) == 150 and rv[0] is vs[0] and rv[-1] is vs[-1] and rv[64] is vs[64]
    assert rv[10:12] == (vs[10], vs[11]) and list(rv) == vs and rv == tuple(vs)
    assert rv.find("r149") is vs[149] and rv.find("nope") is None
    assert EngineView(replicas=tuple(vs)).replica("r3") is vs[3]
