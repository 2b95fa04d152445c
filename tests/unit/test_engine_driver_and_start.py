"""The ``Engine`` facade's guards, over in-process fakes (no Ray): with the engine driving the
trainer, the user-loop calls are refused and take nothing from the run (was: ``next_batch()``
took a batch the engine then never trained); an engine starts once (was: a second
``start()`` said the run folder holds a run, "continue it with --resume"); and ``submit`` returns
the coordinator's verdict on the intent (was: None, the outcome only in a later event)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from shunter import Engine, EngineError
from shunter.engine.config import from_dict
from shunter.events import Batch, BatchReady, Codec, RunEnded, Stamper, StepEnd, Stop, TrainBatch
from tests.support.fakes import local_run, virtual_time


def cfg(driver: str, **run):
    return from_dict(
        {
            "run": {"total_steps": 4, "policy": "separate", "trainer_driver": driver, **run},
            "rollout": {"standalone_replicas": 1, "n_samples_per_prompt": 4, "max_tokens": 12, "max_staleness": 1},
            "trainer": {"ppo_mini_batch_size": 8, "parameter_sync_step": 2, "train_batch_size": 16},
        }
    )


class _Remote:
    def __init__(self, handle, name, fn):
        self.handle, self.name, self.fn = handle, name, fn

    def remote(self, *args):
        self.handle.calls.append(self.name)
        return self.fn(*args)


class CoordinatorHandle:
    """The calls ``Engine`` makes on the coordinator actor, in process, over a ``local_run``
    coordinator (as ``actors/coordinator_actor.py`` answers them); ``calls`` records each one."""

    def __init__(self, coord) -> None:
        self.coord, self.calls, self.codec = coord, [], Codec()
        self.user = Stamper(coord.state.run_id, "user")
        self.batch_ready = asyncio.Event()
        coord.sinks.append(lambda m: isinstance(m, BatchReady | RunEnded) and self.batch_ready.set())

    def __getattr__(self, name):
        return _Remote(self, name, getattr(self, f"_{name}"))

    async def _next_batch(self, timeout_s):
        try:
            async with asyncio.timeout(timeout_s):
                while (batch := self.coord.take_batch()) is None and self.coord.ended is None:
                    self.batch_ready.clear()
                    await self.batch_ready.wait()
        except TimeoutError:
            batch = None
        if batch is None:
            return None, self.coord.why_no_batch()
        return msgspec.msgpack.encode(batch), ""

    async def _train(self, data):
        raise AssertionError("not reached in these tests")

    async def _submit(self, data):
        return self.codec.encode(await self.coord.submit(self.user(self.codec.decode(data))))

    async def _restarts(self, wait_s):
        await asyncio.sleep(wait_s)
        return [], self.coord.ended is not None

    async def _stop(self, reason):
        return self.codec.encode(RunEnded(reason="stopped"))

    async def _counters(self):
        return {"trained": 0}


@virtual_time
async def test_user_loop_calls_with_the_engine_driving_the_trainer_are_refused_and_take_nothing():
    c = cfg("engine")
    coord, _, _ = local_run(c, step_s=2.0)  # a step takes a while: the next batch waits in the buffer
    engine = Engine(c)
    engine.coordinator = handle = CoordinatorHandle(coord)
    steps: list[int] = []
    coord.sinks.append(lambda m: isinstance(m, StepEnd) and steps.append(m.batch_id))
    task = asyncio.create_task(coord.run())
    await handle.batch_ready.wait()  # a batch is ready: the call would have taken one
    says = r'run.trainer_driver = "engine".*set run.trainer_driver = "user".*nothing was taken'
    with pytest.raises(EngineError, match=r"next_batch\(\) is for a run whose training loop is yours.*" + says):
        await engine.next_batch(60)
    with pytest.raises(EngineError, match=r"train\(\) is for .*" + says):
        await engine.train(Batch(batch_id=1, samples=[]))
    with pytest.raises(EngineError, match=r"submit\(TrainBatch\(\.\.\.\)\) is for .*" + says):
        await engine.submit(TrainBatch(batch_id=1, samples=[]))
    assert handle.calls == []  # nothing reached the coordinator
    ended = await task
    await coord.executor.close()
    assert ended.reason == "completed" and steps == [0, 1, 2, 3], "every batch the engine took was trained"
    assert ended.summary["buffer/trained_groups"] == 8 and ended.summary.get("buffer/dropped_run_end_groups", 0) == 0


@virtual_time
async def test_user_loop_calls_with_the_user_driving_still_reach_the_coordinator():
    c = cfg("user")
    coord, _, _ = local_run(c)
    engine = Engine(c)
    engine.coordinator = handle = CoordinatorHandle(coord)
    task = asyncio.create_task(coord.run())
    batch = await engine.next_batch(60)
    assert batch.batch_id == 0 and handle.calls == ["next_batch"]
    await engine.submit(Stop(reason="done"))
    assert (await task).reason == "stopped"
    await coord.executor.close()


class FakeLauncher:
    """``actors.launch.launcher.Launcher`` without Ray: its run writes the run folder's event log."""

    made: list[FakeLauncher] = []
    fail = False

    def __init__(self, cfg, run_id, out_dir, **objects) -> None:
        self.out_dir, self.attempt, self.closed = out_dir, 0, 0
        FakeLauncher.made.append(self)

    async def open(self) -> None:
        if FakeLauncher.fail:
            raise RuntimeError("no cluster")

    async def start_attempt(self, found, reason):
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "events.bin").write_bytes(b"the run's log")
        return CoordinatorHandle(local_run(cfg("engine"))[0])

    async def close(self) -> None:
        self.closed += 1


@pytest.fixture
def fake_launcher(monkeypatch):
    from shunter.actors.launch import launcher as launch

    monkeypatch.setattr(launch, "Launcher", FakeLauncher)
    FakeLauncher.made, FakeLauncher.fail = [], False
    return FakeLauncher


@virtual_time
async def test_a_second_start_says_the_engine_is_already_started_and_leaves_it_running(tmp_path, fake_launcher):
    async with Engine(from_dict({"run": {"output_dir": str(tmp_path)}}), run_id="job") as engine:
        running, launcher = engine.coordinator, engine._launch
        with pytest.raises(EngineError, match=r"the engine is already started: `async with Engine\(cfg\)"):
            await engine.start()
        with pytest.raises(EngineError, match="the engine is already started"):
            async with engine:
                pass
        assert engine.coordinator is running and engine._launch is launcher and fake_launcher.made == [launcher]
        assert launcher.closed == 0 and "stop" not in running.calls and engine.ended is None
        assert await engine.counters() == {"trained": 0}  # it still answers
    assert launcher.closed == 1
    with pytest.raises(EngineError, match="the engine is closed and cannot start again: make a new Engine"):
        await engine.start()


@virtual_time
async def test_a_start_after_a_failed_start_says_so(tmp_path, fake_launcher):
    fake_launcher.fail = True
    engine = Engine(from_dict({"run": {"output_dir": str(tmp_path)}}), run_id="job")
    with pytest.raises(RuntimeError, match="no cluster"):
        await engine.start()
    with pytest.raises(EngineError, match="the engine's start failed"):
        await engine.start()
    await engine.close()


def _steered_run(policy: str):
    """A real coordinator (one standalone, one hybrid replica; 6 steps) under ``policy``, started,
    with an ``Engine`` steering it in process: (coordinator, engine, what it recorded, its task)."""
    c = from_dict(
        {
            "run": {"total_steps": 6, "policy": policy},
            "rollout": {"standalone_replicas": 1, "hybrid_replicas": 1, "n_samples_per_prompt": 4, "max_tokens": 12},
            "trainer": {"ppo_mini_batch_size": 8, "parameter_sync_step": 2, "train_batch_size": 16},
            "validation": {"every": 0},
        }
    )
    coord, _, _ = local_run(c)
    engine = Engine(c)
    engine.coordinator = CoordinatorHandle(coord)
    seen: list = []
    coord.sinks.append(seen.append)
    return coord, engine, seen, asyncio.create_task(coord.run())


@virtual_time
async def test_submit_returns_the_coordinators_verdict_and_separate_keeps_a_hybrid_the_user_lent():
    """``Engine.submit`` answers once the coordinator has handled the intent: carried out, or
    refused with its reason and detail (the refusal is also in the event log) — was: None. And
    ``separate`` never takes back a hybrid the user lent: it generates until the run ends."""
    from shunter import RunEndedError
    from shunter.events import IntentRejected, LoadWeights, ModeChanged, SampleEnd, SwitchToRollout, SwitchToTrainer

    coord, engine, seen, task = _steered_run("separate")
    async with asyncio.timeout(600):  # virtual seconds
        lent = await engine.submit(SwitchToRollout(replica_ids=["hybrid-1"]))
        assert lent and lent.accepted and lent.rejected is None
        assert isinstance(lent.intent, SwitchToRollout) and lent.intent.source == "user" and lent.intent.seq == 1
        wrong = await engine.submit(SwitchToRollout(replica_ids=["hybrid-0"]))  # ranks are shared: there is none
        assert not wrong and not wrong.accepted
        assert wrong.rejected.reason == "unknown_replica"
        assert "no replica hybrid-0 in this run (known: hybrid-1, standalone-0)" in wrong.rejected.detail
        assert wrong.rejected in seen, "the refusal the caller got is the one in the event log"
        stale = await engine.submit(LoadWeights(replica_ids=["standalone-0"], version=7))
        assert stale.rejected.reason == "not_current"
        ended = await task
    await coord.executor.close()
    assert ended.reason == "completed" and ended.steps == 6
    modes = [(m.replica_id, m.mode) for m in seen if isinstance(m, ModeChanged)]
    assert modes == [("hybrid-1", "rollout")], "lent once, never taken back"
    assert not [m for m in seen if isinstance(m, SwitchToTrainer)]
    assert any(m.replica_id == "hybrid-1" for m in seen if isinstance(m, SampleEnd)), "the lent hybrid generated"
    assert [m.reason for m in seen if isinstance(m, IntentRejected)] == ["unknown_replica", "not_current"]
    with pytest.raises(RunEndedError):
        await engine.submit(Stop())


@virtual_time
async def test_lend_when_idle_takes_back_a_hybrid_the_user_lent_once_a_batch_is_ready():
    """``lend_when_idle`` trains only with every hybrid on the trainer; a hybrid the user lent
    (not by the policy) was never taken back, so the run stalled at step 0 with batches ready
    (found while documenting ``Engine.submit``). Now it is reclaimed as the policy's own are."""
    from shunter.events import ModeChanged, StepEnd, SwitchToRollout, SwitchToTrainer

    coord, engine, seen, task = _steered_run("lend_when_idle")
    async with asyncio.timeout(3600):  # virtual seconds
        assert await engine.submit(SwitchToRollout(replica_ids=["hybrid-1"]))
        ended = await task
    await coord.executor.close()
    assert ended.reason == "completed" and ended.steps == 6, ended.error
    kinds = [type(m) for m in seen if isinstance(m, SwitchToTrainer | StepEnd)]
    assert kinds.index(SwitchToTrainer) < kinds.index(StepEnd), "taken back before the first step"
    modes = [(m.replica_id, m.mode) for m in seen if isinstance(m, ModeChanged)]
    assert modes[:2] == [("hybrid-1", "rollout"), ("hybrid-1", "trainer")], modes
