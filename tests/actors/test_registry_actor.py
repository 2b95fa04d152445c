"""The replica registry as a real Ray actor: atomic under concurrent registration,
ranks unique across hybrid and standalone, released ranks reused, names per run."""

from __future__ import annotations

import asyncio

import pytest

from shunter.actors import registry_actor
from shunter.events import Codec, RankAssigned, RankReleased

pytestmark = pytest.mark.actors


async def test_64_concurrent_registrations_get_unique_ranks(ray_cluster):
    reg = (
        registry_actor.remote_class()
        .options(name=registry_actor.registry_name("reg-a"), namespace="shunter")
        .remote("reg-a")
    )
    ids = [
        (f"{'hybrid' if i % 3 == 0 else 'standalone'}-{i}", "hybrid" if i % 3 == 0 else "standalone") for i in range(64)
    ]
    async with asyncio.timeout(60):
        out = await asyncio.gather(*(reg.register.remote(i, k) for i, k in ids))
        again = await asyncio.gather(*(reg.register.remote(i, k) for i, k in ids[:8]))
    ranks = [r for r, _, _ in out]
    names = [n for _, n, _ in out]
    assert sorted(ranks) == list(range(64))
    assert len(set(names)) == 64 and all(n.startswith("shunter.reg-a.") for n in names)
    assert [r for r, _, _ in again] == ranks[:8]  # idempotent
    codec = Codec()
    assert all(isinstance(codec.decode_batch(ev)[0], RankAssigned) for _, _, ev in out)
    assert codec.decode_batch(again[0][2]) == []  # no second RankAssigned
    assert await reg.check.remote()
    ray_cluster.kill(reg)


async def test_release_reuses_smallest_rank_and_snapshot_recovers(ray_cluster):
    reg = registry_actor.remote_class().remote("reg-b")
    async with asyncio.timeout(60):
        for i in range(4):
            await reg.register.remote(f"s{i}", "standalone")
        released = Codec().decode_batch(await reg.release.remote("s1", "replica.down"))
        assert isinstance(released[0], RankReleased) and released[0].rank == 1
        rank, name, _ = await reg.register.remote("h9", "hybrid")
        assert rank == 1 and "r1.g5" in name
        snap = await reg.snapshot.remote()
        ray_cluster.kill(reg)
        restored = registry_actor.remote_class().remote("reg-b", snap)
        leases = await restored.leases.remote()
    assert [(rid, r) for rid, _, r, _ in leases] == [("s0", 0), ("h9", 1), ("s2", 2), ("s3", 3)]
    ray_cluster.kill(restored)


async def test_two_runs_in_one_cluster_have_distinct_registry_names(ray_cluster):
    a = (
        registry_actor.remote_class()
        .options(name=registry_actor.registry_name("run-x"), namespace="shunter")
        .remote("run-x")
    )
    b = (
        registry_actor.remote_class()
        .options(name=registry_actor.registry_name("run-y"), namespace="shunter")
        .remote("run-y")
    )
    async with asyncio.timeout(60):
        (_, na, _), (_, nb, _) = await asyncio.gather(
            a.register.remote("s0", "standalone"), b.register.remote("s0", "standalone")
        )
    assert na != nb
    ray_cluster.kill(a)
    ray_cluster.kill(b)


async def test_a_registry_that_crashes_mid_registration_comes_back_with_its_table(ray_cluster, tmp_path):
    """Issue 4, item 4/6: Ray restarts the registry (its table is on disk), the calls in
    flight are retried (they are idempotent), and ranks stay unique across the crash."""
    reg = registry_actor.remote_class().remote("reg-crash", None, str(tmp_path / "registry_actor.msgpack"))
    async with asyncio.timeout(120):
        first = await asyncio.gather(*(reg.register.remote(f"s{i}", "standalone") for i in range(8)))
        ray_cluster.kill(reg, no_restart=False)  # a crash; Ray brings it back
        more = await asyncio.gather(
            *(reg.register.remote(f"h{i}", "hybrid") for i in range(8)),
            *(reg.register.remote(f"s{i}", "standalone") for i in range(8)),
        )
        leases = await reg.leases.remote()
        assert await reg.check.remote()
    assert [r for r, _, _ in more[8:]] == [r for r, _, _ in first]  # the table survived: same ranks again
    ranks = [r for _, _, r, _ in leases]
    assert sorted(ranks) == list(range(16)) and len({n for *_, n in leases}) == 16
    ray_cluster.kill(reg)
