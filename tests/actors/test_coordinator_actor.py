"""The coordinator's Ray boundary: bytes are decoded by type; bad bytes become an
``EventRejected`` event and the loop goes on."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from shunter.actors import coordinator
from shunter.engine.config import from_dict
from shunter.events import Codec, EventRejected, PublishWeights, RunStarted, Stop

pytestmark = pytest.mark.actors


async def test_bad_bytes_are_rejected_with_their_cause_and_the_loop_survives(ray_cluster, tmp_path):
    cfg = from_dict({"run": {"output_dir": str(tmp_path)}, "validation": {"every": 0}})
    codec = Codec()
    # no replicas and a trainer handle that is never called: only the boundary is under test
    actor = coordinator.remote_class().remote(msgspec.msgpack.encode(cfg), "bad-bytes", None, {}, str(tmp_path))
    async with asyncio.timeout(60):
        await actor.start.remote(codec.encode_batch([]))
        assert await actor.ingest.remote(b"\x93\x01\x02", "fuzzer") == 0
        assert await actor.ingest.remote(msgspec.msgpack.encode([{"kind": "no.such_event"}]), "fuzzer") == 0
        assert await actor.submit.remote(codec.encode(PublishWeights())[:-1]) is False
        assert await actor.submit.remote(codec.encode(RunStarted(policy="x", replicas=0))) is False  # an event
        assert await actor.submit.remote(codec.encode(Stop(reason="test"))) is True
        ended = codec.decode(await actor.wait_ended.remote())
        items, _, missed = await actor.fetch.remote(0, 1000, 0.1)
    msgs = [codec.decode(b) for b in items]
    rejected = [m for m in msgs if isinstance(m, EventRejected)]
    assert [r.origin for r in rejected] == ["fuzzer", "fuzzer", "user", "user"]
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
    actor = coordinator.remote_class().remote(msgspec.msgpack.encode(cfg), "disk-full", None, {}, str(tmp_path))
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
    comes up); the launcher checks the room first and says what is missing."""
    from shunter.actors.launch import Launcher
    from shunter.engine.errors import EngineSetupError

    launcher = Launcher(from_dict({"run": {"output_dir": str(tmp_path)}}), "no-room", tmp_path)
    with pytest.raises(EngineSetupError, match=r"no room in the Ray cluster for another replica: it needs 64 CPU"):
        launcher._fits("another replica", 64, 0)
    launcher._fits("a small one", 0.01, 0)
