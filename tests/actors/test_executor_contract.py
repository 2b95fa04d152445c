"""The executor contract, one set of checks run against both executors over real components:
``LocalExecutor`` (in-process ``RolloutCore`` / ``TrainerHost``) and ``RayExecutor`` (the real
``RolloutWorker`` / ``TrainerWorker`` actor shells on a local Ray cluster), each around the test
stand-ins for vLLM and torch (``FakeBackend``, ``FakeTrainerCore``).

What every executor owes the coordinator: ``send`` never raises and never blocks; every order's
outcome comes back as events; a command that raises is one ``CommandFailed`` naming the target
and the cause; a replica whose engine dies (``EngineDead``) or whose process dies is exactly one
``ReplicaDown``, and its later calls answer nothing; ``pending()`` counts the calls in flight and
``close()`` cancels them. (Both executors take the one failure path, ``Failures`` in
``engine/coordinator/executor.py``.)"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import pytest
from ray import cloudpickle

import tests.support.fakes as fakes
from shunter.actors.ray_executor import RayExecutor
from shunter.actors.rollout_worker import RolloutWorker
from shunter.actors.trainer_worker import TrainerWorker
from shunter.engine.coordinator.executor import TRAINER
from shunter.engine.coordinator.local_executor import LocalExecutor
from shunter.engine.replica.core import RolloutCore
from shunter.engine.tasks import load_task
from shunter.engine.trainer.host import TrainerHost
from shunter.events import (
    CommandFailed,
    ComponentFailed,
    Generate,
    InstallWeights,
    PromptSpec,
    Publish,
    ReplicaDown,
    SampleEnd,
    SamplingSpec,
    Stamper,
    Train,
    WeightsLoaded,
    WeightsReady,
    tag_of,
)
from shunter.events.vocab import ROLLOUT
from tests.support.fakes import CharTokenizer, FakeBackend, FakeTrainerCore

pytestmark = [pytest.mark.actors, pytest.mark.timeout(300)]
# the stand-in actors and the fakes live in test modules, which Ray workers cannot import
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(fakes)

RUN = "t-contract"
TASK = "sort_digits"
QUICK, OTHER, SLOW = "standalone-0", "standalone-1", "standalone-2"
TOKEN_S = {QUICK: 0.001, OTHER: 0.001, SLOW: 1.0}  # SLOW: a group takes ~10 s (its calls stay in flight)


def gen(group_id: int, text: str = "21>") -> Generate:
    return Generate(group_id=group_id, prompt=PromptSpec(prompt_id=group_id, text=text), n=2, sampling=SamplingSpec())


class Replica(RolloutWorker):
    """The real replica actor, around a ``FakeBackend`` instead of vLLM."""

    def __init__(self, replica_id: str, token_s: float) -> None:
        super().__init__(
            RUN, replica_id, "", reward="", task=TASK, mode=ROLLOUT, seed=0, max_model_len=0, max_tokens=16
        )
        self.token_s = token_s

    async def setup(self) -> float:
        self._loop = asyncio.get_running_loop()
        self._tok, self._reward = CharTokenizer(), load_task(self.task).reward
        self._backend = FakeBackend(token_s=self.token_s)
        self.core = self._new_core(self._backend)
        return 0.0

    def die_engine(self) -> None:
        self._backend.die()

    def pid(self) -> int:
        return os.getpid()


class Trainer(TrainerWorker):
    """The real trainer actor, around a ``FakeTrainerCore`` instead of torch."""

    async def setup(self) -> float:
        self.host = TrainerHost(FakeTrainerCore(), Stamper(self.run_id, "trainer"), deliver=self._deliver)
        return 0.0


class Local:
    """A ``LocalExecutor`` over in-process replicas and trainer."""

    def __init__(self) -> None:
        self.backends = {rid: FakeBackend(token_s=s) for rid, s in TOKEN_S.items()}
        reward = load_task(TASK).reward
        cores = {
            rid: RolloutCore(rid, b, CharTokenizer(), reward, Stamper(RUN, rid)) for rid, b in self.backends.items()
        }
        trainer = TrainerHost(FakeTrainerCore(), Stamper(RUN, "trainer"), threaded=False)
        self.ex = LocalExecutor(RUN, trainer, cores)

    async def engine_dies(self, rid: str) -> None:
        self.backends[rid].die()

    async def actor_dies(self, rid: str) -> None:
        self.ex.kill(rid, reason="actor died")  # what a dead actor is here: its calls vanish

    async def settled(self, rid: str) -> None:
        pass

    async def close(self) -> None:
        await self.ex.close()


class OverRay:
    """A ``RayExecutor`` over the real actor shells, watching them as the coordinator does."""

    def __init__(self, ray) -> None:
        self.ray = ray

    async def start(self) -> OverRay:
        import msgspec

        from shunter.engine.config import TrainerConfig

        ray = self.ray
        self.trainer = ray.remote(num_cpus=0, max_restarts=0)(Trainer).remote(
            RUN, msgspec.msgpack.encode(TrainerConfig()), ""
        )
        groups = {"control": 8, "generate": 100_000, "watch": 1}  # as ``actors.rollout_worker.remote_class``
        self.replicas = {
            rid: ray.remote(num_cpus=0, max_restarts=0, concurrency_groups=groups)(Replica).remote(rid, s)
            for rid, s in TOKEN_S.items()
        }
        await asyncio.gather(self.trainer.setup.remote(), *(h.setup.remote() for h in self.replicas.values()))
        self.ex = RayExecutor(RUN, self.trainer, self.replicas, timeout_s=30)
        return self

    async def engine_dies(self, rid: str) -> None:
        await self.replicas[rid].die_engine.remote()

    async def actor_dies(self, rid: str) -> None:
        os.kill(await self.replicas[rid].pid.remote(), signal.SIGKILL)

    async def settled(self, rid: str) -> None:
        """Its watch has seen the death too (a second source of the same news)."""
        await until(lambda: self.ex._watches[rid].done())

    async def close(self) -> None:
        await self.ex.close()
        for t in self.ex._watches.values():
            t.cancel()
        for h in [self.trainer, *self.replicas.values()]:
            try:
                self.ray.kill(h)
            except Exception:  # noqa: BLE001 - already gone
                pass


@pytest.fixture(params=["local", "ray"])
async def side(request):
    h = Local() if request.param == "local" else await OverRay(request.getfixturevalue("ray_cluster")).start()
    h.got = []
    h.ex.bind(h.got.extend)
    if request.param == "ray":
        h.ex.watch_all()
    try:
        yield h
    finally:
        await h.close()


async def until(check, timeout: float = 60.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.02)


async def idle(ex) -> None:
    await until(lambda: ex.pending() == 0)


def of(got: list, cls: type) -> list:
    return [e for e in got if isinstance(e, cls)]


async def test_send_returns_at_once_never_raises_and_every_outcome_comes_back_as_events(side):
    ex, got = side.ex, side.got
    t0 = time.perf_counter()
    ex.send(SLOW, gen(9))  # ~3 s of generation
    ex.send(TRAINER, Publish())
    ex.send("nowhere", gen(8))  # no such replica: an outcome all the same
    took = time.perf_counter() - t0
    assert took < 0.5, took
    assert ex.pending() == 3 and got == []  # the calls are under way; none ran inside send
    await until(lambda: of(got, WeightsReady) and of(got, CommandFailed))
    (ready,) = of(got, WeightsReady)
    ex.send(QUICK, InstallWeights(version=ready.version, handle=ready.handle))
    ex.send(QUICK, gen(0))
    await idle(ex)
    (loaded,) = of(got, WeightsLoaded)
    assert ready.version == 1 and (loaded.replica_id, loaded.version) == (QUICK, 1)
    ends = of(got, SampleEnd)
    assert sorted((e.replica_id, e.sample.group_id) for e in ends) == [(QUICK, 0)] * 2 + [(SLOW, 9)] * 2
    (failed,) = of(got, CommandFailed)
    assert (failed.target, failed.command_kind) == ("nowhere", tag_of(gen(8))) and "KeyError" in failed.error
    assert not of(got, ReplicaDown) and not of(got, ComponentFailed)


async def test_a_command_that_raises_is_one_command_failed_naming_target_and_cause(side):
    ex, got = side.ex, side.got
    train = Train(batch_id=0, samples=[])
    ex.send(QUICK, train)  # a replica does not train
    ex.send(TRAINER, gen(0))  # the trainer does not generate
    await idle(ex)
    failed = {f.target: f for f in of(got, CommandFailed)}
    assert len(of(got, CommandFailed)) == 2 and set(failed) == {QUICK, TRAINER}, got
    assert failed[QUICK].command_kind == tag_of(train)
    assert failed[QUICK].error == "TypeError: a rollout replica does not take Train"
    assert failed[TRAINER].command_kind == tag_of(gen(0)) and failed[TRAINER].group_id == 0
    assert failed[TRAINER].error == "TypeError: the trainer does not take Generate"
    ex.send(QUICK, gen(1))  # both live on: a failed command is no dead component
    await idle(ex)
    assert len(of(got, SampleEnd)) == 2
    assert not of(got, ReplicaDown) and not of(got, ComponentFailed)


@pytest.mark.parametrize("death", ["engine", "actor"])
async def test_a_dead_replica_is_one_replica_down_and_its_later_calls_answer_nothing(side, death):
    ex, got = side.ex, side.got
    if death == "engine":
        await side.engine_dies(QUICK)
        for g in range(3):  # several calls in flight as it is found dead: still one report
            ex.send(QUICK, gen(g))
    else:
        await side.actor_dies(QUICK)
    await until(lambda: of(got, ReplicaDown))
    await idle(ex)
    await side.settled(QUICK)
    (down,) = of(got, ReplicaDown)
    assert down.replica_id == QUICK
    cause = f"its inference engine died during {tag_of(gen(0))}" if death == "engine" else "actor died"
    assert cause in down.reason, down.reason
    assert not of(got, CommandFailed)
    seen = len(got)
    ex.send(QUICK, gen(5))
    ex.send(QUICK, InstallWeights(version=0, handle=""))
    await idle(ex)
    assert got[seen:] == []  # a dead replica answers nothing, and is not reported down again
    ex.send(OTHER, gen(6))  # the others live on
    await idle(ex)
    assert [e.replica_id for e in of(got, SampleEnd)] == [OTHER, OTHER]


async def test_pending_counts_the_calls_in_flight_and_close_cancels_them(side):
    ex, got = side.ex, side.got
    for g in range(3):
        ex.send(SLOW, gen(g, "9876543210>"))
    assert ex.pending() == 3
    await asyncio.sleep(0.5)
    assert ex.pending() == 3  # under way, nothing answered yet
    await ex.close()
    assert ex.pending() == 0
    await asyncio.sleep(1.5)
    assert not of(got, SampleEnd) and not of(got, CommandFailed), got  # cancelled: nothing comes late
