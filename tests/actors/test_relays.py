"""Relay actors (``actors/relay_actor.py``, ``actors/host_relays.py``) with real Ray and stand-in replicas:
a host's relay is made when a replica lands there, takes the turn's ``Generate`` orders in one
call, streams the replica's facts back folded (the executor counts its open calls, so the loop
never takes a relayed run for idle), and when its process is ``kill -9``-ed every replica behind
it is reported down once — as is a replica that dies under the relay."""

from __future__ import annotations

import asyncio
import os
import signal

import psutil
import pytest

from shunter.actors.ray_executor import RayExecutor
from shunter.events import Generate, PromptSpec, RelayReport, ReplicaDown, SampleEnd, SamplingSpec, flatten

pytestmark = pytest.mark.actors


def _ship_by_value():
    import sys

    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


_ship_by_value()
SETTINGS = {"window_s": 0.05, "max_events": 64, "timeout_s": 30.0, "generate_timeout_s": 30.0}


def gen(i: int) -> Generate:
    return Generate(group_id=i, prompt=PromptSpec(prompt_id=i, text="12>"), n=2, sampling=SamplingSpec(max_tokens=4))


class Replica:
    """Ends each of a group's samples at once (``hold``: then keeps the stream open for ever)."""

    def __init__(self, hold: bool = False) -> None:
        self.hold = hold

    async def generate(self, data: bytes):
        from shunter.actors.wire import codec, encode_events
        from shunter.events import Sample

        cmd = codec().decode(data)
        for k in range(cmd.n):
            s = Sample(
                sample_id=f"{cmd.group_id}.{k}",
                group_id=cmd.group_id,
                prompt_id=cmd.group_id,
                prompt_token_ids=[1],
                token_ids=[2],
                logprobs=[-1.0],
                versions=[0],
                max_tokens=4,
            )
            yield encode_events([SampleEnd(replica_id="standalone-0", sample=s)])
        if self.hold:
            await asyncio.sleep(3600)

    async def watch(self) -> None:
        await asyncio.Event().wait()

    def pid(self) -> int:
        return os.getpid()


class Dies(Replica):
    async def generate(self, data: bytes):
        os._exit(1)
        yield b""


async def executor_with(ray, replica_cls, **kw):
    h = ray.remote(num_cpus=0)(replica_cls).remote(**kw)
    ex = RayExecutor("t-relay", None, {"standalone-0": h}, timeout_s=30, relays=SETTINGS, relay_here=True)
    got: list = []
    ex.bind(got.extend)
    ex.place("standalone-0", ray.get_runtime_context().get_node_id())
    return ex, h, got


def _this_clusters_processes() -> list[psutil.Process]:
    """The worker processes of this test session's Ray cluster (its raylet's descendants) — not
    those of another cluster on the machine (tests run side by side)."""
    import ray

    raylet = ray._private.worker._global_node.all_processes["raylet"][0].process.pid
    return psutil.Process(raylet).children(recursive=True)


async def until(check, timeout: float = 60.0):
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.05)  # polling what the executor posted (from Ray's threads)


async def test_orders_go_through_the_hosts_relay_and_its_facts_come_back_folded(ray_cluster):
    ex, _, got = await executor_with(ray_cluster, Replica)
    try:
        assert ex.relay_of("standalone-0") == ""  # until the relay has acknowledged the replica
        for i in range(3):
            ex.send("standalone-0", gen(i))
        assert ex.pending() == 3  # handed over: open until the relay says the streams ended
        await until(lambda: sum(isinstance(m, SampleEnd) for m in flatten(got)) == 6)
        await until(lambda: ex.pending() == 0)
        assert any(isinstance(m, RelayReport) and ".relay." in m.relay for m in got)
        await until(lambda: ex.relay_of("standalone-0") != "")
    finally:
        await ex.close()


async def test_a_relay_killed_by_the_os_takes_its_replicas_down_once(ray_cluster):
    ex, _, got = await executor_with(ray_cluster, Replica, hold=True)
    try:
        ex.send("standalone-0", gen(0))
        await until(lambda: any(isinstance(m, SampleEnd) for m in flatten(got)))
        relay = next(p for p in _this_clusters_processes() if "RelayActor" in " ".join(p.cmdline()))
        os.kill(relay.pid, signal.SIGKILL)
        await until(lambda: any(isinstance(m, ReplicaDown) for m in got))
        down = [m for m in got if isinstance(m, ReplicaDown)]
        assert len(down) == 1 and "the relay of its host died" in down[0].reason
        assert ex.pending() == 0 and ex.relay_of("standalone-0") == ""
    finally:
        await ex.close()


async def test_a_replica_that_dies_under_its_relay_is_reported_down_once(ray_cluster):
    ex, _, got = await executor_with(ray_cluster, Dies)
    try:
        ex.watch("standalone-0")  # the coordinator's own watch sees the death too: still one report
        ex.send("standalone-0", gen(0))
        await until(lambda: any(isinstance(m, ReplicaDown) for m in got))
        # both have spoken: the relay's stream of the call ended (its report, if any, came before
        # that count) and the watch saw the death
        await until(lambda: ex.pending() == 0 and ex._watches["standalone-0"].done())
        assert sum(isinstance(m, ReplicaDown) for m in got) == 1
    finally:
        await ex.close()
