"""Each built-in policy against a scripted trace of (event, view) pairs."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from shunter.events import (
    BatchReady,
    BufferView,
    EngineView,
    LoadWeights,
    ModeChanged,
    Offload,
    Onload,
    PublishWeights,
    ReplicaView,
    RunResumed,
    RunStarted,
    StepEnd,
    SwitchToRollout,
    SwitchToTrainer,
    TrainerView,
    TrainStep,
    WeightsReady,
)
from shunter.policies import ColocatedPolicy, LendWhenIdlePolicy, SeparatePolicy
from tests.support.golden_cases import ENV

S0 = ReplicaView(replica_id="standalone-0", kind="standalone", rank=0, mode="rollout", samples_per_s=100.0)
H1 = ReplicaView(replica_id="hybrid-1", kind="hybrid", rank=1, mode="trainer")


def view(*replicas, trainer=None, buffer=None, **kw):
    return EngineView(
        replicas=tuple(replicas),
        trainer=trainer or TrainerView(step=1),
        buffer=buffer or BufferView(),
        ppo_mini_batch_size=128,
        parameter_sync_step=2,
        **kw,
    )


STEP = StepEnd(step=1, batch_id=0, duration_s=0.2, **ENV)
READY = BatchReady(batch_id=0, samples=128, groups=16, min_version=0, max_staleness=0, **ENV)
WEIGHTS = WeightsReady(version=1, handle="ray:1", transport="ray", nbytes=1, duration_s=0.0, **ENV)


def test_separate_trains_publishes_and_loads():
    p = SeparatePolicy()
    assert p.decide(RunStarted(policy="separate", replicas=2, **ENV), view(S0, H1)) == []
    assert p.decide(READY, view(S0, H1, buffer=BufferView(ready_batches=1))) == [TrainStep()]
    busy = view(S0, H1, trainer=TrainerView(state="training"), buffer=BufferView(ready_batches=1))
    assert p.decide(READY, busy) == []  # never twice while training
    due = view(S0, H1, trainer=TrainerView(steps_since_publish=2), buffer=BufferView(ready_batches=1))
    assert p.decide(STEP, due) == [PublishWeights(replica_ids=["standalone-0"])]  # straight to the serving replica
    assert p.decide(WEIGHTS, view(S0, H1)) == [LoadWeights(version=1, replica_ids=["standalone-0"])]
    with pytest.raises(ValueError, match="at least one standalone"):
        SeparatePolicy.check_setup(standalone=0, hybrid=2)


def test_lend_when_idle_estimate_is_the_documented_formula():
    p = LendWhenIdlePolicy(switch_cost_prior_s=0.5)
    v = view(S0, H1, buffer=BufferView(ready_samples=28))
    # need 100; r_s = 100/s; r_h = 100/s (mean of measured) * 1; wait = 1.0 s
    # lend = 0.5 + (100 - 50) / 200 + 0.5 = 1.25 s -> gain -0.25 s
    assert p.estimate_gain_s(v) == pytest.approx(-0.25)
    cheap = view(S0, H1, buffer=BufferView(ready_samples=28), switch_cost_s={"rollout": 0.1, "trainer": 0.1})
    # lend = 0.1 + 90/200 + 0.1 = 0.65 -> gain 0.35
    assert p.estimate_gain_s(cheap) == pytest.approx(0.35)


def test_lend_when_idle_lends_only_when_it_pays_and_reclaims_before_training():
    costly = LendWhenIdlePolicy(switch_cost_prior_s=5.0)
    idle = view(S0, H1, buffer=BufferView(ready_samples=0))
    assert costly.decide(STEP, idle) == []
    assert costly.state.skipped == 1 and costly.state.lends == 0

    p = LendWhenIdlePolicy(switch_cost_prior_s=0.01)
    assert p.decide(STEP, idle) == [SwitchToRollout(replica_ids=["hybrid-1"])]
    lent = replace(H1, mode="rollout")
    # a mini-batch is ready: reclaim first, do not train yet
    ready = view(S0, lent, buffer=BufferView(ready_batches=1))
    assert p.decide(READY, ready) == [SwitchToTrainer(replica_ids=["hybrid-1"], sleep_level=1)]
    switching = view(S0, replace(H1, mode="switching"), buffer=BufferView(ready_batches=1))
    assert p.decide(READY, switching) == []
    back = ModeChanged(replica_id="hybrid-1", mode="trainer", previous="rollout", duration_s=0.01, **ENV)
    assert p.decide(back, view(S0, H1, buffer=BufferView(ready_batches=1))) == [TrainStep()]


def test_lend_when_idle_predicts_a_long_tail_wait_from_the_waits_it_measured():
    """The formula sees a full mini-batch of complete groups (later ones) and no need; the wait
    is the next batch's stragglers. Measured waits of ~30 s against 2 s of switching: lend."""

    def at(ev, t):
        return replace(ev, wall_time=t)

    # the trainer falls idle with no batch ready at t=10, the batch is ready at t=40
    waiting = view(S0, H1, buffer=BufferView(ready_samples=256), switch_cost_s={"rollout": 1.0, "trainer": 1.0})
    for predict, lends in ((False, 0), (True, 1)):
        p = LendWhenIdlePolicy(predict_wait=predict)
        p.decide(at(WEIGHTS, 10.0), replace(waiting, trainer=TrainerView(step=1)))
        p.decide(at(READY, 40.0), view(S0, H1, buffer=BufferView(ready_batches=1, ready_samples=384)))
        assert p.state.wait_ewma_s == pytest.approx(30.0)
        assert p.estimate_gain_s(waiting) < 0  # the formula alone would not lend
        out = p.decide(at(STEP, 50.0), waiting)
        assert (out == [SwitchToRollout(replica_ids=["hybrid-1"])]) == bool(lends), out
    # a wait that is not well above the switch cost (wait_factor) lends nothing
    p = LendWhenIdlePolicy()
    p.decide(at(WEIGHTS, 10.0), waiting)
    p.decide(at(READY, 16.0), view(S0, H1, buffer=BufferView(ready_batches=1, ready_samples=384)))
    assert p.state.wait_ewma_s == pytest.approx(6.0)
    assert p.decide(at(STEP, 20.0), waiting) == []


def test_lend_when_idle_does_not_lend_when_the_gate_is_closed():
    p = LendWhenIdlePolicy(switch_cost_prior_s=0.0)
    closed = view(S0, H1, buffer=BufferView(ready_samples=0, gate_open=False))
    assert p.decide(STEP, closed) == []


def test_lend_when_idle_first_batch_lends_from_the_start_and_after_first_decides_the_rest():
    """``first_batch``: the hybrids go to rollout at the attempt's start (the trainer has nothing
    to train), come back when the first batch is ready; ``after_first = false`` lends no more."""
    started = RunStarted(policy="lend_when_idle", replicas=2, **ENV)
    fresh = view(S0, H1, trainer=TrainerView(step=0), buffer=BufferView(ready_samples=0))
    assert LendWhenIdlePolicy().decide(started, fresh) == []  # the default: no estimate before step 1
    p = LendWhenIdlePolicy(first_batch=True, after_first=False, switch_cost_prior_s=0.01)
    assert p.decide(started, fresh) == [SwitchToRollout(replica_ids=["hybrid-1"])]
    ready = view(S0, replace(H1, mode="rollout"), trainer=TrainerView(step=0), buffer=BufferView(ready_batches=1))
    assert p.decide(READY, ready) == [SwitchToTrainer(replica_ids=["hybrid-1"], sleep_level=1)]
    back = ModeChanged(replica_id="hybrid-1", mode="trainer", previous="rollout", duration_s=0.01, **ENV)
    assert p.decide(back, view(S0, H1, trainer=TrainerView(step=0), buffer=BufferView(ready_batches=1))) == [
        TrainStep()
    ]
    idle = view(S0, H1, buffer=BufferView(ready_samples=0))  # a wait the estimate would lend for
    assert p.decide(STEP, idle) == []
    assert LendWhenIdlePolicy(first_batch=True, switch_cost_prior_s=0.01).decide(STEP, idle) == [
        SwitchToRollout(replica_ids=["hybrid-1"])
    ]
    # a resumed attempt has a first batch of its own
    resumed = RunResumed(step=7, version=3, checkpoint="ckpt", attempt=1, **ENV)
    again = view(S0, H1, trainer=TrainerView(step=7), buffer=BufferView(ready_samples=0))
    assert p.decide(resumed, again) == [SwitchToRollout(replica_ids=["hybrid-1"])]


@pytest.mark.parametrize(
    ("policy", "option"),
    [("lend_when_idle", o) for o in ("first_batch", "after_first", "predict_wait", "rebalance")]
    + [("colocated", "offload_optimizer")],
)
def test_a_quoted_boolean_option_is_refused_naming_the_option(policy, option):
    """``bool("false")`` is True: a quoted false would have switched the option on silently."""
    from shunter.policies.registry import make_policy

    with pytest.raises(ValueError, match=f"{option} must be true or false, got 'false'"):
        make_policy(policy, {option: "false"})
    assert getattr(make_policy(policy, {option: False}), option) is False


@pytest.mark.parametrize(
    ("policy", "option", "bad", "why"),
    [
        ("lend_when_idle", "wait_factor", "4", "must be a finite number"),
        ("lend_when_idle", "wait_factor", 0, "must be above 0"),
        ("lend_when_idle", "wait_factor", -1, "must be above 0"),
        ("lend_when_idle", "wait_factor", float("nan"), "must be a finite number"),
        ("lend_when_idle", "switch_cost_prior_s", -3, "must be at least 0"),
        ("lend_when_idle", "switch_cost_prior_s", float("inf"), "must be a finite number"),
        ("lend_when_idle", "min_gain_s", True, "must be a finite number"),
        ("lend_when_idle", "sleep_level", 5, "must be 1 or 2"),
        ("lend_when_idle", "sleep_level", "1", "must be 1 or 2"),
        ("colocated", "sleep_level", 0, "must be 1 or 2"),
    ],
)
def test_a_numeric_option_out_of_its_range_or_quoted_is_refused_naming_it(policy, option, bad, why):
    """An outside tester's runs started with ``wait_factor = "4"``, ``-1``, ``nan`` and
    ``sleep_level = 5`` (which reached vLLM's sleep call); each is refused where it is built."""
    from shunter.policies.registry import make_policy

    with pytest.raises(ValueError, match=f"{option} {why}"):
        make_policy(policy, {option: bad})


def test_numeric_options_in_range_are_taken():
    from shunter.policies.registry import make_policy

    p = make_policy(
        "lend_when_idle", {"wait_factor": 2, "switch_cost_prior_s": 0, "min_gain_s": -1.5, "sleep_level": 2}
    )
    assert (p.wait_factor, p.switch_cost_prior_s, p.min_gain_s, p.sleep_level) == (2.0, 0.0, -1.5, 2)
    assert make_policy("colocated", {"sleep_level": 2}).sleep_level == 2


def test_colocated_runs_the_synchronous_schedule():
    h0 = ReplicaView(replica_id="hybrid-0", kind="hybrid", rank=0, mode="trainer")
    p = ColocatedPolicy()
    assert p.decide(RunStarted(policy="colocated", replicas=1, **ENV), view(h0)) == [
        Offload(parts=["optimizer"]),
        SwitchToRollout(replica_ids=["hybrid-0"]),
    ]
    rolling = replace(h0, mode="rollout")
    assert p.decide(READY, view(rolling, buffer=BufferView(ready_batches=1))) == []  # not a whole train batch
    assert p.decide(READY, view(rolling, buffer=BufferView(ready_batches=2))) == [
        SwitchToTrainer(replica_ids=["hybrid-0"], sleep_level=1),
        Onload(parts=["optimizer"]),
    ]
    back = ModeChanged(replica_id="hybrid-0", mode="trainer", previous="rollout", duration_s=0.01, **ENV)
    assert p.decide(back, view(h0, buffer=BufferView(ready_batches=2))) == [TrainStep()]
    assert p.decide(STEP, view(h0, buffer=BufferView(ready_batches=1))) == [TrainStep()]
    assert p.decide(STEP, view(h0, trainer=TrainerView(steps_since_publish=2))) == [PublishWeights()]
    assert p.decide(WEIGHTS, view(h0)) == [Offload(parts=["optimizer"]), SwitchToRollout(replica_ids=["hybrid-0"])]
    with pytest.raises(ValueError, match="standalone_replicas = 0"):
        ColocatedPolicy.check_setup(standalone=1, hybrid=1)


def test_ignores_is_checked_and_not_inherited():
    from shunter.policies import SAMPLE_EVENTS, SeparatePolicy
    from shunter.policies.base import checked_ignores

    assert checked_ignores(SeparatePolicy) == SAMPLE_EVENTS

    class Mine(SeparatePolicy):  # reacts to samples in its own decide: must see them
        pass

    assert checked_ignores(Mine) == ()

    class Typo(SeparatePolicy):
        ignores = "SampleEnd"  # a user's mistake: a string, not a tuple of classes

    with pytest.raises(ValueError, match=r"Typo: ignores must be a tuple of event classes"):
        checked_ignores(Typo)
