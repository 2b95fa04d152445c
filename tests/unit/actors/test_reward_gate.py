"""A reward worker's gate (``actors.reward_workers``): batches share the worker, a call tried again
alone holds it by itself — it waits for the batches running, none starts while it waits or
runs, and a hold whose caller never comes back is released by its lease; a worker that dies
beside a call that had timed out does not convict the holder. Virtual time."""

from __future__ import annotations

import asyncio
import types

from ray.exceptions import RayActorError

from shunter.actors.reward_workers import ALONE_TRIES, PoolRewards, RewardWorker, WorkerGate
from shunter.engine.data.rewards import Scored
from shunter.events import PromptSpec
from tests.support.fakes import virtual_time


@virtual_time
async def test_a_holder_waits_for_running_batches_and_no_batch_starts_until_it_is_done():
    gate, log = WorkerGate(), []

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
    w.gate, w.leases, w.rewards = WorkerGate(), {}, types.SimpleNamespace(stuck=0)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    token, _ = await w.hold(lease_s=5.0)  # its replica died before score_held
    second, stuck = await w.hold(lease_s=5.0)
    assert second != token and loop.time() - t0 == 5.0 and stuck == 0  # waited for the first lease to run out
    assert w.leases.keys() == {second} and w.gate.held == second


@virtual_time
async def test_a_worker_started_again_never_hands_out_a_token_its_previous_process_did():
    """A caller that held the old process's worker (token in hand, score_held on its way) must not
    find the new process's holder under the same token: its score_held would run as that holder
    and release its hold, so two calls would run at once on a worker meant to be held."""
    old, new = WorkerGate(), WorkerGate()  # one worker's gate before and after Ray starts it again
    assert await old.hold() != await new.hold()


class _Method:
    def __init__(self, fn):
        self.remote = fn


class DyingWorker:
    """A reward worker's Ray handle, as ``PoolRewards`` calls it. ``zombie``: a call that timed out
    on this process still runs in a thread and kills the process during the next held call.
    ``culprit``: the response whose own call kills the process, every time."""

    def __init__(self, zombie: bool, culprit: str = "") -> None:
        self.zombie, self.culprit, self.deaths, self.scored = zombie, culprit, 0, []
        self.hold, self.score_held, self.pid = _Method(self._hold), _Method(self._score_held), _Method(self._pid)

    async def _hold(self, lease_s):
        return 7, int(self.zombie)

    async def _score_held(self, token, items):
        if self.zombie or any(r == self.culprit for _, r in items):
            self.zombie, self.deaths = False, self.deaths + 1  # the process dies; Ray starts a fresh one
            raise RayActorError()
        self.scored += [r for _, r in items]
        return [Scored(1.0) for _ in items]

    async def _pid(self):
        return 1


@virtual_time
async def test_a_held_retry_is_not_blamed_for_a_timed_out_calls_crash():
    """The worker dies while the retry holds it, but a call that had timed out still ran there:
    the retry is tried again on the fresh process and scored, not scored 0 as the killer."""
    w = DyingWorker(zombie=True)
    got = await PoolRewards([w], timeout_s=1.0)._alone(0, PromptSpec(prompt_id=1, text="q"), "innocent")
    assert got == Scored(1.0) and w.scored == ["innocent"] and w.deaths == 1


@virtual_time
async def test_a_held_retry_that_kills_its_worker_is_the_culprit():
    w = DyingWorker(zombie=True, culprit="bad")
    got = await PoolRewards([w], timeout_s=1.0)._alone(0, PromptSpec(prompt_id=1, text="q"), "bad")
    assert got.reward == 0.0 and got.failure == "raised" and "died while scoring" in got.error
    assert w.deaths == 2  # once beside the timed-out call (not convicted), once alone (convicted)
    assert ALONE_TRIES >= 2
