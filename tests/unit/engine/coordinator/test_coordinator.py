"""The real coordinator, policies, buffer and rollout core over in-process fakes of vLLM
and the torch trainer (see tests/support/fakes.py), in virtual time (``looptime``): no test here
depends on the wall clock or on how busy the machine is."""

from __future__ import annotations

import asyncio

import pytest

from shunter.events import (
    GroupDropped,
    ModeChanged,
    SampleAborted,
    SampleBegin,
    SampleEnd,
    SampleResumed,
    StepEnd,
    ValidateEnd,
    WeightsLoaded,
)
from tests.support.configs import cfg
from tests.support.fakes import local_run, run_to_end, virtual_time


@virtual_time
async def test_separate_run_completes_and_accounts_every_group():
    coord, backends, trainer = local_run(cfg())
    ended, seen = await run_to_end(coord)
    assert ended.reason == "completed", ended
    assert trainer.step == 6 and trainer.version == 3
    c = coord.buffer.counters()
    assert c["dispatched"] == c["trained"] + c["dropped"] + c["in_flight"] + c["ready"]
    assert c["trained"] == 6 * 2  # 2 groups per mini-batch
    steps = [e for e in seen if isinstance(e, StepEnd)]
    assert [e.step for e in steps] == list(range(1, 7))
    assert max(e.metrics["batch/staleness_max"] for e in steps) <= 1
    assert ended.summary["validate/exact_last"] == 1.0  # the fake answers correctly
    validated = [e.version for e in seen if isinstance(e, ValidateEnd)]
    assert sorted(set(validated)) == [0, 1, 2, 3]  # every 2 steps = every version here, and the end
    loaded = {(e.replica_id, e.version) for e in seen if isinstance(e, WeightsLoaded)}
    assert {("standalone-0", 3), ("standalone-1", 3)} <= loaded


@virtual_time
async def test_weight_update_cuts_and_resumes_samples_with_two_versions():
    coord, _, trainer = local_run(cfg(run={"total_steps": 8}), token_s=0.003)
    ended, seen = await run_to_end(coord)
    assert ended.reason == "completed"
    cut = [e for e in seen if isinstance(e, SampleAborted) and e.reason == "weights_update"]
    resumed = [e for e in seen if isinstance(e, SampleResumed)]
    assert cut and resumed
    multi = [s for batch in trainer.seen for s in batch if len(set(s.versions)) > 1]
    assert multi, "some trained sample must carry tokens of two versions"
    for s in multi:
        assert len(s.token_ids) <= s.max_tokens
        assert s.versions == sorted(s.versions)


@pytest.mark.parametrize("on_stale", ["wait", "drop"])
@pytest.mark.parametrize("max_staleness", [0, 1, 2])
@virtual_time
async def test_staleness_bound_holds(on_stale, max_staleness):
    coord, _, trainer = local_run(cfg(rollout={"max_staleness": max_staleness, "on_stale": on_stale}))
    ended, seen = await run_to_end(coord)
    assert ended.reason == "completed"
    stal = [e.metrics["batch/staleness_max"] for e in seen if isinstance(e, StepEnd)]
    assert max(stal) <= max_staleness
    if on_stale == "wait":
        assert not [e for e in seen if isinstance(e, GroupDropped) and e.reason == "stale"]


@virtual_time
async def test_lend_when_idle_lends_and_reclaims_hybrids():
    c = cfg(
        run={"policy": "lend_when_idle", "total_steps": 8, "policy_options": {"switch_cost_prior_s": 0.0}},
        rollout={"standalone_replicas": 1, "hybrid_replicas": 1},
    )
    coord, backends, trainer = local_run(c, token_s=0.002)
    ended, seen = await run_to_end(coord)
    assert ended.reason == "completed", ended
    modes = [(e.replica_id, e.mode) for e in seen if isinstance(e, ModeChanged)]
    assert ("hybrid-1", "rollout") in modes and ("hybrid-1", "trainer") in modes
    # every sample cut by a reclaim was resumed, none lost
    c = coord.buffer.counters()
    assert c["dispatched"] == c["trained"] + c["dropped"]
    assert c["trained"] == 16


@virtual_time
async def test_each_sample_reaches_the_coordinator_as_it_ends_not_with_its_group():
    """A group's short samples are reported (and their slots freed) while its long ones still
    generate: the replica streams a group's events sample by sample."""
    c = cfg(
        run={"total_steps": 4},
        validation={"every": 0},
        rollout={"max_tokens": 12, "length_dist": "lognormal:4:0.8", "ignore_eos": True, "max_staleness": 4},
    )
    coord, _, _ = local_run(c, token_s=0.01)
    loop = asyncio.get_running_loop()
    arrived: dict[int, list[tuple[int, float]]] = {}

    def watch(m):
        if isinstance(m, SampleEnd) and len(set(m.sample.versions)) == 1:  # never cut: one Generate
            arrived.setdefault(m.sample.group_id, []).append((len(m.sample.token_ids), loop.time()))

    coord.sinks.append(watch)
    ended, _ = await run_to_end(coord)
    assert ended.reason == "completed", ended.error
    spread = [v for v in arrived.values() if len(v) > 1 and len({n for n, _ in v}) > 1]
    assert spread and all(min(v)[1] < max(v)[1] for v in spread)  # the shortest arrived before the longest


@virtual_time
async def test_a_run_starts_no_group_it_will_not_train():
    """With rollout far ahead (staleness 4), the last steps' groups are the last started: no
    replica works on groups the end of the run drops."""
    coord, _, trainer = local_run(cfg(rollout={"max_staleness": 4}))
    ended, seen = await run_to_end(coord)
    assert ended.reason == "completed" and trainer.step == 6
    c = coord.buffer.counters()
    assert c["dispatched"] == c["trained"] == 6 * 2 and c["dropped"] == 0


@virtual_time
async def test_colocated_never_overlaps_training_and_rollout():
    c = cfg(
        run={"policy": "colocated", "total_steps": 4},
        rollout={"standalone_replicas": 0, "hybrid_replicas": 2, "max_staleness": 0},
    )
    coord, backends, trainer = local_run(c)
    ended, seen = await run_to_end(coord)
    assert ended.reason == "completed", ended
    stal = [e.metrics["batch/staleness_max"] for e in seen if isinstance(e, StepEnd)]
    assert stal == [0.0] * 4


@virtual_time
async def test_colocated_spreads_each_batch_over_every_replica_though_they_wake_one_by_one():
    """The first replica awake does not take the whole batch while the others still wake:
    every step's groups spread over the fleet (the sync baseline must use all its GPUs)."""
    c = cfg(
        run={"policy": "colocated", "total_steps": 4},
        rollout={"standalone_replicas": 0, "hybrid_replicas": 4, "max_staleness": 0, "max_in_flight_per_replica": 64},
        trainer={"ppo_mini_batch_size": 16, "parameter_sync_step": 1, "train_batch_size": 16},
        validation={"every": 0},
    )
    coord, backends, trainer = local_run(c, token_s=0.02)  # an answer takes ~0.1 s
    for k, b in enumerate(backends.values()):
        b.wake_s = 0.02 * k  # the first awake could take the whole batch before the last wakes
    ended, _ = await run_to_end(coord)
    assert ended.reason == "completed", ended
    # 4 groups of 4 samples a step, 4 steps: one group per replica per step
    assert [b.requests for b in backends.values()] == [16, 16, 16, 16]


@virtual_time
async def test_policy_that_raises_becomes_an_event_and_the_loop_survives():
    from shunter.events import PolicyFailed
    from shunter.policies import SeparatePolicy

    class Flaky(SeparatePolicy):
        n = 0

        def decide(self, event, view):
            Flaky.n += 1
            if Flaky.n % 7 == 0:
                raise RuntimeError("boom")
            return super().decide(event, view)

    coord, _, _ = local_run(cfg(), policy=Flaky())
    ended, seen = await run_to_end(coord)
    fails = [e for e in seen if isinstance(e, PolicyFailed)]
    assert fails and "boom" in fails[0].error
    assert ended.reason in ("completed", "error")


def picky_reward(prompt, response, answer):
    """A user's reward that raises on some prompts."""
    if "7" in prompt:
        raise ValueError("sevens are not supported")
    return 1.0


@virtual_time
async def test_a_reward_that_raises_scores_0_with_the_cause_and_the_run_goes_on():
    from shunter.events import RewardFailed

    coord, _, trainer = local_run(cfg(), reward=picky_reward)
    ended, seen = await run_to_end(coord)
    assert ended.reason == "completed" and trainer.step == 6
    failed = [e for e in seen if isinstance(e, RewardFailed)]
    assert failed and all(e.failure == "raised" and e.user_code == "picky_reward" for e in failed)
    assert "reward function picky_reward raised ValueError: sevens are not supported" in failed[0].error
    ends = {e.sample.sample_id: e.sample for e in seen if isinstance(e, SampleEnd)}
    assert all(ends[e.sample_id].reward == 0.0 for e in failed)  # scored 0, trained on, not dropped
    assert not [e for e in seen if isinstance(e, GroupDropped) and e.reason == "failed"]
    assert ended.summary["reward/raised"] == len(failed)
    c = coord.buffer.counters()
    assert c["dispatched"] == c["trained"] + c["dropped"] + c["in_flight"] + c["ready"]


@virtual_time
async def test_a_reward_that_always_raises_ends_the_run_naming_it():
    def broken(prompt, response, answer):
        raise KeyError("answer")

    coord, _, _ = local_run(cfg(), reward=broken)
    ended, _ = await run_to_end(coord)
    assert ended.reason == "error" and "reward function broken raised KeyError" in ended.error
    assert "failed on each of the run's first 8 samples (8 raised) and scored none" in ended.error
    assert ended.failed_component == "broken"


@virtual_time
async def test_a_policy_that_stops_acting_ends_the_run_with_a_stall_error_not_a_hang():
    from shunter.policies import Policy

    class Idle(Policy):
        name = "idle"

        def decide(self, event, view):
            return []  # never trains

    coord, _, _ = local_run(cfg(run={"stall_timeout_s": 0.5}), policy=Idle())
    ended, _ = await run_to_end(coord, timeout=10)
    assert ended.reason == "error" and "stalled" in ended.error and "mini-batches ready" in ended.error
    assert len(ended.error) < 600 and "EngineView(" not in ended.error


@pytest.mark.parametrize("loads", [False, True])
@virtual_time
async def test_a_policy_that_trains_but_never_publishes_or_loads_stalls_at_the_staleness_gate(loads):
    """docs/policies.md, "What a policy must do": publishes and loads are the policy's to ask for.
    Without them the replicas serve the starting weights, the staleness gate soon admits no more
    groups, and the run ends with the stall error naming the gate."""
    from shunter.events import PublishWeights, SampleBegin, TrainStep
    from shunter.policies import Policy

    class NoLoads(Policy):
        def decide(self, event, view):
            if view.trainer.state != "idle" or view.done:
                return []
            if loads and view.trainer.steps_since_publish >= view.parameter_sync_step:
                return [PublishWeights()]  # published, but loaded nowhere
            return [TrainStep()] if view.buffer.ready_batches else []

    coord, _, _ = local_run(cfg(validation={"every": 0}), policy=NoLoads())
    ended, seen = await run_to_end(coord)
    assert ended.reason == "error" and ended.steps < 6
    assert "stalled" in ended.error and "staleness gate closed" in ended.error, ended.error
    assert {m.version for m in seen if isinstance(m, SampleBegin)} == {0}


async def _lend_then_rebalance(c):
    """Run ``c`` (one standalone, one hybrid) under ``separate``; once standalone-0 holds 24
    samples, lend hybrid-1; the policy asks for a bare ``Rebalance`` on the ``ModeChanged``
    that brings it up, as ``lend_when_idle`` does (before the pump starts anything there).
    Returns the run's end and every message seen."""
    from shunter.events import Rebalance, SwitchToRollout
    from shunter.policies.separate import SeparatePolicy

    class RebalanceOnLend(SeparatePolicy):
        def decide(self, event, view):
            up = isinstance(event, ModeChanged) and event.replica_id == "hybrid-1" and event.mode == "rollout"
            return ([Rebalance()] if up else []) + super().decide(event, view)

    coord, _, _ = local_run(c, policy=RebalanceOnLend(), token_s=0.01)  # the hybrid stays asleep until lent
    seen = []
    busy = asyncio.Event()

    def watch(m):
        if coord.dispatcher.in_flight("standalone-0") >= 24:  # standalone-0 holds every group so far
            busy.set()

    coord.sinks += [seen.append, watch]

    async def lend():
        await busy.wait()
        coord.post(SwitchToRollout(replica_ids=["hybrid-1"]))

    _, (ended, _) = await asyncio.gather(lend(), run_to_end(coord))
    counters = coord.buffer.counters()
    assert (
        counters["dispatched"] == counters["trained"] + counters["dropped"] + counters["in_flight"] + counters["ready"]
    )
    return ended, seen


@virtual_time
async def test_rebalance_moves_whole_groups_from_a_busy_replica_and_loses_nothing():
    c = cfg(
        run={"total_steps": 6},  # groups enough for 6 groups in flight at once
        rollout={"standalone_replicas": 1, "hybrid_replicas": 1, "max_in_flight_per_replica": 32, "max_staleness": 2},
    )
    ended, seen = await _lend_then_rebalance(c)
    assert ended.reason == "completed"
    moved = [e for e in seen if isinstance(e, SampleAborted) and e.reason == "rebalanced"]
    assert moved and {e.replica_id for e in moved} == {"standalone-0"}
    groups = {e.group_id for e in moved}
    finished = [e for e in seen if isinstance(e, SampleEnd) and e.sample.group_id in groups]
    assert finished and "hybrid-1" in {e.replica_id for e in finished}  # moved work finished on the lent replica
    assert all(len(e.sample.token_ids) <= e.sample.max_tokens for e in finished)


@virtual_time
async def test_rebalance_moves_no_partial_to_a_replica_new_groups_will_fill():
    """With the gate admitting far more new groups than the lent replica holds, a bare
    ``Rebalance`` cuts nothing: the lent replica fills with new groups (a partial moved there
    would cost its prefill again, and the replica's return would cut it once more)."""
    c = cfg(
        run={"total_steps": 40},
        rollout={"standalone_replicas": 1, "hybrid_replicas": 1, "max_in_flight_per_replica": 32, "max_staleness": 8},
    )
    ended, seen = await _lend_then_rebalance(c)
    assert ended.reason == "completed"
    assert not [e for e in seen if isinstance(e, SampleAborted) and e.reason == "rebalanced"]
    assert any(isinstance(e, SampleBegin) and e.replica_id == "hybrid-1" for e in seen)  # it took new groups


@virtual_time
async def test_rollout_core_sheds_the_most_recent_groups_first():
    from shunter.engine.replica.core import RolloutCore
    from shunter.events import Generate, PromptSpec, SamplingSpec, Stamper
    from tests.support.fakes import CharTokenizer, FakeBackend

    backend = FakeBackend(token_s=0.02)
    core = RolloutCore("r", backend, CharTokenizer(), lambda p, r, a: 1.0, Stamper("t", "r"))
    sp = SamplingSpec(max_tokens=8)
    old = asyncio.ensure_future(
        core.generate(Generate(group_id=1, prompt=PromptSpec(prompt_id=1, text="98765>"), n=2, sampling=sp))
    )
    new = asyncio.ensure_future(
        core.generate(Generate(group_id=2, prompt=PromptSpec(prompt_id=2, text="54321>"), n=2, sampling=sp))
    )
    while backend.requests < 4:  # all four requests are running
        await asyncio.sleep(0)
    await core.shed(1)
    cut = await new
    assert {type(e).__name__ for e in cut} >= {"SampleAborted"}
    assert all(e.reason == "rebalanced" and e.partial is not None for e in cut if isinstance(e, SampleAborted))
    kept = await old
    assert not [e for e in kept if isinstance(e, SampleAborted)]


@virtual_time
async def test_length_dist_gives_each_sample_its_own_budget_reproducibly():
    c = cfg(
        run={"total_steps": 2},
        validation={"every": 0},
        rollout={"max_tokens": 12, "length_dist": "lognormal:4:0.8", "ignore_eos": True},
    )
    budgets = []
    for _ in range(2):
        coord, _, trainer = local_run(c)
        ended, _ = await run_to_end(coord)
        assert ended.reason == "completed", ended
        budgets.append({s.sample_id: s.max_tokens for b in trainer.seen for s in b})
    # seeded by sample: the same budgets again (which groups train first follows completion order)
    both = budgets[0].keys() & budgets[1].keys()
    assert len(both) >= 8 and all(budgets[0][k] == budgets[1][k] for k in both)
    values = list(budgets[0].values())
    assert min(values) >= 1 and max(values) <= 12 and len(set(values)) > 3
    assert all(len(s.token_ids) <= s.max_tokens for b in trainer.seen for s in b)


@virtual_time
async def test_a_reward_that_returns_a_string_is_the_users_error_not_a_score():
    def stringly(prompt, response, answer):
        return "1.0"

    coord, _, trainer = local_run(cfg(), reward=stringly)
    ended, seen = await run_to_end(coord)
    assert ended.reason == "error" and trainer.step == 0
    assert "reward function stringly returned str '1.0'; expected a finite float" in ended.error


@virtual_time
async def test_an_intent_naming_a_replica_that_does_not_exist_is_refused_by_name():
    from shunter.events import IntentRejected, SwitchToRollout

    coord, _, _ = local_run(cfg(run={"total_steps": 2}))
    coord.post(coord.stamp(SwitchToRollout(replica_ids=["ghost-7", "standalone-0"])))
    ended, seen = await run_to_end(coord)
    assert ended.reason == "completed"
    (refused,) = [e for e in seen if isinstance(e, IntentRejected)]
    assert refused.reason == "unknown_replica" and "ghost-7" in refused.detail and "standalone-0" in refused.detail


@virtual_time
async def test_a_consolidate_from_outside_is_checked_and_the_run_goes_on():
    """What a user's ``submit(Consolidate(...))`` gets wrong: a replica that does not exist is
    named, a lane of no room is refused; a good one is kept and nothing is lost."""
    from shunter.events import Consolidate, IntentRejected

    coord, _, _ = local_run(cfg(run={"total_steps": 4}))
    coord.post(coord.stamp(Consolidate(replica_ids=["standalone-1"], max_in_flight=0)))
    coord.post(coord.stamp(Consolidate(replica_ids=["ghost-2", "standalone-1"], max_in_flight=4, after_s=0.0)))
    ended, seen = await run_to_end(coord)
    assert ended.reason == "completed"
    refused = [e for e in seen if isinstance(e, IntentRejected)]
    assert [r.reason for r in refused] == ["bad_value", "unknown_replica"]
    assert "max_in_flight" in refused[0].detail and "ghost-2" in refused[1].detail
    assert coord.dispatcher.lane("standalone-1") in ("tail", None)  # the lane stands (None: it left at the end)
    s = ended.summary
    assert s["buffer/dispatched_groups"] == s["buffer/trained_groups"] + s["buffer/dropped_groups"]


@virtual_time
async def test_reward_failures_are_counted_per_step_and_sum_to_the_summarys():
    from shunter.events import RewardFailed, StepEnd

    coord, _, trainer = local_run(cfg(), reward=picky_reward)
    ended, seen = await run_to_end(coord)
    steps = [e for e in seen if isinstance(e, StepEnd)]
    failed = {e.sample_id for e in seen if isinstance(e, RewardFailed)}
    trained_failed = {s.sample_id for b in trainer.seen for s in b if s.reward_failure == "raised"}
    assert ended.reason == "completed" and trained_failed and trained_failed <= failed
    assert sum(e.metrics["reward/raised"] for e in steps) == len(trained_failed)
    assert all(e.metrics["reward/timeout"] == 0 == e.metrics["reward/returned"] for e in steps)
