"""The Ray executor's weight loads over collective groups, with real gloo groups between real
actors: the trainer side is the real ``TrainerHost`` and ``WeightSender`` over a stand-in core
(a flat publisher, no model), the replica side a stand-in that joins and receives with the real
``recv_flat`` under the real ``Received`` rule (``VllmBackend.receive_weights``'s).

Was (CI at f4638e9 and b78e537): a replica woken with a version it had already received while
asleep got a second send it never received, so the trainer's broadcast hung for the group's
timeout; two loads to one replica could also race on one group. Each version now crosses a
group once, one load at a time per replica."""

from __future__ import annotations

import asyncio
import sys

import pytest
from ray import cloudpickle

from shunter.actors.ray_executor import RayExecutor
from shunter.events import (
    CommandFailed,
    EnterRollout,
    InstallWeights,
    ModeChanged,
    Publish,
    WeightsLoaded,
    WeightsReady,
    WeightsSent,
)

pytestmark = [pytest.mark.actors, pytest.mark.timeout(120)]
cloudpickle.register_pickle_by_value(sys.modules[__name__])
GROUP_TIMEOUT_S = 5.0  # a broadcast without its receiver fails within this


def _items(version: int):
    import torch

    g = torch.Generator().manual_seed(version)
    return [("w.a", torch.randn(64, 8, generator=g)), ("w.b", torch.randn(33, generator=g))]


class FlatCore:
    """A trainer core with a flat publisher and a weight sender, no model."""

    def __init__(self) -> None:
        import torch

        from shunter.engine.weights import transport as wt
        from shunter.engine.weights.group import WeightSender

        self.version, self.step = 0, 0
        self.pub = wt.FlatPublisher()
        self.sender = WeightSender("gloo", self.pub, bucket_bytes=256, timeout_s=GROUP_TIMEOUT_S)
        self.dtype = torch.float32

    def publish(self) -> bytes:
        from shunter.engine.weights import transport as wt

        self.version += 1
        return self.pub.publish(_items(self.version), self.dtype, wire=wt.FLAT, version=self.version)

    def open_weight_group(self, replica_id: str):
        return self.sender.open(replica_id)

    def send_weights(self, replica_id: str, version: int) -> dict:
        return self.sender.send(replica_id, version)

    def drop_weight_group(self, replica_id: str) -> None:
        self.sender.drop(replica_id)


class Trainer:
    def __init__(self) -> None:
        from shunter.engine.trainer.host import TrainerHost
        from shunter.events import Stamper

        self.host = TrainerHost(FlatCore(), Stamper("t", "trainer"), transport="ray", threaded=True)

    async def control(self, data: bytes, replicas=None, turn: int = 0):  # as ``TrainerWorker.control``
        import ray

        from shunter.actors.wire import decode_order, encode_events

        events, blob = await self.host.handle(decode_order(data), turn)
        return encode_events(events), ([ray.put(blob)] if blob is not None else [])


class Replica:
    """Joins its group and receives each load's version under the ``Received`` rule; asleep
    (the first load), it only receives; woken (``EnterRollout``), it installs."""

    def __init__(self) -> None:
        from shunter.engine.weights.group import Received

        self.group, self.received, self.version, self.receives = None, Received(), 0, []

    async def control(self, data: bytes, payload=None):
        import torch

        from shunter.actors.wire import decode_order, encode_events
        from shunter.engine.weights import transport as wt
        from shunter.engine.weights.group import make_group, recv_flat
        from shunter.events import JoinWeightGroup

        cmd = decode_order(data)
        if isinstance(cmd, JoinWeightGroup):
            self.group = await asyncio.to_thread(make_group, "gloo", cmd.host, cmd.port, 1, 2, cmd.timeout_s)
            self.received.joined()
            return encode_events([])
        layout = wt.package_layout(bytes(payload))
        v = layout["version"]
        if self.received.fresh(v):
            buf = torch.zeros(layout["nbytes"] // 4, dtype=torch.float32)
            await asyncio.to_thread(recv_flat, self.group, buf, v, timeout_s=GROUP_TIMEOUT_S)
            got = dict(wt.flat_views(buf, layout["entries"]))
            assert all(torch.equal(got[k], x) for k, x in _items(v)), "bytes differ"
            self.received.got(v)
            self.receives.append(v)
        self.version = max(self.version, v)
        if isinstance(cmd, InstallWeights):
            return encode_events([WeightsLoaded(replica_id="r", version=v, duration_s=0.01)])
        return encode_events([ModeChanged(replica_id="r", mode="rollout", previous="trainer", duration_s=0.01)])

    async def log(self) -> list[int]:
        return self.receives


async def _until_idle(ex: RayExecutor) -> None:
    async with asyncio.timeout(60):
        while ex.pending():
            await asyncio.sleep(0.02)


async def test_each_version_crosses_a_group_once_whatever_orders_carry_it(ray_cluster):
    trainer = ray_cluster.remote(num_cpus=0)(Trainer).remote()
    replica = ray_cluster.remote(num_cpus=0, max_concurrency=8)(Replica).remote()
    ex = RayExecutor("t", trainer, {"r": replica}, timeout_s=30, weight_group="gloo", group_timeout_s=GROUP_TIMEOUT_S)
    got: list = []
    ex.bind(got.extend)

    async def publish() -> str:
        ex.send("trainer", Publish())
        await _until_idle(ex)
        return next(e.handle for e in reversed(got) if isinstance(e, WeightsReady))

    h1 = await publish()
    # asleep, the replica receives version 1; woken with the same version, it only installs
    ex.send("r", InstallWeights(version=1, handle=h1))
    await _until_idle(ex)
    ex.send("r", EnterRollout(version=1, handle=h1))
    await _until_idle(ex)
    # three orders carrying version 2 at once: one send, one receive, every order answered
    h2 = await publish()
    for cmd in (
        InstallWeights(version=2, handle=h2),
        EnterRollout(version=2, handle=h2),
        InstallWeights(version=2, handle=h2),
    ):
        ex.send("r", cmd)
    await _until_idle(ex)

    assert not [e for e in got if isinstance(e, CommandFailed)], [e for e in got if isinstance(e, CommandFailed)]
    assert [(e.replica_id, e.version) for e in got if isinstance(e, WeightsSent)] == [("r", 1), ("r", 2)]
    assert await replica.log.remote() == [1, 2]
    assert sum(isinstance(e, WeightsLoaded | ModeChanged) for e in got) == 5
