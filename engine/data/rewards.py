"""Scoring finished samples with the user's reward function, off the loop that generates.

Invariants:

- every call ends with a :class:`Scored`: a reward that raises (any ``BaseException`` but
  ``KeyboardInterrupt`` and ``SystemExit``), returns something other than a finite number (or
  verl's dict with one under ``"score"``; a coroutine too: rewards are synchronous), or runs
  longer than ``timeout_s`` scores ``0.0`` and says why (``failure``, ``error``). The sample is
  trained on with that score and the failure is reported (``RewardFailed``), never a crash, a
  dropped group or a stall;
- :class:`ThreadRewards` runs the calls in worker threads, so a slow reward never blocks the
  replica's event loop (vLLM's outputs, weight loads and aborts go on); at most ``threads``
  calls run at once, the others wait their turn. The timeout counts from a call's start, not
  its arrival: a slow but healthy reward under a burst of samples is slow, never zeroed;
- a call that timed out keeps its thread until the function returns (Python cannot stop a
  thread). When every thread of the pool is held so, a fresh pool takes over and the calls
  waiting in the old one move to it: a reward that hangs now and then costs its own call and
  a thread each time, never the others' — up to ``MAX_STUCK_THREADS`` held at once, after which
  calls wait for them (a reward that always hangs; the coordinator, seeing nothing but
  timeouts, ends the run).

:class:`InlineRewards` calls the function on the loop itself, without a timeout: for the
in-process fakes and the simulator, whose virtual clock must not race real threads.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import msgspec

from shunter.engine.io.errors import describe, secs, type_name
from shunter.engine.tasks.base import Scorer, score_of
from shunter.events import PromptSpec
from shunter.events.vocab import RewardFailure, WorkerLoss


class Scored(msgspec.Struct, frozen=True):
    """One sample's score, and why it is 0.0 when the reward failed."""

    reward: float
    failure: RewardFailure = ""
    error: str = ""


def score_one(scorer: Scorer, prompt: PromptSpec, response: str) -> Scored:
    """Call the reward once; its failures become a zero score with the cause. Whatever it raises
    is ``"raised"`` (``BaseException`` subclasses too, but ``KeyboardInterrupt`` and ``SystemExit``,
    which go on), so nothing escapes a worker thread."""
    try:
        result = scorer(prompt, response)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - the user's reward: reported, scored 0
        return Scored(0.0, "raised", f"raised {_said(e, lambda e: describe(e, limit=500))}")
    return _checked(result)


def _checked(result: object) -> Scored:
    """A reward's result as its score: a finite real number, or verl's dict with one under
    ``"score"``; anything else (an awaitable, a number too large for a float ...) is ``"returned"``."""
    if inspect.isawaitable(result):
        what = "a coroutine" if inspect.iscoroutine(result) else f"an awaitable ({type(result).__name__})"
        if inspect.iscoroutine(result):
            result.close()  # never awaited: closed here, without the interpreter's warning
        return Scored(0.0, "returned", f"returned {what}; reward functions must be synchronous")
    r = score_of(result)
    try:
        value = float(r) if isinstance(r, numbers.Real) and not isinstance(r, bool) else math.nan
    except Exception:  # noqa: BLE001 - 10**400 (OverflowError), or a user's Real whose __float__ fails
        value = math.nan
    if not math.isfinite(value):
        return Scored(
            0.0, "returned", f"returned {_said(r, type_name)}; expected a finite float (or a dict with 'score')"
        )
    return Scored(value)


def _said(value: Any, text: Callable[[Any], str]) -> str:
    """``text(value)``, or the value's type where its own ``str``/``repr`` fails (an int of more
    digits than Python prints, a user's class)."""
    try:
        return text(value)
    except Exception:  # noqa: BLE001 - the user's object: its type is enough to name it
        return type(value).__name__


Loss = tuple[int, WorkerLoss, str]
"""A reward worker lost under a replica's calls: its index, how, and the error seen."""


class Rewards(Protocol):
    """What a replica scores its finished samples with."""

    async def score(self, prompt: PromptSpec, response: str) -> Scored: ...
    def losses(self) -> list[Loss]:
        """The workers lost since the last call (each once); [] where no worker process runs."""
        ...

    def close(self) -> None: ...


class InlineRewards:
    """On the caller's loop, no timeout (fakes and the simulator: a virtual clock)."""

    def __init__(self, scorer: Scorer) -> None:
        self.scorer = scorer

    async def score(self, prompt: PromptSpec, response: str) -> Scored:
        return score_one(self.scorer, prompt, response)

    def losses(self) -> list[Loss]:
        return []

    def close(self) -> None:
        pass


MAX_STUCK_THREADS = 64
"""Threads held by calls that timed out, at most, before no fresh pool is started."""


class ThreadRewards:
    """In up to ``threads`` worker threads, each call bounded by ``timeout_s``."""

    def __init__(self, scorer: Scorer, *, timeout_s: float, threads: int = 4) -> None:
        self.scorer = scorer
        self.timeout_s = timeout_s
        self.threads = threads
        self._pool = self._new_pool()
        self._stuck: dict[ThreadPoolExecutor, int] = {}  # pool -> its calls that timed out, still running
        self.pools_started = 1

    def _new_pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="shunter-reward")

    @property
    def stuck(self) -> int:
        """Threads held by calls that timed out and have not returned."""
        return sum(self._stuck.values())

    async def score(self, prompt: PromptSpec, response: str) -> Scored:
        loop = asyncio.get_running_loop()
        began: list[float] = []  # when the call started in a thread (the loop's clock)

        def run() -> Scored:
            loop.call_soon_threadsafe(lambda: began.append(loop.time()) if not began else None)
            return score_one(self.scorer, prompt, response)

        while True:
            pool = self._pool
            cf = pool.submit(run)
            fut = asyncio.wrap_future(cf)
            while True:
                left = began[0] + self.timeout_s - loop.time() if began else self.timeout_s
                try:
                    return await asyncio.wait_for(asyncio.shield(fut), max(left, 0.0))
                except TimeoutError:
                    pass
                if began and loop.time() >= began[0] + self.timeout_s:
                    if not cf.cancel():  # running: its thread finishes it, unheard
                        self._held(pool, cf, loop)
                    return Scored(0.0, "timeout", f"took longer than task.reward_timeout_s = {secs(self.timeout_s)} s")
                if not began and pool is not self._pool and cf.cancel():
                    break  # its pool was replaced while it waited for a thread: wait in the new one
                if not began and self.stuck >= MAX_STUCK_THREADS and cf.cancel():
                    return Scored(
                        0.0,
                        "timeout",
                        f"no thread free to run it: {self.stuck} held by calls that outlived "
                        f"task.reward_timeout_s = {secs(self.timeout_s)} s and never returned",
                    )

    def _held(self, pool: ThreadPoolExecutor, cf: Future[Scored], loop: asyncio.AbstractEventLoop) -> None:
        """A call that timed out holds its thread; when all of a pool's are held, a fresh pool."""
        self._stuck[pool] = self._stuck.get(pool, 0) + 1
        cf.add_done_callback(lambda _: loop.call_soon_threadsafe(self._unstuck, pool))
        if pool is self._pool and self._stuck[pool] >= self.threads and self.stuck < MAX_STUCK_THREADS:
            self._pool = self._new_pool()  # the held pool finishes its calls and goes
            self.pools_started += 1
            pool.shutdown(wait=False, cancel_futures=False)  # its waiting calls move over (score)

    def _unstuck(self, pool: ThreadPoolExecutor) -> None:
        self._stuck[pool] -= 1
        if not self._stuck[pool]:
            del self._stuck[pool]

    def losses(self) -> list[Loss]:
        return []  # in this process: a reward that kills it takes the replica down (ReplicaDown)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
