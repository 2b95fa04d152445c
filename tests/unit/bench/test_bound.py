"""The true bound: computed by hand on small cases, a lower bound on every simulated schedule,
and not a restatement of busy time (a fleet busy with stragglers is far from it)."""

from __future__ import annotations

import msgspec
import pytest

from shunter.bench.analysis import bound
from shunter.bench.analysis.bound import Fleet, StepWork
from shunter.bench.runner.scenario_file import Cluster, Meta, Scenario, Variant
from shunter.bench.runner.simulated import run_scenario
from shunter.bench.sim.cost_model import CostModel

RATE = bound.RateMachine(peak_tok_s=100, alone_tok_s=100)


def work(tokens: int, longest: int, step_s: float, sync_s: float = 0.0) -> StepWork:
    """A step whose samples are one of ``longest`` tokens and the rest in samples of 1."""
    return StepWork(((0, longest),) + ((0, 1),) * (tokens - longest), step_s, sync_s)


def test_overlapped_bound_by_hand():
    # 100 tokens per step at 100 tok/s: step 1 waits 1 s for its batch, then training (1 s)
    # paces the pipeline: 1 + 1 + 1 = 3 s
    w = [work(100, 10, 0.8, 0.2), work(100, 10, 1.0)]
    assert bound.bound_s(w, Fleet(RATE, replicas=1), "overlapped") == pytest.approx(3.0)
    # generation paces it when it is the slower side: ready at 1, 2, 3 s, the last trains 1 s
    assert bound.bound_s([work(100, 10, 0.5)] * 3, Fleet(RATE, replicas=1), "overlapped") == pytest.approx(3.5)
    # two replicas halve the generation
    assert bound.bound_s([work(100, 10, 0.5)] * 3, Fleet(RATE, replicas=2), "overlapped") == pytest.approx(2.0)


def test_a_long_sequence_is_no_faster_than_alone():
    fleet = Fleet(bound.RateMachine(peak_tok_s=1e6, alone_tok_s=50), replicas=1)
    w = [work(500, 500, 1.0)]
    assert bound.bound_s(w, fleet, "overlapped") == pytest.approx(10 + 1)
    assert bound.bound_s(w, fleet, "serial") == pytest.approx(10 + 1)


def test_serial_bound_adds_generation_and_training_per_step():
    w = [work(200, 10, 1.0), work(100, 10, 1.0)]
    assert bound.bound_s(w, Fleet(RATE, replicas=1), "serial") == pytest.approx(3 + 2)


def test_serial_bound_generates_a_versions_steps_at_once():
    # two steps a publish: their longest samples (5 s alone each) generate side by side
    fleet = Fleet(bound.RateMachine(peak_tok_s=1e6, alone_tok_s=100), replicas=1, steps_per_version=2)
    w = [work(600, 500, 1.0), work(600, 500, 1.0, 0.5)] * 2
    assert bound.bound_s(w, fleet, "serial") == pytest.approx(2 * (5 + 2.5))
    # the same steps published one by one pay the long sample every step
    assert bound.bound_s(w, fleet._replace(steps_per_version=1), "serial") == pytest.approx(4 * 5 + 5)


def test_lending_bound_is_the_larger_of_lent_capacity_and_gpu_seconds():
    w = [work(1000, 10, 1.0)] * 4
    fleet = Fleet(RATE, replicas=1, lendable=1, gpus=2, trainer_gpus=1)
    # GPU-seconds: 4000 tokens / 100 tok/s per GPU + 4 s of training on 1 GPU = 44 GPU-s on 2 GPUs
    assert bound.bound_s(w, fleet, "lending") == pytest.approx(22.0)
    # the lent capacity alone would allow 20 + 1 s
    assert bound.bound_s(w, fleet, "overlapped") == pytest.approx(41.0)


def test_the_cost_model_machine_counts_attention_prefill_and_the_kv_limit():
    cost = CostModel(
        decode_step_s=0.01,
        decode_step_s_per_seq=1e-4,
        decode_s_per_kv_token=1e-6,
        prefill_s_per_token=1e-4,
        kv_tokens=10_000,
    )
    m = bound.ModelMachine(cost, max_batch=64)
    load = m.load([(100, 1000), (100, 10)])
    assert load.tokens == 1010
    assert load.context == pytest.approx(1000 * 100 + 1000 * 999 / 2 + 10 * 100 + 10 * 9 / 2)
    assert load.prefill_s == pytest.approx(2 * 100 * 1e-4)
    # the longest alone: its prefill, then 1000 steps of one sequence whose context grows
    assert load.alone_s == pytest.approx(0.01 + 1000 * (0.01 + 1e-4) + 1e-6 * (1000 * 100 + 1000 * 999 / 2))
    # the steps needed are bounded by the KV cache here (600k tokens of context / 10k), not the batch
    steps = load.context / 10_000
    assert steps > load.tokens / 64
    assert m.work_s(load) == pytest.approx(0.01 * steps + 1e-4 * 1010 + 1e-6 * load.context + load.prefill_s)


def test_a_staleness_gate_bounds_how_early_a_step_can_start_its_longest():
    # training is fast and capacity ample, but every step's longest takes 10 s alone: at staleness
    # 1 the batch of step s starts only once step s-2 is trained and published
    fleet = Fleet(bound.RateMachine(peak_tok_s=1e9, alone_tok_s=10), replicas=1)
    w = [work(100, 100, 1.0)] * 4
    free = bound.bound_s(w, fleet, "overlapped")
    gated = bound.bound_s(w, fleet, "overlapped", bound.Gate(max_staleness=1))
    assert free == pytest.approx(10 + 4)  # all may start at once
    # steps 1, 2 ready at 10 (trained by 11, 12); step 3 starts when step 1 is published (11), ready
    # at 21, trained by 22; step 4 starts at 12, ready at 22, trained by 23
    assert gated == pytest.approx(23.0)
    f = bound.figures(w, fleet, "overlapped", 40.0, bound.Gate(max_staleness=1))
    assert f["bound_s"] == pytest.approx(14.0) and f["stale_bound_s"] == pytest.approx(23.0)


def test_no_work_no_time_and_no_replicas_is_refused():
    assert bound.bound_s([], Fleet(RATE, replicas=0), "overlapped") == 0.0
    with pytest.raises(ValueError, match="replicas"):
        bound.bound_s([work(1, 1, 1.0)], Fleet(RATE, replicas=0), "overlapped")


COST = CostModel(
    prompt_tokens=16,
    decode_step_s=0.01,
    decode_step_s_per_seq=1e-4,
    length_median=200,
    length_sigma=1.2,
    train_step_s=0.2,
    train_s_per_token=2e-4,
    weight_bytes=1e9,
    sleep_s=0.1,
    wake_s=0.1,
)


def scenario(variants: list[Variant], cost: CostModel = COST, spv: int = 1, **rollout) -> Scenario:
    return Scenario(
        scenario=Meta(name="bound", seeds=[1, 2], baseline="colocated"),
        cluster=Cluster(gpus=4),
        cost=cost,
        engine={
            "run": {"total_steps": 6},
            "rollout": {"n_samples_per_prompt": 4, "max_tokens": 2048, "max_model_len": 4096, **rollout},
            "trainer": {"ppo_mini_batch_size": 32, "parameter_sync_step": spv, "train_batch_size": 32 * spv},
        },
        variant=variants,
    )


def test_a_synchronous_run_of_several_steps_a_publish_does_not_beat_its_bound():
    sc = scenario([Variant(name="colocated", policy="colocated", max_staleness=0)], spv=2, max_in_flight_per_replica=64)
    m = run_scenario(sc, log=lambda *_: None)["metrics"]["colocated"]
    assert 0.5 < m["frac_of_bound"]["max"] <= 1 + 1e-6
    assert m["bound_first_step_s"]["max"] <= m["first_step_s"]["max"] + 1e-6


def test_no_simulated_schedule_beats_its_bound():
    sc = scenario(
        [
            Variant(name="colocated", policy="colocated", max_staleness=0),
            Variant(name="separate", policy="separate", trainer_gpus=2, max_staleness=2),
            Variant(name="separate 1:3", policy="separate", trainer_gpus=1, max_staleness=4),
            Variant(name="lend", policy="lend_when_idle", trainer_gpus=2, max_staleness=2),
        ],
        max_in_flight_per_replica=64,
    )
    res = run_scenario(sc, log=lambda *_: None)["metrics"]
    for name, m in res.items():
        assert 0 < m["frac_of_bound"]["max"] <= 1 + 1e-6, name
        assert m["frac_of_bound"]["max"] <= m["frac_of_first_step_bound"]["max"] <= 1 + 1e-6, name
        assert 0 < m["rollout_work_frac"]["max"] <= 1 + 1e-6, name
        # the replicas' ledger: trained work, packing, recompute, stopped and the rest make 1
        ledger = ("work", "packing", "recompute", "stopped", "other")
        assert sum(m[f"rollout_{k}_frac"]["median"] for k in ledger) == pytest.approx(1.0, abs=0.02), name
        for k in ledger:
            assert -1e-6 <= m[f"rollout_{k}_frac"]["min"] <= 1 + 1e-6, (name, k)
        assert m["bound_first_step_s"]["max"] <= m["first_step_s"]["max"] + 1e-6, name
        assert m["best_split_bound_s"]["median"] > 0
        # the best split's bound is never above the variant's own overlapped bound
        if name.startswith("separate"):
            assert m["best_split_bound_s"]["max"] <= m["bound_s"]["max"] * (1 + 1e-9)


def test_a_fleet_busy_with_stragglers_is_far_from_its_bound():
    """Each replica could decode 256 sequences at once but gets 4: always busy (rollout idle
    near 0), yet nowhere near the bound, which counts capacity, not busy flags."""
    sc = scenario(
        [Variant(name="separate", policy="separate", trainer_gpus=2, max_staleness=0)],
        cost=msgspec.structs.replace(COST, decode_step_s_per_seq=1e-4, train_step_s=0.01, train_s_per_token=1e-6),
        max_in_flight_per_replica=256,
    )
    sc = msgspec.structs.replace(
        sc,
        scenario=msgspec.structs.replace(sc.scenario, baseline=""),
        engine={**sc.engine, "trainer": {"ppo_mini_batch_size": 8, "parameter_sync_step": 1, "train_batch_size": 8}},
    )
    m = run_scenario(sc, log=lambda *_: None)["metrics"]["separate"]
    assert m["frac_of_bound"]["max"] < 0.5
    # the ledger names why: steps that carried 4 sequences where 256 fit
    assert m["rollout_packing_frac"]["min"] > 0.5


def test_a_variant_that_admits_fewer_sequences_is_held_to_the_same_machine():
    """A lower ``max_in_flight_per_replica`` is the variant's choice, not the hardware's: its
    bound (and the best split's) is the one of the largest batch the scenario allows, so
    capping the batch can never loosen the figure it is judged by."""
    from shunter.bench.runner.simulated import bound_batch, fleet, variant_setup

    capped = Variant(name="capped", policy="separate", trainer_gpus=2, max_staleness=2)
    capped = msgspec.structs.replace(capped, engine={"rollout": {"max_in_flight_per_replica": 8}})
    wide = Variant(name="wide", policy="separate", trainer_gpus=2, max_staleness=2)
    sc = scenario([capped, wide], max_in_flight_per_replica=64)
    sc = msgspec.structs.replace(sc, scenario=msgspec.structs.replace(sc.scenario, baseline=""))
    assert bound_batch(sc) == 64
    for v in sc.variant:
        cfg, cost = variant_setup(sc, v)
        assert fleet(sc, v, cfg, cost).machine.max_batch == 64
    res = run_scenario(sc, log=lambda *_: None)["metrics"]
    assert res["capped"]["bound_s"]["median"] == pytest.approx(res["wide"]["bound_s"]["median"], rel=0.05)
    assert res["capped"]["frac_of_bound"]["max"] <= 1 + 1e-6
