"""The coordinator's loop contains what users and bugs throw at it: a policy that raises,
returns junk or is slow; an exception in any stage of the loop; a feedback loop of derived
events. Each ends the run — or keeps it alive — with a clear reason and small logs
(virtual time: nothing here depends on the wall clock)."""

from __future__ import annotations

import pytest

from shunter.engine.io.records import EventLog, LogSink, make_logger
from shunter.events import (
    IntentRejected,
    PolicyFailed,
    PolicySlow,
    ReplicaUp,
    RunEnded,
    RunResumed,
    RunStarted,
    StepEnd,
    TrainStep,
    ValidateEnd,
)
from shunter.policies import Policy, SeparatePolicy
from tests.support.broken_policies import Raises, ReturnsBare, ReturnsJunk, ReturnsNone, ReturnsOrder
from tests.support.configs import cfg
from tests.support.fakes import local_run, run_to_end, virtual_time


def with_logs(coord, tmp_path):
    log = EventLog(tmp_path / "events.bin")
    coord.sinks += [log, LogSink(make_logger(tmp_path / "run.log"))]
    return log


@pytest.mark.parametrize(
    ("policy", "says"),
    [
        (Raises, "raised AttributeError: 'EngineView' object has no attribute 'bufer'"),
        (ReturnsNone, "returned None; expected a list of intents"),
        (ReturnsBare, "returned a bare TrainStep, not a list"),
        (ReturnsJunk, "returned a list holding str 'publish' at index 1"),
        (ReturnsOrder, "returned Generate at index 0, an order only the coordinator gives components"),
    ],
)
@virtual_time
async def test_a_policy_that_keeps_failing_ends_the_run_with_its_name_event_and_cause(policy, says, tmp_path):
    coord, _, _ = local_run(cfg(run={"policy_max_failures": 5}), policy=policy())
    log = with_logs(coord, tmp_path)
    ended, seen = await run_to_end(coord)
    log.close()
    assert ended.reason == "error"
    assert f"policy tests.support.broken_policies.{policy.__name__} failed 5 times in a row" in ended.error
    assert says in ended.error and "on run.started" in ended.error or "on " in ended.error
    failed = [m for m in seen if isinstance(m, PolicyFailed)]
    assert 1 <= len(failed) <= 5 and all(says in f.error for f in failed)
    assert len(seen) < 200, "the run ended within a handful of messages"
    assert (tmp_path / "events.bin").stat().st_size < 1_000_000
    assert (tmp_path / "run.log").stat().st_size < 100_000
    assert max(len(line) for line in (tmp_path / "run.log").read_text().splitlines()) < 5000


@virtual_time
async def test_policy_failures_are_never_fed_back_to_the_policy():
    decided = []

    class FailsOnce(SeparatePolicy):
        def decide(self, event, view):
            decided.append(event)
            if isinstance(event, StepEnd) and event.step == 2:
                raise RuntimeError("one bad step")
            return super().decide(event, view)

    coord, _, _ = local_run(cfg(), policy=FailsOnce())
    ended, seen = await run_to_end(coord)
    assert ended.reason == "completed", ended
    (failed,) = [m.error for m in seen if isinstance(m, PolicyFailed)]
    assert failed.startswith(
        f"{FailsOnce.__module__}.{FailsOnce.__qualname__}.decide() raised RuntimeError: one bad step"
    )
    assert "test_loop_faults.py:" in failed and failed.endswith(" in decide)")  # the user's own line
    assert not [e for e in decided if isinstance(e, PolicyFailed | PolicySlow | IntentRejected)]


@virtual_time
async def test_identical_failures_are_counted_not_repeated():
    class FailsOnSamples(SeparatePolicy):
        def decide(self, event, view):
            if type(event).__name__ == "SampleBegin":
                raise ValueError("no samples please")
            return super().decide(event, view)

    coord, _, _ = local_run(cfg(run={"policy_max_failures": 10_000}), policy=FailsOnSamples())
    ended, seen = await run_to_end(coord)
    assert ended.reason == "completed"
    failed = [m for m in seen if isinstance(m, PolicyFailed)]
    total = coord.guard.failures
    assert total > 10
    assert [f.repeats for f in failed] == [n for n in (1, 10, 100, 1000, 10_000) if n <= total]


@virtual_time
async def test_a_slow_policy_is_named_in_a_warning_and_timed_in_the_metrics():
    class Dawdles(SeparatePolicy):
        """Like broken_policies.Slow, on a clock the test controls: each decide() takes 50 ms."""

    ticks = iter(range(10**9))
    coord, _, _ = local_run(cfg(run={"policy_budget_ms": 10.0}), policy=Dawdles())
    coord.guard.timer = lambda: next(ticks) * 0.05
    ended, seen = await run_to_end(coord)
    assert ended.reason == "completed"
    slow = [m for m in seen if isinstance(m, PolicySlow)]
    assert slow and slow[0].policy == f"{Dawdles.__module__}.{Dawdles.__qualname__}"
    assert slow[0].decide_ms == pytest.approx(50.0)
    assert [s.slow_calls for s in slow] == [n for n in (1, 10, 100, 1000) if n <= coord.guard.slow_calls]
    m = coord.guard.metrics()
    assert m["coordinator/decide_ms_p50"] == pytest.approx(50.0) and m["coordinator/decide_ms_p99"] >= 50.0


class Boom(OSError):
    pass


def _explode(*args, **kwargs):
    raise Boom(28, "No space left on device")


@pytest.mark.parametrize("stage", ["sink", "apply", "intent", "pump", "finale", "decide"])
@virtual_time
async def test_an_exception_in_any_stage_ends_the_run_naming_stage_message_and_cause(stage):
    coord, _, _ = local_run(cfg())
    target = {
        "apply": (coord.applier, "apply"),
        "intent": (coord.intents, "carry_out"),
        "pump": (coord.inflight, "pump"),
        "finale": (coord.finale, "advance"),
        "decide": (coord.guard, "decide"),
    }
    steps = [0]
    calls_before = 1 if stage == "finale" else 5  # the finale runs only at the end, a few turns

    def after_a_while(original):
        def wrapped(*a, **k):
            steps[0] += 1
            if steps[0] > calls_before:
                _explode()
            return original(*a, **k)

        return wrapped

    if stage == "sink":

        class DiskFull:
            def __call__(self, msg):
                if isinstance(msg, StepEnd):
                    _explode()

        coord.sinks.append(DiskFull())
    else:
        obj, name = target[stage]
        setattr(obj, name, after_a_while(getattr(obj, name)))
    ended, seen = await run_to_end(coord)
    assert ended.reason == "error" and isinstance(seen[-1], RunEnded) and seen[-1] == ended
    expected = "sink:DiskFull" if stage == "sink" else stage
    assert ended.fault.startswith(f"{expected} on "), ended.fault
    assert "Boom: [Errno 28] No space left on device" in ended.error
    assert f"coordinator loop failed in {expected} while handling" in ended.error


@virtual_time
async def test_a_feedback_loop_of_derived_events_is_stopped():
    coord, _, _ = local_run(cfg())
    apply = coord.applier.apply

    def echo(ev):
        apply(ev)
        coord.emit(ReplicaUp(replica_id="standalone-0", replica_kind="standalone", rank=0, mode="rollout"))

    coord.applier.apply = echo
    ended, _ = await run_to_end(coord)
    assert ended.reason == "error" and "livelock" in ended.error


@virtual_time
async def test_the_policy_sees_run_started_first_and_setup_facts_only_in_the_view():
    seen_by_policy, views = [], []

    class Watch(SeparatePolicy):
        def decide(self, event, view):
            seen_by_policy.append(event)
            views.append(view)
            return super().decide(event, view)

    coord, _, _ = local_run(cfg(), policy=Watch())
    ended, seen = await run_to_end(coord)
    assert ended.reason == "completed"
    assert isinstance(seen_by_policy[0], RunStarted)
    assert not [e for e in seen_by_policy if isinstance(e, ReplicaUp)]
    assert [r.replica_id for r in views[0].replicas] == ["standalone-0", "standalone-1"]
    assert [type(m) for m in seen[:2]] == [ReplicaUp, ReplicaUp]  # recorded before RunStarted


@virtual_time
async def test_a_resumed_policy_sees_run_resumed_first(tmp_path):
    c = cfg(run={"total_steps": 8, "checkpoint_every": 2})
    coord, _, _ = local_run(c, checkpoints=tmp_path)
    ended, _ = await run_to_end(coord)
    assert ended.reason == "completed"
    from shunter.engine.io.checkpoint import CheckpointStore

    first = []

    class Watch(SeparatePolicy):
        def decide(self, event, view):
            first.append(event)
            return super().decide(event, view)

    ckpt = CheckpointStore(tmp_path).complete()[0]
    coord2, _, trainer = local_run(c, checkpoints=tmp_path / "again", resume=ckpt, policy=Watch())
    ended2, _ = await run_to_end(coord2)
    assert ended2.reason == "completed" and ended2.steps == 8
    assert isinstance(first[0], RunResumed)


@pytest.mark.parametrize("policy", ["colocated", "separate", "lend_when_idle"])
@virtual_time
async def test_every_builtin_policy_validates_on_schedule_and_at_the_end(policy):
    setups = {
        "colocated": {"standalone_replicas": 0, "hybrid_replicas": 2, "max_staleness": 0},
        "separate": {"standalone_replicas": 2},
        "lend_when_idle": {"standalone_replicas": 1, "hybrid_replicas": 1},
    }
    c = cfg(run={"policy": policy, "total_steps": 8}, rollout=setups[policy], validation={"every": 4})
    coord, _, _ = local_run(c)
    ended, seen = await run_to_end(coord)
    assert ended.reason == "completed", ended
    versions = sorted({m.version for m in seen if isinstance(m, ValidateEnd)})
    assert versions == [0, 2, 4], versions  # start, every 4 steps (2 per version), the final weights
    assert ended.summary["validate/exact_last"] == 1.0


@virtual_time
async def test_a_policy_asking_again_and_again_is_refused_quietly_and_the_run_goes_on():
    class Eager(SeparatePolicy):
        def decide(self, event, view):
            return super().decide(event, view) + [TrainStep()]  # on every event, ready or not

    coord, _, _ = local_run(cfg(), policy=Eager())
    ended, seen = await run_to_end(coord)
    assert ended.reason == "completed"
    refused = [m for m in seen if isinstance(m, IntentRejected)]
    assert refused and all(r.intent_source == "policy" for r in refused)
    assert len(refused) <= 10, "identical refusals of the policy's own intents are counted, not repeated"


def test_restore_refuses_keys_the_state_does_not_know():
    from shunter.policies import LendWhenIdlePolicy

    p = LendWhenIdlePolicy()
    snap = p.snapshot()
    with pytest.raises(ValueError, match="lent_ids"):
        p.restore({**snap, "lent_ids": []})
    with pytest.raises(ValueError, match=r"validation\.validatd"):
        p.restore({**snap, "validation": {"validatd": 3}})
    p.restore(snap)


def test_calling_the_base_init_is_optional():
    class Mine(Policy):
        def __init__(self, k: int = 1) -> None:
            self.k = k

    assert Mine().snapshot() == {}


@virtual_time
async def test_a_policy_stuck_in_an_endless_loop_is_interrupted_and_ends_the_run():
    """The watchdog (real time: the loop is frozen, virtual time cannot move) interrupts the
    call after run.policy_timeout_s; what the test checks does not depend on how long that took."""
    from tests.support.broken_policies import Hangs

    # a budget below the timeout (the hung call would be "slow" if it were counted) and far above
    # what a healthy call takes on a loaded machine (one took 23 ms in CI beside other runs)
    coord, _, _ = local_run(cfg(run={"policy_timeout_s": 0.3, "policy_budget_ms": 200}), policy=Hangs())
    ended, seen = await run_to_end(coord)
    assert ended.reason == "error"
    assert "policy tests.support.broken_policies.Hangs.decide() did not return on" in ended.error
    failed = [m for m in seen if isinstance(m, PolicyFailed)]
    assert failed and "did not return within run.policy_timeout_s = 0.3s" in failed[0].error
    assert not [m for m in seen if isinstance(m, PolicySlow)], "a call that never returned is not 'slow'"


@pytest.mark.timeout(60)  # on a loop that calls the policy itself, this run never ends
@virtual_time
async def test_a_policy_blocked_in_c_is_given_up_and_ends_the_run():
    """A user's decide() blocked inside C (a lock nobody releases) cannot be interrupted: its
    thread is abandoned run.policy_timeout_s + GIVE_UP_AFTER_S after the call began (real
    time), and the run ends with the policy, the event and "did not return"."""
    from tests.support.broken_policies import BlockedInC

    coord, _, _ = local_run(cfg(run={"policy_timeout_s": 0.3}), policy=BlockedInC())
    ended, seen = await run_to_end(coord)
    assert ended.reason == "error"
    assert "policy tests.support.broken_policies.BlockedInC.decide() did not return on" in ended.error
    assert "within run.policy_timeout_s = 0.3s (blocked outside Python" in ended.error
    failed = [m for m in seen if isinstance(m, PolicyFailed)]
    assert len(failed) == 1 and "its thread was abandoned" in failed[0].error
    assert not [m for m in seen if isinstance(m, PolicySlow)], "was: policy.slow said the abandoned call 'took 1300 ms'"


def test_a_built_in_policy_runs_on_the_loop_and_a_users_on_its_own_thread():
    """The built-ins are ours (no hand-off per call); a user's class — a subclass of a built-in
    too — runs where it can be given up."""
    import threading

    from shunter.engine.coordinator.guard import PolicyGuard
    from shunter.events import EngineView

    threads = []

    class Mine(SeparatePolicy):
        def decide(self, event, view):
            threads.append(threading.get_ident())
            return []

    for policy, on_loop in ((SeparatePolicy(), True), (Mine(), False)):
        g = PolicyGuard(policy, emit=lambda e: None)
        assert (g._worker is None) is on_loop
    g = PolicyGuard(Mine(), emit=lambda e: None)
    ev = StepEnd(step=1, batch_id=0, duration_s=1.0, run_id="r", source="t", wall_time=1.0)
    assert g.decide(ev, EngineView()) == [] and threads and threads[0] != threading.get_ident()


def test_the_watchdog_never_fires_into_code_after_the_call():
    """Calls that end right at their deadline, many times: Stuck is raised inside the watched
    call or not at all — never after ``end``."""
    import threading
    import time as _time

    from shunter.engine.coordinator.watchdog import WATCHDOG, Stuck

    leaked = 0
    for _ in range(30):
        try:
            WATCHDOG.begin(0.01, threading.get_ident())
            try:
                t = _time.monotonic()
                while _time.monotonic() - t < 0.012:
                    pass
            finally:
                WATCHDOG.end(threading.get_ident())
        except Stuck:
            pass
        try:
            for _ in range(200_000):  # after end(): a Stuck here would be a leak
                pass
        except Stuck:
            leaked += 1
    assert leaked == 0


@virtual_time
async def test_a_policy_whose_state_cannot_be_saved_ends_the_run_at_the_first_checkpoint(tmp_path):
    from shunter.policies.separate import SeparateState

    class Bad(SeparateState):
        thing: object = None

    class Unsaveable(SeparatePolicy):
        State = Bad

        def decide(self, event, view):
            self.state.thing = object()  # not plain data
            return super().decide(event, view)

    coord, _, _ = local_run(cfg(run={"checkpoint_every": 2}), policy=Unsaveable(), checkpoints=tmp_path)
    ended, _ = await run_to_end(coord)
    assert ended.reason == "error" and ended.steps == 2
    assert "checkpoint at step 2: policy" in ended.error and "Unsaveable.snapshot() cannot be saved" in ended.error
