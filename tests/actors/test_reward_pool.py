"""Reward workers (``actors.reward_workers``) on a real local Ray cluster, with rewards written as a
user writes them (a module loaded by import string from a folder of the user's): calls are
batched per loop turn, and the user's mistakes — a raise, junk, a hang, a reward that kills
its process, one that holds the interpreter in C code — cost only the calls they touch, each
scored 0.0 and said why, and the pool goes on scoring."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from shunter.actors import reward_workers as rewards
from shunter.actors.reward_workers import PoolRewards
from shunter.events import PromptSpec

pytestmark = [pytest.mark.actors, pytest.mark.timeout(240)]

USER_REWARD = textwrap.dedent(
    """
    import os, re, time

    def score(prompt, response, answer):
        if response == "raise":
            raise KeyError("no such field")
        if response == "junk":
            return "high"
        if response == "hang":
            time.sleep(600)
        if response == "exit":
            os._exit(3)
        if response == "slow":
            time.sleep(1.0)
        if response == "redos":  # catastrophic backtracking: C code that never lets go of the GIL
            re.match(r"(a+)+$", "a" * 64 + "b")
        return len(response) / 100
    """
)


def P(i: int) -> PromptSpec:
    return PromptSpec(prompt_id=i, text="q", answer="")


@pytest.fixture
def pool_of(ray_cluster, tmp_path):
    (tmp_path / "user_rewards.py").write_text(USER_REWARD)
    made = []

    async def make(n: int, timeout_s: float = 1.5, grace_s: float = 30.0) -> PoolRewards:
        cls = rewards.remote_class(0.01)
        ws = [
            cls.remote("user_rewards:score", "", timeout_s=timeout_s, threads=2, import_paths=[str(tmp_path)])
            for _ in range(n)
        ]
        made.extend(ws)
        await asyncio.gather(*(w.pid.remote() for w in ws))
        return PoolRewards(ws, timeout_s=timeout_s, grace_s=grace_s)

    yield make
    for w in made:
        ray_cluster.kill(w)


async def test_calls_of_one_loop_turn_go_as_batches_to_the_least_loaded_worker(pool_of):
    pool = await pool_of(2)
    got = await asyncio.gather(*(pool.score(P(i), "x" * (i % 50)) for i in range(150)))
    assert [s.reward for s in got] == [(i % 50) / 100 for i in range(150)]
    assert pool.batches == 3  # 150 calls in one turn: batches of 64, 64, 22 — not 150 Ray calls
    assert pool.outstanding == [0, 0]


async def test_a_raise_junk_and_a_hang_score_zero_with_their_cause_and_the_worker_goes_on(pool_of):
    pool = await pool_of(1, timeout_s=0.5)
    raised, junk, hung, fine = await asyncio.gather(
        pool.score(P(0), "raise"), pool.score(P(1), "junk"), pool.score(P(2), "hang"), pool.score(P(3), "ok")
    )
    assert raised.failure == "raised" and "KeyError" in raised.error and "no such field" in raised.error
    assert junk.failure == "returned" and "'high'" in junk.error
    assert hung.failure == "timeout" and "reward_timeout_s = 0.5" in hung.error
    assert fine.reward == 0.02 and not fine.failure
    assert (await pool.score(P(4), "again")).reward == 0.05


async def test_a_reward_that_kills_its_process_costs_only_its_own_call(pool_of):
    pool = await pool_of(1)
    got = await asyncio.gather(pool.score(P(0), "a"), pool.score(P(1), "exit"), pool.score(P(2), "bb"))
    assert got[0].reward == 0.01 and got[2].reward == 0.02  # tried again one by one after the death
    assert got[1].failure == "raised" and "reward worker 0 died" in got[1].error
    assert (await pool.score(P(3), "ccc")).reward == 0.03  # Ray started it again
    # two deaths (in the batch, then alone): each reported once, then taken
    assert [loss[:2] for loss in pool.losses()] == [(0, "died"), (0, "died")] and pool.losses() == []


async def test_a_reward_holding_the_interpreter_gets_its_worker_killed_and_started_again(pool_of):
    pool = await pool_of(1, timeout_s=0.5, grace_s=3.0)
    stuck = await pool.score(P(0), "redos")
    assert stuck.failure == "timeout" and "holding the interpreter" in stuck.error
    assert {loss[1] for loss in pool.losses()} == {"hung"}
    assert (await pool.score(P(1), "dddd")).reward == 0.04


async def test_a_call_in_flight_when_another_kills_the_worker_is_tried_again_and_scored(pool_of):
    """Was (outsider, 2026-12-03): a call alone in its batch that died with the worker (killed by
    another sample) scored 0 without being tried again."""
    pool = await pool_of(1)
    slow = asyncio.ensure_future(pool.score(P(0), "slow"))
    await asyncio.sleep(0)  # the slow call goes out in a batch of its own (the next loop turn's)
    await asyncio.sleep(0)
    killed = await pool.score(P(1), "exit")
    assert killed.failure == "raised" and "died" in killed.error
    assert (await slow).reward == 0.04 and pool.batches >= 4
    # the first death failed both batches: one loss, not one a batch; then the culprit alone
    assert [loss[:2] for loss in pool.losses()] == [(0, "died"), (0, "died")]


async def test_another_replicas_culprit_never_takes_a_retry_with_it(pool_of):
    """Was: calls of two replicas lost with one worker were each tried again alone per replica,
    so replica A's culprit, retried at the same moment as replica B's innocent calls, killed
    them again and they scored 0. Now a retry holds the worker across replicas."""
    a = await pool_of(1)
    b = PoolRewards(a.workers, timeout_s=a.timeout_s, grace_s=a.grace_s)  # a second replica, same worker
    innocent = [asyncio.ensure_future(b.score(P(i), "slow" + "x" * i)) for i in range(3)]
    await asyncio.sleep(0)  # B's batch goes out first: three 1 s calls on the worker's two threads
    await asyncio.sleep(0)
    culprit = await a.score(P(9), "exit")  # kills the worker under B's batch; both retry alone
    assert culprit.failure == "raised" and "died" in culprit.error
    assert [s.reward for s in await asyncio.gather(*innocent)] == [0.04, 0.05, 0.06]  # all scored, none lost
    assert (await b.score(P(10), "after")).reward == 0.05
