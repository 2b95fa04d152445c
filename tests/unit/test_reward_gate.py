"""A reward worker's gate (``actors.rewards``): batches share the worker, a call tried again
alone holds it by itself — it waits for the batches running, none starts while it waits or
runs, and a hold whose caller never comes back is released by its lease. Virtual time."""

from __future__ import annotations

import asyncio

from fakes import virtual_time

from shunter.actors.rewards import RewardWorker, _Gate


@virtual_time
async def test_a_holder_waits_for_running_batches_and_no_batch_starts_until_it_is_done():
    gate, log = _Gate(), []

    async def batch(name: str, s: float) -> None:
        async with gate.share():
            log.append(f"{name}+")
            await asyncio.sleep(s)
            log.append(f"{name}-")

    async def alone() -> None:
        token = await gate.hold()
        log.append("alone+")
        await asyncio.sleep(1.0)
        log.append("alone-")
        await gate.release(token)

    first = asyncio.ensure_future(batch("a", 2.0))
    await asyncio.sleep(0.5)
    held = asyncio.ensure_future(alone())
    await asyncio.sleep(0.5)
    late = asyncio.ensure_future(batch("b", 1.0))  # arrives while the holder waits: goes after it
    await asyncio.gather(first, held, late)
    assert log == ["a+", "a-", "alone+", "alone-", "b+", "b-"]


@virtual_time
async def test_two_holders_never_overlap_and_a_forgotten_hold_is_released_by_its_lease():
    w = RewardWorker.__new__(RewardWorker)  # the worker's gate and leases, without loading a reward
    w.gate, w.leases = _Gate(), {}
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    token = await w.hold(lease_s=5.0)  # its replica died before score_held
    second = await w.hold(lease_s=5.0)
    assert second != token and loop.time() - t0 == 5.0  # waited for the first lease to run out
    assert w.leases.keys() == {second} and w.gate.held == second


@virtual_time
async def test_a_worker_started_again_never_hands_out_a_token_its_previous_process_did():
    """A caller that held the old process's worker (token in hand, score_held on its way) must not
    find the new process's holder under the same token: its score_held would run as that holder
    and release its hold, so two calls would run at once on a worker meant to be held."""
    old, new = _Gate(), _Gate()  # one worker's gate before and after Ray starts it again
    assert await old.hold() != await new.hold()
