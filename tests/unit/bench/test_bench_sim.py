"""The simulated cluster: repeatable, faithful to the closed form of the sync schedule,
scales to 1,024 replicas, and its traces open in Perfetto."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from shunter.bench.analysis.analytic import colocated_run_s
from shunter.bench.analysis.summary import summarize
from shunter.bench.report.trace import to_trace
from shunter.bench.runner.scenario_file import load
from shunter.bench.runner.simulated import variant_setup
from shunter.bench.sim.cluster import run_sim
from shunter.engine.config import from_dict
from shunter.events import Codec, PolicySlow, RankAssigned, ReplicaUp, SampleBegin, StepBegin, StepEnd, WeightsReady
from tests.support.configs import SMALL, sim_config

ROOT = Path(__file__).resolve().parents[3]


def test_same_seed_same_event_log_other_seed_other_log():
    """``policy.slow`` measures the host's real time in decide() (more of it when the cores
    are busy): it is the one message a replay may add or lose (and with it the sequence
    numbers of the coordinator's later messages)."""
    codec = Codec()

    def log(run):
        return [codec.encode(msgspec.structs.replace(m, seq=0)) for m in run.messages if not isinstance(m, PolicySlow)]

    a = run_sim(sim_config(), SMALL, seed=3)
    b = run_sim(sim_config(), SMALL, seed=3)
    c = run_sim(sim_config(), SMALL, seed=4)
    assert a.ended.reason == "completed"
    assert log(a) == log(b)
    assert log(a) != log(c)


@pytest.mark.parametrize("replicas, length, sync", [(2, 100, 1), (4, 300, 2), (8, 50, 1)])
def test_sync_schedule_matches_the_closed_form_within_2_percent(replicas, length, sync):
    cost = msgspec.structs.replace(SMALL, length_sigma=0.0, length_median=length)
    mbs = 32
    cfg = from_dict(
        {
            "run": {"total_steps": 4 * sync, "policy": "colocated", "stall_timeout_s": 3600.0},
            "rollout": {
                "standalone_replicas": 0,
                "hybrid_replicas": replicas,
                "n_samples_per_prompt": 4,
                "max_tokens": 512,
                "max_model_len": 1024,
                "max_staleness": 0,
                "max_in_flight_per_replica": mbs * sync // replicas,
            },
            "trainer": {"ppo_mini_batch_size": mbs, "parameter_sync_step": sync, "train_batch_size": mbs * sync},
            "validation": {"every": 0},
        }
    )
    r = run_sim(cfg, cost, seed=1)
    assert r.ended.reason == "completed"
    assert r.sim_s == pytest.approx(colocated_run_s(cfg, cost), rel=0.02)


def test_1024_replicas_each_with_its_own_rank_and_work():
    cost = msgspec.structs.replace(SMALL, length_median=20, length_sigma=0.3)
    cfg = from_dict(
        {
            "run": {"total_steps": 1, "policy": "separate", "stall_timeout_s": 3600.0},
            "rollout": {
                "standalone_replicas": 1024,
                "n_samples_per_prompt": 4,
                "max_tokens": 64,
                "max_model_len": 128,
                "max_staleness": 0,
                "max_in_flight_per_replica": 4,
            },
            "trainer": {"ppo_mini_batch_size": 4096, "parameter_sync_step": 1, "train_batch_size": 4096},
            "validation": {"every": 0},
        }
    )
    r = run_sim(cfg, cost, seed=1)
    assert r.ended.reason == "completed"
    ranks = sorted(m.rank for m in r.messages if isinstance(m, RankAssigned))
    assert ranks == list(range(1024))
    assert len({m.replica_id for m in r.messages if isinstance(m, SampleBegin)}) == 1024


def test_async_beats_sync_on_long_tails_and_idle_fractions_are_fractions():
    cost = msgspec.structs.replace(SMALL, length_sigma=1.2)
    sync = summarize(run_sim(sim_config("colocated", 0, 4, eta=0, inflight=16), cost, seed=2).messages)
    async_ = summarize(run_sim(sim_config("separate", 2, 0, eta=2), cost, seed=2).messages)
    for m in (sync, async_):
        assert 0 <= m["trainer_idle_frac"] <= 1 and 0 <= m["rollout_idle_frac"] <= 1
    assert async_["step_s"] < sync["step_s"]


def test_trace_is_valid_chrome_trace_json_with_a_track_per_actor():
    r = run_sim(sim_config("lend_when_idle", 1, 1), SMALL, seed=1)
    trace = json.loads(json.dumps(to_trace(r.messages)))
    evs = trace["traceEvents"]
    names = {e["args"]["name"] for e in evs if e["ph"] == "M"}
    assert {"trainer", "standalone-0/samples"} <= names
    spans = [e for e in evs if e["ph"] == "X"]
    assert spans and all(e["dur"] >= 0 and e["ts"] >= 0 and isinstance(e["tid"], int) for e in spans)
    steps = [e for e in spans if e["name"].startswith("step ")]
    assert len(steps) == sum(isinstance(m, StepEnd) for m in r.messages)


def _most_ahead(messages, gpv: int) -> int:
    """The most groups begun beyond ``(v + 1) * gpv`` at any start, ``v`` the newest version out."""
    begun, version, most = set(), 0, -(10**9)
    for m in messages:
        if isinstance(m, WeightsReady):
            version = max(version, m.version)
        elif isinstance(m, SampleBegin) and m.group_id not in begun:
            begun.add(m.group_id)
            most = max(most, len(begun) - (version + 1) * gpv)
    return most


def test_admit_staleness_holds_the_work_ahead_in_a_run_and_the_run_still_completes():
    """16 groups a version (8 a mini-batch, 2 mini-batches a version): at staleness 3 the gate
    lets the rollout start 3 versions of groups ahead; with ``admit_staleness = 0`` none ahead,
    and every group still trains (none dropped)."""
    full = run_sim(sim_config("separate", 2, 0, eta=3, steps=8), SMALL, seed=2)
    low = run_sim(sim_config("separate", 2, 0, eta=3, steps=8, admit_staleness=0), SMALL, seed=2)
    assert _most_ahead(full.messages, 16) > 0  # the full gate goes further ahead: the check can fail
    assert _most_ahead(low.messages, 16) <= 0
    assert low.ended.reason == "completed" and low.ended.steps == 8
    # the pipeline depth the bench reports (groups begun, not trained, at a step's start, in
    # mini-batches): at most (0 + 1) versions of 2 mini-batches ahead, deeper with the full gate
    assert summarize(low.messages)["ahead_batches"] <= 2 < summarize(full.messages)["ahead_batches"]
    assert not any(type(m).__name__ == "GroupDropped" for m in low.messages)


def test_the_split_rule_counts_a_late_first_step_only_where_the_trainer_is_the_bottleneck():
    """``split_bounds`` given a first step at 600 s: trainer-bound splits (6..9 of long_tail's 16
    GPUs for this work) take the wait in full, generation-bound ones (10, 11) hide it, so the
    rule's split (the least given the first step) is 10 where the plain bound's is 9."""
    from shunter.bench.analysis import bound
    from shunter.bench.runner.simulated import split_bounds

    sc = load(ROOT / "bench" / "scenarios" / "long_tail.toml")
    cfg, cost = variant_setup(sc, next(v for v in sc.variant if v.name == "separate 9:7 eta=24 keep"))
    machine = bound.ModelMachine(cost, cfg.rollout.max_in_flight_per_replica)
    samples = tuple((512, 1000 + (i * 7919) % 9000) for i in range(512))
    work = [bound.StepWork(samples, 120.0, 2.0) for _ in range(24)]
    plain = split_bounds(sc, cost, work, machine)
    given = split_bounds(sc, cost, work, machine, first_at=600.0)
    assert min(plain, key=plain.__getitem__) == 9 and min(given, key=given.__getitem__) == 10
    assert all(given[k] > plain[k] + 300 for k in range(6, 10))
    assert all(given[k] == plain[k] for k in (10, 11))


def test_shipped_scenarios_load_and_set_up(tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[3] / "bench" / "scenarios"
    files = sorted(root.glob("*.toml"))
    assert files
    for f in files:
        sc = load(f)
        if sc.scenario.kind == "sim":
            for v in sc.variant:
                variant_setup(sc, v)
            if sc.cost.lengths_file:  # a length file it names is shipped beside it and reads
                from shunter.engine.replica.lengths import read_lengths

                assert len(list(read_lengths(sc.cost.lengths_file))) >= 1000, f
        if sc.scenario.kind == "real":  # every variant is a valid engine config
            from shunter.bench.runner.real import EXAMPLE
            from shunter.engine.config import load_config, merge

            for v in sc.variant:
                load_config(EXAMPLE, merge(merge(sc.engine, {"rollout": {"max_staleness": v.max_staleness}}), v.engine))
    bad = tmp_path / "bad.toml"
    bad.write_text('[scenario]\nname = "x"\nseedz = [1]\n')
    with pytest.raises(ValueError, match="seedz"):
        load(bad)


@pytest.mark.parametrize("train_s_per_token, eta", [(1e-5, 1), (1e-3, 1), (3e-4, 2)])
def test_lend_when_idle_is_never_more_than_1_percent_slower_than_separate(train_s_per_token, eta):
    cost = msgspec.structs.replace(
        SMALL,
        length_median=600,
        length_sigma=1.0,
        train_s_per_token=train_s_per_token,
        sleep_s=0.05,
        wake_s=0.05,
        load_s=0.01,
    )
    sep = run_sim(sim_config("separate", 2, 0, eta=eta, steps=12), cost, seed=5)
    lend = run_sim(
        sim_config("lend_when_idle", 2, 2, eta=eta, steps=12, options={"switch_cost_prior_s": 0.1}), cost, seed=5
    )
    assert sep.ended.reason == lend.ended.reason == "completed"
    assert lend.sim_s <= 1.01 * sep.sim_s, (lend.sim_s, sep.sim_s)
    switches = sum(type(m).__name__ == "ModeChanged" for m in lend.messages)
    if train_s_per_token < 1e-4:  # a fast trainer waits: lending must actually happen
        assert switches > 0 and lend.sim_s < sep.sim_s


def test_busy_time_counts_overlaps_once_and_clips_to_the_run():
    from shunter.bench.analysis.summary import busy_intervals, busy_within

    changes = [(1, 1), (2, 1), (3, -1), (5, -1), (6, 1)]
    assert busy_intervals(changes[:4]) == [(1, 4)]
    assert busy_within(changes, 0, 10) == 8  # 1..5 and 6..end
    assert busy_within([(float("-inf"), 1)], 0, 10) == 10
    assert busy_within([(-5, 1), (3, -1), (4, 1), (20, -1)], 0, 10) == 9


def test_steady_rollout_idle_counts_from_the_first_step_to_the_last_group_and_ahead_is_in_batches():
    """Two replicas; the first step at t=10, the last group begins at t=30, the run ends at 100.
    Replica a is busy 0..40, b 0..20 and 25..30: from 10 to 30 they are idle 5 s of 40 (12.5 %),
    whatever happens after the last group began; from the first step to the end and over the
    whole run far more."""
    from shunter.bench.analysis.summary import Summary
    from shunter.events import RunEnded, RunStarted, SampleAborted

    def at(t, m):
        return msgspec.structs.replace(m, wall_time=float(t))

    def begin(t, rid, gid):
        return at(t, SampleBegin(sample_id=f"{gid}.0", group_id=gid, replica_id=rid, version=0))

    def stop(t, rid, gid):
        return at(t, SampleAborted(sample_id=f"{gid}.0", group_id=gid, replica_id=rid, reason="failed"))

    up = [at(0, ReplicaUp(replica_id=r, replica_kind="standalone", rank=i, mode="rollout")) for i, r in enumerate("ab")]
    msgs = [
        *up,
        at(0, RunStarted(policy="separate", replicas=2)),
        begin(0, "a", 0),
        begin(0, "b", 1),
        begin(0, "b", 2),
        begin(5, "a", 3),
        at(10, StepBegin(step=1, batch_id=0, samples=2, version=0, group_ids=[1, 2])),
        stop(20, "b", 1),
        stop(20, "b", 2),
        begin(25, "b", 4),
        begin(30, "a", 5),
        stop(30, "b", 4),
        stop(40, "a", 0),
        stop(40, "a", 3),
        stop(40, "a", 5),
        at(50, StepBegin(step=2, batch_id=1, samples=2, version=1, group_ids=[0, 3])),
        at(60, StepBegin(step=3, batch_id=2, samples=1, version=2, group_ids=[4])),
        at(70, StepBegin(step=4, batch_id=3, samples=1, version=3, group_ids=[5])),
        at(100, RunEnded(reason="completed", steps=4)),
    ]
    s = Summary()
    for m in msgs:
        s(m)
    out = s.result()
    # a log read with its relay reports folded (read_log(..., reports=True)) gives the same figures
    from shunter.events.relay import RelayReport

    folded = [*msgs[:3], RelayReport(relay="local", events=msgs[3:6]), *msgs[6:]]
    assert summarize(folded) == out
    assert out["rollout_idle_steady_frac"] == pytest.approx(5 / 40)
    # from the first step to the end: a busy 10..40, b 10..20 and 25..30: 45 s of 180
    assert out["rollout_idle_after_first_frac"] == pytest.approx(1 - 45 / 180)
    assert out["rollout_idle_frac"] == pytest.approx(1 - (40 + 25) / 200)
    # groups begun and not trained at each step's start, in that step's batches: 4/2, 4/2, 2/1, 1/1
    assert s.ahead == [2.0, 2.0, 2.0, 1.0] and out["ahead_batches"] == 2.0


def test_reward_curves_are_averaged_over_seeds_smoothed_and_plotted(tmp_path):
    from shunter.bench.report.plots import mean_curve, plot_curves, smooth

    assert smooth([1.0, 3.0, 5.0, 7.0], k=2) == [1.0, 2.0, 4.0, 6.0]
    runs = [
        {"seed": s, "step": [1.0, 2.0, 3.0], "wall_s": [1.0, 2.0, 3.0], "reward": [0.1 * s, 0.2 * s, 0.3 * s]}
        for s in (1, 3)
    ]
    assert mean_curve(runs, "reward") == ([1.0, 2.0, 3.0], [0.2, 0.4, pytest.approx(0.6)])
    metrics = {
        n: {"reward_avg": {"min": r, "median": r, "max": r}}
        for n, r in (("eta=0 ppo", 0.5), ("eta=0 decoupled", 0.5), ("eta=4 ppo", 0.3), ("eta=4 decoupled", 0.45))
    }
    result = {"scenario": {"scenario": {"name": "sweep"}}, "metrics": metrics, "curves": {n: runs for n in metrics}}
    made = plot_curves(result, tmp_path)
    assert [p.name for p in made] == ["sweep-reward.png", "sweep-summary.png"] and all(p.stat().st_size for p in made)


def test_a_slow_coordinator_slows_the_simulated_run_and_its_messages_queue():
    """Charged, every real second the coordinator spends is a simulated second: a coordinator
    costing 250 ms a turn (a fake timer, not the clock; a turn handles the messages that arrived
    together) stretches the run and queues messages; uncharged, the same run's simulated time
    does not see it."""
    cfg = sim_config("separate", 2, 0, eta=1, steps=2)
    ticks = iter(range(10**9))

    def slow_timer() -> float:  # each reading 250 ms after the one before
        return next(ticks) * 0.25

    free = run_sim(cfg, SMALL, seed=3, keep=False, timer=slow_timer)
    charged = run_sim(cfg, SMALL, seed=3, keep=False, timer=slow_timer, charge_coordinator=True)
    assert free.ended.reason == charged.ended.reason == "completed"
    assert all(dt == pytest.approx(0.25) for dt in charged.handle_s)
    # the coordinator's time overlaps the replicas' decoding, so the run is longer (by at least
    # the turn that follows the last step), not longer by all of it; but the coordinator can never
    # be busy longer than the run
    assert charged.sim_s >= free.sim_s + 0.25
    assert charged.sim_s >= sum(charged.handle_s)
    assert min(charged.latency_s) >= 0.25 - 1e-9  # each message waits for its own turn at least
    assert max(charged.latency_s) > 0.25 + 0.1  # and some queued behind an earlier turn
    # uncharged, nothing waits in virtual time but a fact in its relay's window
    assert max(free.latency_s) <= cfg.rollout.report_window_s + 1e-9


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ('baseline = "nope"', "'nope'"),
        ('pairs = [["separate", "x"]]', "'x'"),
        ('pairs = [["separate"]]', "[variant, reference]"),
    ],
)
def test_a_scenario_naming_no_variant_is_refused_before_anything_runs_in_one_line(tmp_path, capsys, line, named):
    """An outside tester's scenario with a baseline typo ran every variant, then died with a
    ``KeyError`` traceback and wrote no results; it is refused at load now, and ``bench run``
    says a scenario's mistake in one line (exit 2)."""
    from shunter.bench.__main__ import main as bench_main

    f = tmp_path / "t.toml"
    f.write_text(
        f'[scenario]\nname = "t"\nkind = "sim"\nseeds = [1]\n{line}\n[cluster]\ngpus = 3\n[cost]\nlength_median = 100\n'
        '[engine]\nrun = { total_steps = 2 }\n[[variant]]\nname = "separate"\npolicy = "separate"\ntrainer_gpus = 1\n'
    )
    with pytest.raises(ValueError, match="no variant named|a pair is"):
        load(f)
    assert bench_main(["run", str(f), "--out", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err and len(err.splitlines()) == 1
    assert not (tmp_path / "t.json").exists()
