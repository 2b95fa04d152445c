"""Multi-turn trajectories in the simulator (``bench.sim.turns``) and the environment term of
the true bound: a trajectory follows its plan wherever it resumes, its tool calls spend their
drawn latency on the virtual clock, observations are masked, and no multi-turn run beats its
bound — which counts each trajectory's tool calls on its own critical path."""

from __future__ import annotations

import asyncio
import json
import random

import looptime
import msgspec
import pytest

from shunter.bench.__main__ import main as bench_main
from shunter.bench.analysis import bound
from shunter.bench.analysis.summary import Summary
from shunter.bench.report.markdown import write_report
from shunter.bench.runner.scenario_file import load
from shunter.bench.runner.simulated import variant_setup
from shunter.bench.sim.backends import SimBackend, SimTokenizer
from shunter.bench.sim.cluster import run_sim
from shunter.bench.sim.cost_model import CostModel, LengthSampler
from shunter.bench.sim.turns import CALL, CALL_TEXT, FILL, KEY0, OBS, Plans, SimTool, spell
from shunter.engine.config import from_dict
from shunter.engine.replica.backend import GenParams
from shunter.events import SampleEnd, SampleResumed, StepEnd
from tests.support.configs import SMALL

TURNS = msgspec.structs.replace(  # the simulator tests' small cluster, with tool calls
    SMALL,
    length_median=30,
    tool_calls_max=3,
    observation_tokens=8,
    env_latency_median_s=0.5,
    env_latency_sigma=1.2,
)


def sim_config(policy="separate", standalone=2, hybrid=0, eta=1, steps=6, max_turns=8, **rollout):
    return from_dict(
        {
            "run": {"total_steps": steps, "policy": policy, "stall_timeout_s": 3600.0},
            "task": {"max_turns": max_turns, "env_timeout_s": 600.0},
            "rollout": {
                "standalone_replicas": standalone,
                "hybrid_replicas": hybrid,
                "n_samples_per_prompt": 4,
                "max_tokens": 512,
                "max_model_len": 1024,
                "max_staleness": eta,
                "max_in_flight_per_replica": 32,
                **rollout,
            },
            "trainer": {"ppo_mini_batch_size": 32, "parameter_sync_step": 1, "train_batch_size": 32},
            "validation": {"every": 0},
        }
    )


def test_a_plan_is_a_function_of_its_key_and_a_position_of_its_tokens():
    a, b = Plans(TURNS, LengthSampler(TURNS, 1)), Plans(TURNS, LengthSampler(TURNS, 2))
    for key in range(KEY0, KEY0 + 200):
        p = a.plan(key)
        assert p == b.plan(key) and 1 <= len(p) <= TURNS.tool_calls_max + 1 and min(p) >= 2
    key = next(k for k in range(KEY0, 10_000) if len(a.plan(k)) >= 3)
    t0, t1, t2 = a.plan(key)[:3]
    # the first request draws a key; a resumed one reads it
    first, left, call = a.next_turn([], True)
    assert first >= KEY0 and left == a.plan(first)[0] and call == (len(a.plan(first)) > 1)
    # cut after 1 token of turn 0; turn 0 done and observed; 2 tokens into turn 1; turn 2 begun
    assert a.next_turn([key], True) == (key, t0 - 1, True)
    turn0 = [key] + [FILL] * (t0 - 2) + [CALL]
    assert a.next_turn(turn0 + [OBS] * 8, True) == (key, t1, True)
    assert a.next_turn(turn0 + [OBS] * 8 + [FILL, FILL], True) == (key, t1 - 2, True)
    # an observation cut to nothing (the budget): the turn begins after the call
    assert a.next_turn(turn0, True) == (key, t1, True)
    # without stop strings (max_turns reached) the model answers and ends
    assert a.next_turn(turn0 + [OBS] * 8, False) == (key, t1, False)
    assert t2 >= 2
    assert spell([key, FILL, CALL, OBS, OBS, 0]) == f"k{key};.{CALL_TEXT}~~"
    assert SimTokenizer(16, turns=True).encode("~~~") == [OBS] * 3
    assert SimTokenizer(16, turns=True).encode("a prompt") == [FILL] * 16


def test_a_turn_ends_with_its_call_and_the_tool_answers_after_its_drawn_latency():
    async def go():
        backend = SimBackend(TURNS, seed=3)
        params = GenParams(max_tokens=500, stop=(CALL_TEXT,))
        key = None
        for _ in range(50):  # a trajectory with at least one call
            res = await backend.generate(f"r{_}", [FILL] * 16, params)
            key = res.token_ids[0]
            if len(backend.plans.plan(key)) > 1:
                break
        plan = backend.plans.plan(key)
        assert len(res.token_ids) == plan[0] and res.finish_reason == "stop" and res.token_ids[-1] == CALL
        tool = SimTool(TURNS, seed=9)
        await tool.reset(None, "")
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        out = await tool.step(spell(res.token_ids))
        took = loop.time() - t0
        again = SimTool(TURNS, seed=9)
        await again.reset(None, spell(res.token_ids))  # a moved trajectory: same key, same call index
        assert again.key == key and again.calls == 1 and tool.calls == 1
        again.calls = 0
        assert again.latency_s() == pytest.approx(took, abs=1e-6)
        assert out.observation == "~" * TURNS.observation_tokens

    loop = looptime.new_event_loop(start=0.0, noop_cycles=1)  # virtual time: the latency is exact
    try:
        loop.run_until_complete(go())
    finally:
        loop.close()


def _run(cfg, cost=TURNS, seed=1):
    s = Summary()
    r = run_sim(cfg, cost, seed=seed, keep=True, sinks=[s])
    assert r.ended.reason == "completed", r.ended
    return r, s


@pytest.mark.parametrize("weight_update", ["abort", "keep"])
def test_trajectories_follow_their_plans_across_cuts_and_moves_and_mask_observations(weight_update):
    r, _ = _run(sim_config(eta=2, weight_update=weight_update))
    plans = Plans(TURNS, LengthSampler(TURNS, 0))
    ends = [m.sample for m in r.messages if isinstance(m, SampleEnd)]
    resumed = {m.sample_id for m in r.messages if isinstance(m, SampleResumed) and m.turn > 0}
    # abort: cut by a weight update after a tool call, resumed from its prefix; keep: swapped in place
    assert bool(resumed) == (weight_update == "abort"), resumed
    assert any(len(set(s.versions)) > 1 and s.turns for s in ends)
    calls = set()
    for s in ends:
        plan = plans.plan(s.token_ids[0])
        assert len(s.turns) == len(plan) - 1  # every planned call made (budget and turns to spare)
        assert [t.generated for t in s.turns] == plan[:-1]
        assert len(s.token_ids) - sum(t.generated + t.observed for t in s.turns) == plan[-1]
        assert s.loss_mask.count(0) == sum(t.observed for t in s.turns) == 8 * len(s.turns)
        tool = SimTool(TURNS, seed=1)
        tool.key = s.token_ids[0]
        for i, t in enumerate(s.turns):
            tool.calls = i
            assert t.env_s == pytest.approx(tool.latency_s(), abs=1e-6)  # virtual time: exactly the draw
        calls.add(len(s.turns))
    assert calls == {0, 1, 2, 3}


def test_max_turns_makes_the_model_answer_without_more_calls():
    r, _ = _run(sim_config(max_turns=1))
    ends = [m.sample for m in r.messages if isinstance(m, SampleEnd)]
    assert max(len(s.turns) for s in ends) == 1 and all(s.token_ids[-1] == 0 for s in ends)


def test_multi_turn_runs_never_beat_their_bound_and_the_tools_are_on_its_critical_path():
    slow = msgspec.structs.replace(TURNS, env_latency_median_s=20.0, env_latency_sigma=0.0)
    for cost in (TURNS, slow):
        for policy, standalone, hybrid, sched in [
            ("colocated", 0, 2, "serial"),
            ("separate", 2, 0, "overlapped"),
            ("lend_when_idle", 1, 1, "lending"),
        ]:
            cfg = sim_config(policy, standalone, hybrid, eta=0 if policy == "colocated" else 2)
            r, s = _run(cfg, cost)
            work = s.work()
            fleet = bound.Fleet(
                bound.ModelMachine(cost, 32),
                replicas=standalone or hybrid,
                lendable=hybrid if standalone else 0,
                gpus=2,
            )
            b = bound.bound_s(work, fleet, sched)
            assert 0 < b <= s.result()["wall_s"] * 1.001, (policy, b, s.result()["wall_s"])
    # 20 s a call, up to 3 calls a trajectory: a colocated step waits for its longest chain
    chains = [max(bound.as_work(x).env_s for x in w.samples) for w in work]
    assert max(chains) == pytest.approx(60.0, rel=1e-3)
    serial = bound.bound_s(work, bound.Fleet(bound.ModelMachine(slow, 32), replicas=2), "serial")
    assert serial >= sum(chains)


def test_the_sample_work_of_a_turn_counts_generated_tokens_and_its_tool_time():
    cost = CostModel(decode_step_s=0.01, decode_step_s_per_seq=0.0, prefill_s_per_token=1e-3)
    m = bound.ModelMachine(cost, max_batch=10)
    one = m.load([bound.SampleWork(100, 60, observed=20, env_s=5.0)])
    assert one.tokens == 40 and one.prefill_s == pytest.approx(0.1 + 0.02)
    assert one.alone_s == pytest.approx(0.1 + 40 * 0.01 + 5.0)
    assert m.load([(100, 40)]).tokens == 40  # a plain pair is a single-turn sample
    rate = bound.RateMachine(peak_tok_s=100, alone_tok_s=10)
    assert rate.load([bound.SampleWork(0, 60, 20, 5.0)]).alone_s == pytest.approx(4 + 5)


def test_the_agentic_scenario_runs_and_a_variant_cost_typo_names_the_variant(tmp_path, monkeypatch):
    from pathlib import Path

    sc = load(Path(__file__).resolve().parents[3] / "bench" / "scenarios" / "agentic.toml")
    twin = next(v for v in sc.variant if v.cost)
    assert variant_setup(sc, twin)[1].tool_calls_max == 0
    bad = msgspec.structs.replace(twin, cost={"tool_calls_mux": 1})
    with pytest.raises(ValueError, match="single-turn.*tool_calls_mux"):
        variant_setup(sc, bad)
    # a small copy of it, end to end through the CLI: every figure the report reads is there,
    # and the report quotes the command that ran it, with the scenario file's own path
    text = (Path(__file__).resolve().parents[3] / "bench" / "scenarios" / "agentic.toml").read_text()
    text = text[: text.index("[[variant]]")]
    for old, new in [
        ("seeds = [1, 2, 3]", "seeds = [1]"),
        ("gpus = 16", "gpus = 4"),
        ("total_steps = 24", "total_steps = 2"),
        (
            "ppo_mini_batch_size = 512, parameter_sync_step = 1, train_batch_size = 512",
            "ppo_mini_batch_size = 32, parameter_sync_step = 1, train_batch_size = 32",
        ),
    ]:
        assert old in text
        text = text.replace(old, new)
    text = "\n".join(line for line in text.splitlines() if not line.startswith("pairs = "))
    text += """
[[variant]]
name = "colocated"
policy = "colocated"
max_staleness = 0

[[variant]]
name = "separate"
policy = "separate"
trainer_gpus = 2
max_staleness = 2
"""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "small agentic.toml").write_text(text)
    monkeypatch.chdir(tmp_path)
    assert bench_main(["run", "mine/small agentic.toml", "--out", "results/small.json", "--seeds", "1"]) == 0
    out = json.loads((tmp_path / "results" / "small.json").read_text())
    sep = out["metrics"]["separate"]
    assert 0 < sep["frac_of_bound"]["max"] <= 1.001 and sep["speedup_vs_colocated"]["median"] > 0
    assert out["command"] == "python -m shunter.bench run 'mine/small agentic.toml' --seeds 1"  # runs as quoted
    report = write_report([tmp_path / "results" / "small.json"], tmp_path / "REPORT.md").read_text()
    assert "`python -m shunter.bench run 'mine/small agentic.toml' --seeds 1`" in report


def test_one_seed_replays_identically():
    a, _ = _run(sim_config(eta=2), seed=5)
    b, _ = _run(sim_config(eta=2), seed=5)
    assert [m.metrics.get("trainer/tokens") for m in a.messages if isinstance(m, StepEnd)] == [
        m.metrics.get("trainer/tokens") for m in b.messages if isinstance(m, StepEnd)
    ]
    assert a.sim_s == b.sim_s


def test_random_is_not_the_global_one():
    state = random.getstate()
    _run(sim_config(steps=2))
    assert random.getstate() == state
