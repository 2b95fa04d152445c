"""The Ray executor's failure paths with real actors standing in for replicas and trainer:
a dead replica becomes ``ReplicaDown``, a hung one is killed after its timeout, a hung
trainer call ends in ``ComponentFailed`` naming it (the trainer is killed; the Engine restarts
the run from its last checkpoint) — never a silent hang."""

from __future__ import annotations

import asyncio

import pytest

from shunter.actors.ray_executor import RayExecutor
from shunter.events import (
    ComponentFailed,
    Generate,
    PromptSpec,
    Publish,
    ReplicaDown,
    SampleEnd,
    SamplingSpec,
)

pytestmark = pytest.mark.actors


def _ship_by_value():
    """The stand-in actors live in this test module, which Ray workers cannot import."""
    import sys

    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


_ship_by_value()
GEN = Generate(group_id=0, prompt=PromptSpec(prompt_id=0, text="12>"), n=2, sampling=SamplingSpec(max_tokens=4))


class Hangs:
    """Answers nothing, ever (a wedged replica or trainer). ``generate`` streams, as a
    replica's does (``RolloutWorker.generate``)."""

    async def generate(self, data: bytes):
        await asyncio.sleep(3600)
        yield b""

    async def control(self, data: bytes, *how):  # a replica's (payload) or the trainer's (replicas, turn)
        await asyncio.sleep(3600)
        return b"", []


class StreamsThenHangs:
    """Ends one sample of the group at once and never the other (a long straggler)."""

    @staticmethod
    def first():
        from shunter.events import Sample

        s = Sample(
            sample_id="0.0",
            group_id=0,
            prompt_id=0,
            prompt_token_ids=[1],
            token_ids=[2],
            logprobs=[-1.0],
            versions=[0],
            max_tokens=4,
        )
        return SampleEnd(replica_id="standalone-0", sample=s)

    async def generate(self, data: bytes):
        from shunter.actors.wire import encode_events

        yield encode_events([self.first()])
        await asyncio.sleep(3600)
        yield b""


class BeatsThenEnds:
    """Reports progress (empty items, as ``RolloutCore``'s heartbeat) every 0.2 s for 12 s, three
    times the executor's 4 s timeout, then ends a sample: a long trajectory, not a hung replica.
    The timeout leaves 3.8 s of slack per beat (an actor call's latency on a loaded 2-core CI
    machine; with a 1 s timeout one late first item failed CI)."""

    async def generate(self, data: bytes):
        from shunter.actors.wire import encode_events

        for _ in range(60):
            await asyncio.sleep(0.2)
            yield encode_events([])
        yield encode_events([StreamsThenHangs.first()])


class Dies:
    def generate(self, data: bytes):
        import os

        os._exit(1)
        yield b""


class DiesMidBatch:
    """Holds several generate calls, then the process dies under all of them."""

    async def generate(self, data: bytes):
        import os

        await asyncio.sleep(0.5)
        os._exit(1)
        yield b""


async def run(executor, target, cmd, timeout=60):
    got = []
    done = asyncio.Event()

    def post(events):
        got.extend(events)
        done.set()

    executor.bind(post)
    executor.send(target, cmd)
    async with asyncio.timeout(timeout):
        await done.wait()
    return got


async def test_hung_replica_is_killed_and_reported_down_after_its_timeout(ray_cluster):
    hung = ray_cluster.remote(num_cpus=0)(Hangs).remote()
    ex = RayExecutor("t", None, {"standalone-0": hung}, timeout_s=5, generate_timeout_s=1.0)
    got = await run(ex, "standalone-0", GEN)
    assert isinstance(got[0], ReplicaDown) and "generate_timeout_s = 1s; killed" in got[0].reason
    with pytest.raises(ray_cluster.exceptions.RayActorError):
        async for ref in hung.generate.remote(b""):
            await ref


async def test_a_samples_end_is_posted_while_the_rest_of_its_group_generates(ray_cluster):
    slow = ray_cluster.remote(num_cpus=0)(StreamsThenHangs).remote()
    ex = RayExecutor("t", None, {"standalone-0": slow}, timeout_s=5, generate_timeout_s=600)
    got = await run(ex, "standalone-0", GEN, timeout=30)  # the first post; the group is far from done
    assert [type(e) for e in got] == [SampleEnd] and got[0].sample.sample_id == "0.0"
    ray_cluster.kill(slow)


async def test_generate_timeout_bounds_silence_not_time_a_replica_that_reports_progress_lives(ray_cluster):
    beating = ray_cluster.remote(num_cpus=0)(BeatsThenEnds).remote()
    ex = RayExecutor("t", None, {"standalone-0": beating}, timeout_s=5, generate_timeout_s=4.0)
    got = await run(ex, "standalone-0", GEN, timeout=60)  # 12 s of beats under a 4 s timeout
    assert [type(e) for e in got] == [SampleEnd]
    ray_cluster.kill(beating)


async def test_dead_replica_is_reported_down_not_dropped(ray_cluster):
    dead = ray_cluster.remote(num_cpus=0, max_restarts=0)(Dies).remote()
    ex = RayExecutor("t", None, {"standalone-0": dead}, timeout_s=5)
    got = await run(ex, "standalone-0", GEN)
    assert [type(e) for e in got] == [ReplicaDown] and "actor died" in got[0].reason


async def test_a_replica_that_dies_under_many_calls_is_reported_down_once(ray_cluster):
    dead = ray_cluster.remote(num_cpus=0, max_restarts=0, max_concurrency=16)(DiesMidBatch).remote()
    ex = RayExecutor("t", None, {"standalone-0": dead}, timeout_s=5)
    got = []
    ex.bind(got.extend)
    for g in range(8):
        ex.send("standalone-0", Generate(group_id=g, prompt=GEN.prompt, n=2, sampling=GEN.sampling))
    async with asyncio.timeout(60):
        while ex.pending():
            await asyncio.sleep(0.05)
    assert [type(e) for e in got] == [ReplicaDown], got


async def test_hung_trainer_is_killed_and_reported_failed_naming_it(ray_cluster):
    hung = ray_cluster.remote(num_cpus=0)(Hangs).remote()
    ex = RayExecutor("t", hung, {}, timeout_s=1.0)
    got = await run(ex, "trainer", Publish())
    assert isinstance(got[0], ComponentFailed) and got[0].component == "trainer", got
    assert "within run.timeout_s = 1s; killed" in got[0].error
    with pytest.raises(ray_cluster.exceptions.RayActorError):
        await hung.control.remote(b"")


class Idle:
    """Asked nothing; ``watch()`` never returns (as the real trainer and replicas)."""

    async def watch(self) -> None:
        await asyncio.Event().wait()

    async def pid(self) -> int:
        import os

        return os.getpid()


@pytest.mark.parametrize("target", ["trainer", "hybrid-0"])
async def test_an_idle_component_killed_by_the_os_is_reported_at_once(ray_cluster, target):
    """Was (issue 14): a trainer killed while it waited for a batch went unnoticed — nothing
    called it — and replacement replicas failed one after another fetching weights it owned."""
    import os
    import signal

    actor = ray_cluster.remote(num_cpus=0, max_restarts=0)(Idle).remote()
    pid = await actor.pid.remote()
    ex = RayExecutor(
        "t", actor if target == "trainer" else None, {} if target == "trainer" else {target: actor}, timeout_s=5
    )
    got = []
    died = asyncio.Event()
    ex.bind(lambda evs: (got.extend(evs), died.set()))
    ex.watch(target)
    os.kill(pid, signal.SIGKILL)
    async with asyncio.timeout(30):
        await died.wait()
    (ev,) = got
    if target == "trainer":
        assert isinstance(ev, ComponentFailed) and ev.component == "trainer" and "actor died" in ev.error
    else:
        assert isinstance(ev, ReplicaDown) and ev.replica_id == target


class EngineDiesIdle:
    """A replica whose engine dies while nothing is asked of it (asleep, say): its ``watch()``
    raises ``EngineDead`` (as ``RolloutWorker.watch`` does once vLLM reports its core dead —
    a tensor-parallel worker killed ends the core), the actor itself lives on."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    async def watch(self) -> None:
        from shunter.engine.replica.backend import EngineDead

        await self.gone.wait()
        raise EngineDead("the vLLM engine of replica hybrid-0 died (its core or a worker process)")

    async def die(self) -> None:
        self.gone.set()


async def test_a_replica_whose_engine_dies_while_idle_is_reported_down_at_once(ray_cluster):
    """Was: the watch saw only the actor's death; an idle replica whose engine died (a killed
    vLLM worker process) stayed up until something called it."""
    actor = ray_cluster.remote(num_cpus=0, max_restarts=0)(EngineDiesIdle).remote()
    ex = RayExecutor("t", None, {"hybrid-0": actor}, timeout_s=5)
    got = []
    down = asyncio.Event()
    ex.bind(lambda evs: (got.extend(evs), down.set()))
    ex.watch("hybrid-0")
    await actor.die.remote()
    async with asyncio.timeout(30):
        await down.wait()
    (ev,) = got
    assert isinstance(ev, ReplicaDown) and ev.replica_id == "hybrid-0" and "inference engine died" in ev.reason, ev
