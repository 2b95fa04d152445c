"""Reward calls as users write them go wrong: each ends within its timeout with a score of 0 and
the cause, off the loop that generates. Real threads, no virtual clock; the slow rewards here
block on an event the test holds (never a sleep), so what is timed is only the timeout itself."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest

from shunter.engine.data.rewards import InlineRewards, Scored, ThreadRewards, score_one
from shunter.engine.tasks import as_scorer
from shunter.events import PromptSpec

P = PromptSpec(prompt_id=0, text="21>", answer="12", data_source="sort_digits")


@pytest.mark.parametrize(
    "fn, failure, error",
    [
        (lambda p, r, a: 1.0 / 0, "raised", "raised ZeroDivisionError"),
        (lambda p, r, a: "1.0", "returned", "returned str '1.0'; expected a finite float"),
        (lambda p, r, a: math.nan, "returned", "returned float"),
        (lambda p, r, a: True, "returned", "returned bool"),
        (lambda p, r, a: None, "returned", "returned None;"),
        (lambda p, r, a: {"acc": 1.0}, "returned", "returned dict"),
    ],
)
def test_a_reward_that_raises_or_returns_junk_scores_0_with_the_cause(fn, failure, error):
    scored = score_one(as_scorer(fn), P, "12")
    assert scored.reward == 0.0 and scored.failure == failure and error in scored.error


class Escapes(BaseException):
    """A user's exception outside ``Exception``."""


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


def _raise(e: BaseException) -> float:
    raise e


@pytest.mark.parametrize(
    "fn, failure, error",
    [
        (lambda p, r, a: 10**400, "returned", "returned int 1000"),  # float() overflows
        (lambda p, r, a: {"score": -(10**400)}, "returned", "returned int -1000"),
        (lambda p, r, a: 10**5000, "returned", "returned int;"),  # too many digits to print
        (lambda p, r, a: _raise(Escapes("out")), "raised", "raised Escapes: out"),
        (lambda p, r, a: _raise(GeneratorExit()), "raised", "raised GeneratorExit"),
        (lambda p, r, a: _raise(Unprintable()), "raised", "raised Unprintable"),
    ],
)
def test_a_reward_that_overflows_or_raises_outside_exception_scores_0_with_the_cause(fn, failure, error):
    scored = score_one(as_scorer(fn), P, "12")
    assert scored.reward == 0.0 and scored.failure == failure and error in scored.error


def test_a_keyboard_interrupt_or_exit_in_a_reward_goes_on():
    for e in (KeyboardInterrupt(), SystemExit(3)):
        with pytest.raises(type(e)):
            score_one(as_scorer(lambda p, r, a, e=e: _raise(e)), P, "12")


def test_a_reward_that_returns_a_coroutine_is_scored_a_failure_and_the_coroutine_closed():
    async def later() -> float:
        return 1.0

    coro = later()
    scored = score_one(as_scorer(lambda p, r, a: coro), P, "12")
    assert scored == Scored(0.0, "returned", "returned a coroutine; reward functions must be synchronous")
    assert coro.cr_frame is None  # closed: no "never awaited" warning later
    scored = score_one(lambda prompt, response: asyncio.sleep(0), P, "12")  # a scorer made without as_scorer
    assert scored.failure == "returned" and "coroutine" in scored.error


async def test_a_reward_raising_a_base_exception_in_a_thread_is_scored_not_raised():
    rewards = ThreadRewards(as_scorer(lambda p, r, a: _raise(Escapes("out"))), timeout_s=30, threads=1)
    try:
        async with asyncio.timeout(30):
            scored = await rewards.score(P, "12")
            assert scored.failure == "raised" and "Escapes: out" in scored.error
            assert await rewards.score(P, "12") == scored  # the worker thread goes on
    finally:
        rewards.close()


def test_a_float_or_verls_dict_is_the_score():
    assert score_one(as_scorer(lambda p, r, a: 1), P, "12") == Scored(1.0)
    verl = as_scorer(lambda data_source, solution_str, ground_truth, extra_info: {"score": 0.5, "acc": 0})
    assert score_one(verl, P, "12") == Scored(0.5)


async def test_a_reward_that_hangs_times_out_and_the_loop_goes_on():
    release = threading.Event()
    entered = threading.Event()

    def hangs(prompt, response, answer):
        entered.set()
        release.wait()
        return 1.0

    rewards = ThreadRewards(as_scorer(hangs), timeout_s=0.2, threads=2)
    try:
        ticks = 0

        async def tick():  # the loop stays free while the reward hangs in its thread
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        ticker = asyncio.create_task(tick())
        async with asyncio.timeout(30):
            scored = await rewards.score(P, "12")
        ticker.cancel()
        assert entered.is_set()
        assert scored.failure == "timeout" and scored.reward == 0.0 and "task.reward_timeout_s = 0.2 s" in scored.error
        assert ticks > 10
    finally:
        release.set()
        rewards.close()


async def test_a_call_waiting_behind_a_hung_one_runs_on_a_fresh_pool_and_scores():
    release = threading.Event()
    calls = []

    def sometimes_hangs(prompt, response, answer):
        calls.append(response)
        if response == "hang":
            release.wait()
        return 1.0

    rewards = ThreadRewards(as_scorer(sometimes_hangs), timeout_s=0.2, threads=1)
    try:
        async with asyncio.timeout(30):
            first, queued = await asyncio.gather(rewards.score(P, "hang"), rewards.score(P, "12"))
        assert first.failure == "timeout"
        assert queued == Scored(1.0) and calls == ["hang", "12"]  # its wait was not its run time
        release.set()
        async with asyncio.timeout(30):
            assert await rewards.score(P, "12") == Scored(1.0)
    finally:
        release.set()
        rewards.close()


async def test_inline_rewards_score_on_the_loop():
    assert await InlineRewards(as_scorer(lambda p, r, a: 0.25)).score(P, "12") == Scored(0.25)


async def test_a_reward_that_hangs_now_and_then_costs_a_thread_each_time_not_the_scoring():
    release = threading.Event()

    def hangs_on_h(prompt, response, answer):
        if response == "h":
            release.wait()
        return 1.0

    rewards = ThreadRewards(as_scorer(hangs_on_h), timeout_s=0.2, threads=2)
    try:
        async with asyncio.timeout(60):
            for _ in range(3):  # each round: both threads hang, then a fresh pool scores
                hung = await asyncio.gather(rewards.score(P, "h"), rewards.score(P, "h"))
                assert [s.failure for s in hung] == ["timeout", "timeout"]
                assert await rewards.score(P, "12") == Scored(1.0)
        assert rewards.stuck == 6 and rewards.pools_started == 4
    finally:
        release.set()
        rewards.close()


async def test_a_call_queued_behind_a_hung_one_moves_to_the_fresh_pool():
    release, entered = threading.Event(), threading.Event()

    def hangs_on_h(prompt, response, answer):
        if response == "h":
            entered.set()
            release.wait()
        return 1.0

    rewards = ThreadRewards(as_scorer(hangs_on_h), timeout_s=0.3, threads=1)
    try:
        async with asyncio.timeout(30):
            hung = asyncio.ensure_future(rewards.score(P, "h"))
            await asyncio.to_thread(entered.wait, 10)  # the hung call holds the thread before the next is queued
            queued = asyncio.ensure_future(rewards.score(P, "12"))
            assert (await hung).failure == "timeout"
            assert await queued == Scored(1.0)  # not CancelledError, nor a timeout, when the pool is replaced
    finally:
        release.set()
        rewards.close()


async def test_a_slow_healthy_reward_under_a_burst_is_slow_not_zeroed():
    """Was (outsider, 2026-12-03): the timeout counted a call's wait for a thread, so 250 samples
    of a 0.1 s reward behind 4 threads with a 3 s limit scored 0 by the hundred."""

    def slow(prompt, response, answer):
        time.sleep(0.05)
        return 1.0

    rewards = ThreadRewards(as_scorer(slow), timeout_s=0.5, threads=4)
    try:
        async with asyncio.timeout(60):
            got = await asyncio.gather(*(rewards.score(P, str(i)) for i in range(80)))  # ~1 s of work on 4 threads
        assert all(s == Scored(1.0) for s in got)
    finally:
        rewards.close()


async def test_a_reward_that_always_hangs_times_out_every_call_once_no_thread_is_left(monkeypatch):
    import shunter.engine.data.rewards as mod

    monkeypatch.setattr(mod, "MAX_STUCK_THREADS", 2)
    release = threading.Event()
    rewards = ThreadRewards(as_scorer(lambda p, r, a: release.wait() and 1.0), timeout_s=0.2, threads=1)
    try:
        async with asyncio.timeout(60):
            got = await asyncio.gather(*(rewards.score(P, str(i)) for i in range(5)))
        assert all(s.failure == "timeout" for s in got) and rewards.stuck == 2
    finally:
        release.set()
        rewards.close()
