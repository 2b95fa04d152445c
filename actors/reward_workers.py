"""Reward workers: the user's reward in processes of its own (Ray actors), shared by every
replica of a run (``task.reward_workers``).

Invariants:

- a worker scores with ``engine.data.rewards.ThreadRewards``: every call ends with a ``Scored``
  (raises, junk and calls that run longer than ``task.reward_timeout_s`` score 0.0 and say
  why), ``task.reward_threads`` calls at a time;
- the replica's side (:class:`PoolRewards`) sends the calls made in one turn of its loop as one
  batch (at most ``MAX_BATCH``) to the worker with the fewest calls outstanding: one Ray call a
  batch, not one a sample;
- a worker that dies (a reward that exits, segfaults or runs out of memory) or stops answering
  (a reward that holds the interpreter in C code, which no thread timeout can stop: a batch
  outstanding for ``GRACE_S`` makes the replica ping the worker, and a worker that does not
  answer within ``GRACE_S`` is killed) is started again by Ray, and every call it held is tried
  once more alone, once the worker is up: the sample that kills or hangs it again is the one
  that scores 0.0 (``raised`` or ``timeout``, naming the worker and the cause); the others are
  scored. The replica, its samples and the run go on;
- "alone" holds across replicas: a call tried again first *holds* the worker (``hold``: it
  waits until no other call runs there and lets none start), then runs (``score_held``). A
  worker that dies while a call holds it was killed by that call — unless a call that had timed
  out still ran in a thread there (``hold`` says how many), which may have been the killer; one
  that dies while the call waits to hold it was killed by another. In both cases the call tries
  again (``ALONE_TRIES`` times at most) — another call's culprit never takes a retry with it;
- every loss a replica's calls see is reported once (:meth:`PoolRewards.losses`, which the
  rollout core turns into ``RewardWorkerLost``), however many of its batches the worker held:
  a loss whose calls all score on retry is still seen in the run log and summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import secrets
from collections.abc import AsyncIterator, Callable
from typing import Any

from shunter.engine.data.rewards import Loss, Scored
from shunter.engine.io.errors import bounded, secs
from shunter.events import PromptSpec

MAX_BATCH = 64
GRACE_S = 30.0
"""A batch outstanding this long makes the replica ping its worker; a worker that does not
answer the ping within this long is taken for hung (its interpreter held) and killed."""
RESTART_S = 60.0
"""How long a worker Ray is starting again may take to come up (a new process that imports the
reward, a verifier's models, ...)."""
RESTART_POLL_S = 0.2
"""How often a worker Ray is starting again is asked whether it is up."""
MAX_LOSSES_HELD = 64
"""Worker losses kept between two takes (``PoolRewards.losses``); more are counted only."""
ALONE_TRIES = 3
"""How many times a call tried again alone tries to score holding its worker when the worker dies
while it waits (killed by another replica's call) or beside a call that had timed out and still
ran (which may have killed it)."""


class _Lost(Scored, frozen=True):
    """The failure of a call whose worker died or hung under it (tried again alone)."""


class WorkerGate:
    """A worker's calls: batches share it; a call tried again alone holds it by itself. Waiting
    holders go first (no batch starts while one waits), so a retry is never starved."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self.shared = 0
        self.held: int | None = None  # the holder's token
        self.waiting = 0
        # random, not from 1: a worker Ray started again must not hand out a token a caller still
        # holds from its previous process (that caller's score_held would take the new holder's hold)
        self._tokens = itertools.count(secrets.randbits(62))

    @contextlib.asynccontextmanager
    async def share(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: self.held is None and not self.waiting)
            self.shared += 1
        try:
            yield
        finally:
            async with self._cond:
                self.shared -= 1
                self._cond.notify_all()

    async def hold(self) -> int:
        async with self._cond:
            self.waiting += 1
            try:
                await self._cond.wait_for(lambda: self.held is None and not self.shared)
            finally:
                self.waiting -= 1
            self.held = token = next(self._tokens)
            return token

    async def release(self, token: int) -> None:
        async with self._cond:
            if self.held == token:
                self.held = None
                self._cond.notify_all()


class RewardWorker:
    """One worker process: the reward loaded as the replicas load it, its calls in threads."""

    def __init__(
        self, reward: str, task: str, *, timeout_s: float, threads: int, import_paths: list[str] | None = None
    ) -> None:
        from shunter.engine.data.rewards import ThreadRewards
        from shunter.engine.tasks.base import as_scorer, load_reward, load_task
        from shunter.policies.registry import use_import_paths

        use_import_paths(import_paths or [])
        fn = load_reward(reward) if reward else load_task(task).reward
        self.rewards = ThreadRewards(as_scorer(fn), timeout_s=timeout_s, threads=threads)
        self.gate = WorkerGate()
        self.leases: dict[int, asyncio.TimerHandle] = {}

    async def score(self, items: list[tuple[PromptSpec, str]]) -> list[Scored]:
        async with self.gate.share():
            return await self._score(items)

    async def _score(self, items: list[tuple[PromptSpec, str]]) -> list[Scored]:
        return list(await asyncio.gather(*(self.rewards.score(p, r) for p, r in items)))

    async def hold(self, lease_s: float = GRACE_S) -> tuple[int, int]:
        """Wait until no call runs here and hold the worker for one caller's ``score_held``;
        released by it, or after ``lease_s`` if it never comes (its replica died). Returns the
        token and how many threads still run calls that timed out (they may yet kill the worker:
        then the holder is not the culprit for sure)."""
        token = await self.gate.hold()

        def expire() -> None:
            self.leases.pop(token, None)
            asyncio.ensure_future(self.gate.release(token))

        self.leases[token] = asyncio.get_running_loop().call_later(lease_s, expire)
        return token, self.rewards.stuck

    async def score_held(self, token: int, items: list[tuple[PromptSpec, str]]) -> list[Scored]:
        """Score while holding the worker (a lease that ran out: as a batch)."""
        lease = self.leases.pop(token, None)
        if lease is None or self.gate.held != token:
            return await self.score(items)
        lease.cancel()
        try:
            return await self._score(items)
        finally:
            await self.gate.release(token)

    async def pid(self) -> int:
        return os.getpid()


def remote_class(num_cpus: float) -> Any:
    import ray

    return ray.remote(num_cpus=num_cpus, max_restarts=-1, max_task_retries=0)(RewardWorker)


class PoolRewards:
    """A replica's client of the run's reward workers (the ``engine.data.rewards.Rewards`` protocol)."""

    def __init__(
        self, workers: list[Any], *, timeout_s: float, grace_s: float = GRACE_S, restart_s: float = RESTART_S
    ) -> None:
        if not workers:
            raise ValueError("a reward pool needs at least one worker")
        self.workers, self.timeout_s, self.grace_s = list(workers), timeout_s, grace_s
        self.restart_s = restart_s
        self.outstanding = [0] * len(self.workers)
        self.batches = 0  # Ray calls made
        self._queue: list[tuple[PromptSpec, str, asyncio.Future[Scored]]] = []
        self._flush_due = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._restarting: set[int] = set()  # workers that died or were killed: asked only once up again
        self._retries: dict[int, asyncio.Lock] = {}  # worker -> held by a call tried again alone
        self._lost: list[Loss] = []  # since losses() last took them
        self._life = [0] * len(self.workers)  # each worker's incarnation as this replica saw it come up
        self._reported: set[tuple[int, int]] = set()  # (worker, incarnation) whose loss was recorded
        self.lost_unsaid = 0  # beyond MAX_LOSSES_HELD between two takes: counted, not kept

    def losses(self) -> list[Loss]:
        """The workers lost under this replica's calls since the last call (each once)."""
        out, self._lost = self._lost, []
        return out

    def _lose(self, w: int, life: int, loss: Loss, scored: _Lost) -> _Lost:
        """A call sent to incarnation ``life`` of worker ``w`` saw it lost: the first call to see
        that incarnation's loss records it — a batch whose failure comes after the worker was
        seen up again is the same death, not another; every call's batch is tried again alone."""
        if (w, life) not in self._reported:
            self._reported.add((w, life))
            if len(self._lost) < MAX_LOSSES_HELD:
                self._lost.append(loss)
            else:
                self.lost_unsaid += 1
        if life == self._life[w]:
            self._restarting.add(w)
        return scored

    async def score(self, prompt: PromptSpec, response: str) -> Scored:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Scored] = loop.create_future()
        self._queue.append((prompt, response, fut))
        if not self._flush_due:
            self._flush_due = True
            loop.call_soon(self._flush)
        return await fut

    def _flush(self) -> None:
        self._flush_due = False
        queue, self._queue = self._queue, []
        for i in range(0, len(queue), MAX_BATCH):
            self._start(queue[i : i + MAX_BATCH])

    def _start(self, batch: list[tuple[PromptSpec, str, asyncio.Future[Scored]]]) -> None:
        w = min(range(len(self.workers)), key=lambda i: (i in self._restarting, self.outstanding[i]))
        task = asyncio.get_running_loop().create_task(self._send(w, batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, w: int, batch: list[tuple[PromptSpec, str, asyncio.Future[Scored]]]) -> None:
        self.outstanding[w] += len(batch)
        try:
            got = await self._ask(w, [(p, r) for p, r, _ in batch])
            if isinstance(got, _Lost):  # one of these, or another replica's, killed it: each alone finds which
                got = [await self._alone(w, p, r) for p, r, _ in batch]
            out = got if isinstance(got, list) else [got] * len(batch)
            for (_, _, fut), scored in zip(batch, out, strict=True):
                if not fut.done():
                    fut.set_result(scored)
        finally:
            self.outstanding[w] -= len(batch)

    async def _alone(self, w: int, prompt: PromptSpec, response: str) -> Scored:
        """A call lost with its worker, tried again alone: it holds the worker (no other call
        of any replica runs there meanwhile), so if the worker dies now this call killed it;
        if it died while the call waited to hold it, the call waits again."""
        async with self._retries.setdefault(w, asyncio.Lock()):  # this replica's retries: one at a time
            items = [(prompt, response)]
            lost: Scored = Scored(0.0, "raised", "")
            for _ in range(ALONE_TRIES):
                held = await self._call(w, lambda h: h.hold.remote(self.grace_s))
                if isinstance(held, _Lost):  # it died while this call waited: another call killed it
                    lost = held
                    continue
                if isinstance(held, Scored):
                    return held
                if not (isinstance(held, tuple) and len(held) == 2):
                    return Scored(0.0, "raised", bounded(f"reward worker {w} answered a hold with {held!r}", 300))
                token, stuck = held
                got = self._checked(w, 1, await self._call(w, lambda h, t=token: h.score_held.remote(t, items)))
                if isinstance(got, _Lost) and stuck:  # a call that had timed out still ran there: it may be
                    lost = got  # the killer; the worker starts again without it, so try once more
                    continue
                return got[0] if isinstance(got, list) else got
            return Scored(
                0.0,
                lost.failure,
                f"{lost.error} (tried alone {ALONE_TRIES} times: each time the worker died while the call "
                "waited to hold it, or beside a call that had timed out and still ran)",
            )

    async def _ready(self, w: int) -> bool:
        """Wait for a worker Ray is starting again (calls fail while it restarts)."""
        from ray.exceptions import ActorUnavailableError, RayActorError

        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.restart_s
        while (left := deadline - loop.time()) > 0:
            try:
                await asyncio.wait_for(self.workers[w].pid.remote(), left)
                self._restarting.discard(w)
                self._life[w] += 1
                return True
            except (ActorUnavailableError, RayActorError):
                await asyncio.sleep(RESTART_POLL_S)
            except TimeoutError:
                break
        return False

    async def _ask(self, w: int, items: list[tuple[PromptSpec, str]]) -> list[Scored] | Scored:
        """One batch: the scores, or the one failure every item of it shares."""
        return self._checked(w, len(items), await self._call(w, lambda h: h.score.remote(items)))

    def _checked(self, w: int, n: int, got: Any) -> list[Scored] | Scored:
        if isinstance(got, Scored):
            return got
        if isinstance(got, list) and len(got) == n and all(isinstance(x, Scored) for x in got):
            return got
        return Scored(0.0, "raised", bounded(f"reward worker {w} answered {n} calls with {got!r}", 300))

    async def _call(self, w: int, remote: Callable[[Any], Any]) -> Any:
        """One Ray call to worker ``w`` (``remote(handle)`` makes it): its answer, or a ``Scored``
        failure — ``_Lost`` when the worker died or hung under it (it is then restarting)."""
        import ray
        from ray.exceptions import ActorUnavailableError, RayActorError

        h = self.workers[w]
        if w in self._restarting and not await self._ready(w):
            return Scored(0.0, "timeout", f"reward worker {w} did not come back within {secs(self.restart_s)} s")
        self.batches += 1
        life = self._life[w]
        fut = asyncio.ensure_future(_awaited(remote(h)))
        try:
            while not (await asyncio.wait({fut}, timeout=self.grace_s))[0]:
                if not await self._answers(h):  # hung (its interpreter held): Ray starts it again
                    try:
                        ray.kill(h, no_restart=False)
                    except Exception:  # noqa: BLE001 - already gone
                        pass
                    error = (
                        f"reward worker {w} stopped answering (a reward holding the interpreter?): no answer to "
                        f"a ping within {secs(self.grace_s)} s; killed, Ray starts it again"
                    )
                    return self._lose(w, life, (w, "hung", error), _Lost(0.0, "timeout", error))
            return fut.result()
        except (ActorUnavailableError, RayActorError) as e:
            error = bounded(f"reward worker {w} died while scoring: {e}", 500)
            return self._lose(w, life, (w, "died", error), _Lost(0.0, "raised", error))
        except Exception as e:  # noqa: BLE001 - anything else Ray raises: the calls score 0, said why
            return Scored(0.0, "raised", bounded(f"reward worker {w}: {type(e).__name__}: {e}", 500))
        finally:
            fut.cancel()

    async def _answers(self, h: Any) -> bool:
        """Whether a worker whose batch is slow still turns its loop (or is being restarted)."""
        from ray.exceptions import ActorUnavailableError, RayActorError

        try:
            await asyncio.wait_for(h.pid.remote(), self.grace_s)
            return True
        except TimeoutError:
            return False
        except (ActorUnavailableError, RayActorError):
            return True  # dead or restarting: its batch fails on its own

    def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()


async def _awaited(ref: Any) -> Any:
    return await ref
