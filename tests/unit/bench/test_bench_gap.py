"""The gap to the bound, cut into named parts (``shunter.bench.analysis.gap``): on small simulated runs the
parts add up to the wall time above the best split's bound, the ladder's parts are what the
bound module computes, and a run's idle time lands where its schedule puts it."""

from __future__ import annotations

import msgspec
import pytest

from shunter.bench.analysis import bound
from shunter.bench.analysis.gap import PARTS, Gaps
from shunter.bench.analysis.summary import Summary
from shunter.bench.sim.cluster import run_sim
from tests.support.configs import SMALL, sim_config

COST = msgspec.structs.replace(SMALL, length_sigma=1.2)


def gaps_of(cfg, seed=3):
    summary, gaps = Summary(), Gaps()
    run_sim(cfg, COST, seed=seed, sinks=[summary, gaps])
    r = cfg.rollout
    fleet = bound.Fleet(
        bound.ModelMachine(COST, r.max_in_flight_per_replica),
        replicas=r.standalone_replicas or r.hybrid_replicas,
        steps_per_version=cfg.trainer.parameter_sync_step,
    )
    return summary, gaps, fleet


@pytest.mark.parametrize("eta", [1, 4])
def test_the_parts_add_up_to_the_distance_and_the_ladder_is_the_bounds(eta):
    summary, gaps, fleet = gaps_of(sim_config("separate", 2, 0, eta=eta, steps=8))
    work, wall = summary.work(), summary.result()["wall_s"]
    best = 0.9 * bound.bound_s(work, fleet, "overlapped")  # any reference: the parts measure from it
    gate = bound.Gate(eta, 2)
    parts = gaps.parts(work, fleet, "overlapped", best, gate)
    assert list(parts) == list(PARTS)
    assert sum(parts.values()) == pytest.approx(wall - best, abs=1e-6)
    own = bound.bound_s(work, fleet, "overlapped")
    assert parts["split"] == pytest.approx(own - best)
    first_at = summary.result()["first_step_s"]
    assert parts["first_batch"] == pytest.approx(bound.bound_s(work, fleet, "overlapped", first_at=first_at) - own)
    assert parts["first_batch"] >= 0 and parts["gate"] >= 0  # rungs only add constraints
    assert abs(parts["other"]) < 0.01 * (wall - best)  # the sweep accounts for the trainer's time
    assert parts["trainer_switches"] == 0  # nothing offloaded in this schedule


def test_a_tight_gate_costs_more_than_a_loose_one():
    tight = gaps_of(sim_config("separate", 2, 0, eta=0, steps=8))
    loose = gaps_of(sim_config("separate", 2, 0, eta=4, steps=8))
    g = [gs.parts(s.work(), f, "overlapped", 0.0, bound.Gate(e, 2)) for (s, gs, f), e in ((tight, 0), (loose, 4))]
    assert g[0]["gate"] > g[1]["gate"] >= 0


def test_a_run_with_no_step_has_no_parts():
    gaps = Gaps()
    assert gaps.parts([], bound.Fleet(bound.ModelMachine(COST, 8), 1), "overlapped", 0.0, None) == {}
    assert gaps.sweep() == []
