"""Direct loads (``Publish.deliver`` to ``DIRECT``) with real Ray: the real ``TrainerWorker``
actor orders the loads of the replicas the coordinator's process serves as it publishes, their
answers come back beside ``WeightsReady`` and are read like loads sent from the executor — with
the same failure events. The trainer's core and the replicas are stand-ins (what they compute is
not what is tested here; ``tests/e2e`` runs the real ones on this path by default)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from shunter.actors.ray_executor import RayExecutor
from shunter.actors.trainer_worker import INLINE_BYTES, TrainerWorker
from shunter.events import (
    DIRECT,
    CommandFailed,
    Delivery,
    Publish,
    ReplicaDown,
    Train,
    WeightsLoaded,
    WeightsReady,
    flatten,
)

pytestmark = pytest.mark.actors


def _ship_by_value():
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


_ship_by_value()
IDS = ["standalone-0", "standalone-1"]


class Core:
    """A trainer core that publishes ``size`` bytes per version (its training step yields to the
    loop, so a ``Publish`` arrives while a ``Train`` is under way)."""

    def __init__(self, size: int) -> None:
        self.size, self.step, self.version = size, 0, 0

    async def train_step(self, samples, loss_fn):
        await asyncio.sleep(0.2)  # overlap only: the outcome holds whatever the order
        self.step += 1
        return {}

    async def publish(self) -> bytes:
        self.version += 1
        return bytes([self.version % 251]) * self.size


class Trainer(TrainerWorker):
    def __init__(self, size: int, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.size = size

    async def setup(self) -> float:  # the real actor, around a stand-in core
        from shunter.engine.trainer.host import TrainerHost
        from shunter.events import Stamper

        self.host = TrainerHost(Core(self.size), Stamper(self.run_id, "trainer"), deliver=self._deliver)
        return 0.0


class Replica:
    """Loads what it is handed: answers ``WeightsLoaded`` naming the bytes' first value and size."""

    def __init__(self, rid: str, die: bool = False) -> None:
        self.rid, self.die, self.loads = rid, die, 0

    async def control(self, data: bytes, payload=None) -> bytes:
        import os

        from shunter.actors.wire import codec, encode_events

        cmd = codec().decode(data)
        if self.die:
            os._exit(1)
        self.loads += 1
        assert isinstance(payload, bytes), type(payload)
        detail = {"first": payload[0], "nbytes": len(payload)}
        loaded = WeightsLoaded(replica_id=self.rid, version=cmd.version, duration_s=0.0, detail=detail)
        return encode_events([loaded])

    def count(self) -> int:
        return self.loads

    async def watch(self) -> None:
        await asyncio.Event().wait()


async def start(ray, size: int, die: set[str] = frozenset()):
    import msgspec

    from shunter.engine.config import TrainerConfig

    cfg = msgspec.msgpack.encode(TrainerConfig())
    trainer = ray.remote(num_cpus=0)(Trainer).remote(size, "t-direct", cfg, "")
    await trainer.setup.remote()
    reps = {rid: ray.remote(num_cpus=0)(Replica).remote(rid, rid in die) for rid in IDS}
    ex = RayExecutor("t-direct", trainer, reps, timeout_s=30)
    got: list = []
    ex.bind(got.extend)
    return ex, reps, got


async def until(check, timeout: float = 60.0):
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.05)  # polling what the executor posted (from Ray's threads)


def publish(ex) -> Publish:
    assert all(ex.relay_of(rid) == DIRECT for rid in IDS)
    return Publish(deliver=[Delivery(relay=DIRECT, replica_ids=IDS)])


@pytest.mark.parametrize("size", [64, INLINE_BYTES * 3], ids=["inline", "object_store"])
async def test_the_trainer_orders_the_loads_and_the_answers_come_back_after_weights_ready(ray_cluster, size):
    ex, reps, got = await start(ray_cluster, size)
    try:
        ex.send("trainer", Train(batch_id=0, samples=[], loss_fn="grpo"))  # under way as the publish comes
        ex.send("trainer", publish(ex))
        await until(lambda: sum(isinstance(m, WeightsLoaded) for m in flatten(got)) == 2)
        await until(lambda: ex.pending() == 0)
        msgs = list(flatten(got))
        ready = next(i for i, m in enumerate(msgs) if isinstance(m, WeightsReady))
        loaded = [(i, m) for i, m in enumerate(msgs) if isinstance(m, WeightsLoaded)]
        assert all(i > ready for i, _ in loaded)  # heard after the version they load
        assert {m.replica_id for _, m in loaded} == set(IDS)
        assert all(m.version == 1 and m.detail == {"first": 1, "nbytes": size} for _, m in loaded)
        assert "deliver_s" not in msgs[ready].detail or msgs[ready].detail["deliver_s"] >= 0
        # each replica was called once, by the trainer: the executor sent no InstallWeights itself
        assert [await reps[rid].count.remote() for rid in IDS] == [1, 1]
    finally:
        await ex.close()


async def test_a_replica_that_dies_on_a_direct_load_is_reported_down_once_and_the_other_loads(ray_cluster):
    ex, _, got = await start(ray_cluster, 64, die={"standalone-1"})
    try:
        ex.watch("standalone-1")  # its watch sees the death too: still one report
        ex.send("trainer", publish(ex))
        await until(lambda: any(isinstance(m, ReplicaDown) for m in got))
        await until(lambda: ex.pending() == 0 and ex._watches["standalone-1"].done())
        down = [m for m in got if isinstance(m, ReplicaDown)]
        assert len(down) == 1 and down[0].replica_id == "standalone-1"
        assert [m.replica_id for m in flatten(got) if isinstance(m, WeightsLoaded)] == ["standalone-0"]
        assert not any(isinstance(m, CommandFailed) for m in got)
        assert ex.relay_of("standalone-1") == ""  # down: no more direct loads for it
    finally:
        await ex.close()


async def test_without_direct_weights_nothing_is_delivered_straight(ray_cluster):
    ex, _, _ = await start(ray_cluster, 64)
    try:
        ex.direct_weights = False
        assert all(ex.relay_of(rid) == "" for rid in IDS)
        ex.groups.backend, ex.direct_weights = "gloo", True
        assert all(ex.relay_of(rid) == "" for rid in IDS)  # a group pairs each load with a send
    finally:
        await ex.close()
