"""The coordinator's Ray boundary: bytes are decoded by type; bad bytes become an
``EventRejected`` event and the loop goes on; a user's intent is answered with the
coordinator's verdict (``Engine.submit``)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from shunter import Engine
from shunter.actors import coordinator_actor
from shunter.engine.config import from_dict
from shunter.events import (
    Codec,
    EventRejected,
    IntentRejected,
    PublishWeights,
    Rebalance,
    RunStarted,
    Stop,
    SwitchToRollout,
)

pytestmark = pytest.mark.actors


async def test_bad_bytes_are_rejected_with_their_cause_and_the_loop_survives(ray_cluster, tmp_path):
    cfg = from_dict({"run": {"output_dir": str(tmp_path)}, "validation": {"every": 0}})
    codec = Codec()
    # no replicas and a trainer handle that is never called: only the boundary is under test
    actor = coordinator_actor.remote_class().remote(msgspec.msgpack.encode(cfg), "bad-bytes", None, {}, str(tmp_path))
    async with asyncio.timeout(60):
        await actor.start.remote(codec.encode_batch([]))
        assert await actor.ingest.remote(b"\x93\x01\x02", "fuzzer") == 0
        assert await actor.ingest.remote(msgspec.msgpack.encode([{"kind": "no.such_event"}]), "fuzzer") == 0
        for bad in (codec.encode(PublishWeights())[:-1], codec.encode(RunStarted(policy="x", replicas=0))):
            assert isinstance(codec.decode(await actor.submit.remote(bad)), EventRejected)
        engine = Engine(cfg)  # Engine.submit over the real actor: the coordinator's verdict comes back
        engine.coordinator = actor
        refused = await engine.submit(SwitchToRollout(replica_ids=["hybrid-1"]))
        assert not refused and refused.rejected.reason == "unknown_replica"
        assert refused.rejected.detail == "no replica hybrid-1 in this run (known: none)"
        rebalanced = await engine.submit(Rebalance())
        assert rebalanced.accepted and rebalanced.intent.source == "user" and rebalanced.intent.seq == 2
        stopped = await engine.submit(Stop(reason="test"))
        assert stopped.accepted and isinstance(stopped.intent, Stop)
        ended = codec.decode(await actor.wait_ended.remote())
        items, _, missed = await actor.fetch.remote(0, 1000, 0.1)
    msgs = [codec.decode(b) for b in items]
    rejected = [m for m in msgs if isinstance(m, EventRejected)]
    assert [r.origin for r in rejected] == ["fuzzer", "fuzzer", "user", "user"]
    assert [m.reason for m in msgs if isinstance(m, IntentRejected)] == ["unknown_replica"]
    assert "no.such_event" in rejected[1].error and "truncated" in rejected[2].error.lower() or rejected[2].error
    assert "got event RunStarted" in rejected[3].error
    assert ended.reason in ("completed", "stopped") and missed == 0
    ray_cluster.kill(actor)


async def test_a_full_disk_ends_the_run_and_every_reader_hears_of_it(ray_cluster, tmp_path):
    """The event log's disk is full (``events.bin`` -> /dev/full): the loop's fault barrier ends
    the run naming the sink and the cause, ``fetch`` hands that ``RunEnded`` out and
    ``wait_ended`` returns it — no reader polls a dead loop."""
    from shunter.events import SampleBegin

    cfg = from_dict({"run": {"output_dir": str(tmp_path)}, "validation": {"every": 0}})
    (tmp_path / "events.bin").symlink_to("/dev/full")
    codec = Codec()
    actor = coordinator_actor.remote_class().remote(msgspec.msgpack.encode(cfg), "disk-full", None, {}, str(tmp_path))
    noise = codec.encode_batch(
        [SampleBegin(sample_id=f"{i}.0", group_id=i, replica_id="r", version=0) for i in range(300)]
    )  # past the log's 256-frame flush
    async with asyncio.timeout(60):
        await actor.start.remote(codec.encode_batch([]))
        await actor.ingest.remote(noise, "test")
        ended = codec.decode(await actor.wait_ended.remote())
        cursor, seen = 0, []
        while not any(type(m).__name__ == "RunEnded" for m in seen):
            items, cursor, _ = await actor.fetch.remote(cursor, 1000, 0.5)
            seen += [codec.decode(b) for b in items]
    assert ended.reason == "error" and ended.fault.startswith("sink:EventLog on ")
    assert "No space left on device" in ended.error
    assert seen[-1] == ended
    ray_cluster.kill(actor)


def test_an_actor_the_cluster_has_no_room_for_is_refused_at_once_not_left_waiting(ray_cluster, tmp_path):
    """Ray would keep an unschedulable actor pending for ever (an ``add_replica`` that never
    comes up); the launcher checks the cluster first and says what is missing — CPUs, or a
    custom resource no node offers (with the command that starts one)."""
    from shunter.actors.launch.cluster import check_total, request
    from shunter.engine.io.errors import EngineSetupError

    with pytest.raises(EngineSetupError, match=r"no room in the Ray cluster for another replica: it needs 64 CPU"):
        check_total(request(64, 0), "another replica", {"CPU": "rollout.num_cpus"})
    with pytest.raises(EngineSetupError, match=r"'node_b' \(rollout.resources\) and no node offers it .*ray start"):
        check_total(request(0.5, 0, {"node_b": 1}), "another replica", {"node_b": "rollout.resources"})
    check_total(request(0.01, 0), "a small one", {})


async def test_a_replica_without_room_waits_saying_for_what_then_gives_up_past_its_deadline(ray_cluster):
    """Room that can come back (a lost node's, another run's) is waited for: once said (the
    ``ReplicaPending`` the launcher sends), then an error past the deadline naming what was missing."""
    from shunter.actors.launch.cluster import request, wait_for_room
    from shunter.engine.io.errors import EngineSetupError

    free = ray_cluster.available_resources().get("CPU", 0.0)

    @ray_cluster.remote(num_cpus=free)
    class Hog:
        """Holds the cluster's free CPUs (a node's capacity gone)."""

        def ready(self) -> bool:
            return True

    hog = Hog.remote()
    await hog.ready.remote()
    said: list = []
    ended: list = []

    async def waiting(short, have):
        said.append((short, have))

    async def waited(outcome, seconds):
        ended.append(outcome)

    try:
        with pytest.raises(EngineSetupError, match=r"within 1s \(rollout.replacement_wait_s\): it needs 0.5 CPU"):
            await wait_for_room(
                request(0.5, 0), "a replacement", {"CPU": "rollout.num_cpus"}, 1.0, waiting, waited, poll_s=0.1
            )
        assert said == [({"CPU": 0.5}, {"CPU": 0.0})]
        assert ended == ["gave_up"]  # the "waiting" line got its "done waiting" line
    finally:
        ray_cluster.kill(hog)
    # the room comes back (the hog's CPUs freed a moment after its kill): the wait ends, no error
    assert 0 <= await wait_for_room(request(0.5, 0), "a replacement", {}, 30.0, waiting, waited, poll_s=0.1) < 30
    assert ended == ["gave_up"] + ["placed"] * (len(said) - 1)  # waited only if it said so
