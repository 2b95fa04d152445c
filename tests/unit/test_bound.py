"""The true bound: computed by hand on small cases, a lower bound on every simulated schedule,
and not a restatement of busy time (a fleet busy with stragglers is far from it)."""

from __future__ import annotations

import msgspec
import pytest

from shunter.bench import bound
from shunter.bench.bound import Capacity, StepWork
from shunter.bench.scenario import Cluster, Meta, Scenario, Variant, run_scenario
from shunter.bench.sim import CostModel


def test_overlapped_bound_by_hand():
    # 100 tokens per step at 100 tok/s: step 1 waits 1 s for its batch, then training (1 s)
    # paces the pipeline: 1 + 1 + 1 = 3 s
    work = [StepWork(100, 10, 0.8, 0.2), StepWork(100, 10, 1.0)]
    assert bound.bound_s(work, Capacity(rollout_tok_s=100, alone_tok_s=100), "overlapped") == pytest.approx(3.0)
    # generation paces it when it is the slower side: ready at 1, 2, 3 s, the last trains 1 s
    work = [StepWork(100, 10, 0.5)] * 3
    assert bound.bound_s(work, Capacity(rollout_tok_s=100, alone_tok_s=100), "overlapped") == pytest.approx(3.5)


def test_a_long_sequence_is_no_faster_than_alone():
    work = [StepWork(100, 500, 1.0)]
    cap = Capacity(rollout_tok_s=1e6, alone_tok_s=50)
    assert bound.bound_s(work, cap, "overlapped") == pytest.approx(10 + 1)
    assert bound.bound_s(work, cap, "serial") == pytest.approx(10 + 1)


def test_serial_bound_adds_generation_and_training_per_step():
    work = [StepWork(200, 10, 1.0), StepWork(100, 10, 1.0)]
    assert bound.bound_s(work, Capacity(rollout_tok_s=100, alone_tok_s=100), "serial") == pytest.approx(3 + 2)


def test_lending_bound_is_the_larger_of_lent_capacity_and_gpu_seconds():
    work = [StepWork(1000, 10, 1.0)] * 4
    cap = Capacity(rollout_tok_s=100, alone_tok_s=100, lendable_tok_s=100, gpus=2, trainer_gpus=1, gpu_tok_s=100)
    # GPU-seconds: 4000 tokens / 100 tok/s per GPU + 4 s of training on 1 GPU = 44 GPU-s on 2 GPUs
    assert bound.bound_s(work, cap, "lending") == pytest.approx(22.0)
    # without the GPU-seconds term the lent capacity alone would allow 20 + 1 s
    assert bound.bound_s(work, cap._replace(gpu_tok_s=0), "lending") == pytest.approx(21.0)


def test_no_work_no_time_and_bad_capacity_is_refused():
    assert bound.bound_s([], Capacity(0, 0), "overlapped") == 0.0
    with pytest.raises(ValueError, match="capacity"):
        bound.bound_s([StepWork(1, 1, 1.0)], Capacity(0, 1), "overlapped")


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


def scenario(variants: list[Variant], cost: CostModel = COST, **rollout) -> Scenario:
    return Scenario(
        scenario=Meta(name="bound", seeds=[1, 2], baseline="colocated"),
        cluster=Cluster(gpus=4),
        cost=cost,
        engine={
            "run": {"total_steps": 6},
            "rollout": {"n_samples_per_prompt": 4, "max_tokens": 2048, "max_model_len": 4096, **rollout},
            "trainer": {"ppo_mini_batch_size": 32, "parameter_sync_step": 1, "train_batch_size": 32},
        },
        variant=variants,
    )


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
