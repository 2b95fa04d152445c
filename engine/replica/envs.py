"""``Environments``: one replica's environment calls (multi-turn samples) — making, resetting,
stepping and closing each trajectory's environment. ``RolloutCore`` holds it; its sample runner
calls it from the turn loop, its validation reads which environment is set, and the core's
shutdown waits for the environments to close. It is given the replica's id, tokenizer and
stamper, the serving state (``serving.Serving``: the version an observation is appended on),
and the environment's class, name, call timeout and whether its calls run on a loop of their
own.

Invariants:

- every environment call goes through ``engine.data.environments.EnvCalls``: bounded by
  ``env_timeout_s``, never raising, never blocking the replica's loop;
- each environment made is closed exactly once, when its trajectory ends on this replica
  (finished, failed, or cut to move), even when the sample's task is cancelled; until every
  one is closed, ``_envs_closed`` is clear, and shutdown waits for it (bounded);
- a failed call is one ``EnvFailed`` naming the user's class and the cause, and the sample
  carries the failure (``env/<failure>`` in the step's metrics); the trajectory ends where it
  stands (a failed reset: it goes on as a single turn).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import msgspec

from shunter.engine.data import turns
from shunter.engine.data.environments import EnvCalls, EnvLoop
from shunter.engine.replica.backend import Tokenizer
from shunter.engine.replica.clock import now
from shunter.engine.replica.serving import Serving
from shunter.events import EnvFailed, Event, PromptSpec, Sample, Stamper
from shunter.events.vocab import EnvCall, EnvFailure


class Environments:
    def __init__(
        self,
        replica_id: str,
        tokenizer: Tokenizer,
        stamp: Stamper,
        serving: Serving,
        environment: Callable[[], object] | None,
        env_name: str,
        env_timeout_s: float,
        env_thread: bool,
    ) -> None:
        self.replica_id = replica_id
        self.tok = tokenizer
        self.stamp = stamp
        self.serving = serving
        self.environment, self.env_name = environment, env_name
        self._env_loop = EnvLoop() if env_thread and environment is not None else None
        self.env_timeout_s = env_timeout_s
        self._envs: set[EnvCalls] = set()  # the trajectories' environments here, until closed
        self._envs_closed = asyncio.Event()
        self._envs_closed.set()

    async def wait_closed(self) -> None:
        """Wait (bounded) until the cut trajectories have closed their environments: a step in
        flight, then the close, each within ``env_timeout_s``."""
        if not self._envs_closed.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._envs_closed.wait(), 2 * self.env_timeout_s + 1.0)

    def close_loop(self) -> None:
        if self._env_loop is not None:
            self._env_loop.close()

    async def env_for(
        self, s: Sample, prompt: PromptSpec, ev: list[Event], progressed: Callable[[], None]
    ) -> tuple[Sample, EnvCalls | None]:
        """The trajectory's environment on this replica, made and reset with its transcript so
        far (each call bounded, and progress between them); None (the trajectory goes on as a
        single turn) when it cannot be made or reset (then closed already, if it was made)."""
        assert self.environment is not None
        env = EnvCalls(self.environment, self.env_name, self.env_timeout_s, self._env_loop)
        self._envs.add(env)
        self._envs_closed.clear()
        call: EnvCall = "init"
        try:
            failure, error = await env.make()
            if failure is None:
                progressed()
                call = "reset"
                failure, error = await env.reset(prompt, self.tok.decode(s.token_ids))
        except asyncio.CancelledError:
            await self.close_env(env, s, [])
            raise
        if failure is None:
            return s, env
        s = self._env_fails(s, call, failure, error, ev)
        return await self.close_env(env, s, ev), None

    async def close_env(self, env: EnvCalls, s: Sample, ev: list[Event]) -> Sample:
        """The trajectory is done with its environment here: its ``close()``, once, contained like
        any call (a failure is an ``EnvFailed``; the sample is scored or moved all the same)."""
        try:
            failure, error = await env.close()
        finally:
            self._envs.discard(env)
            if not self._envs:
                self._envs_closed.set()
        return s if failure is None else self._env_fails(s, "close", failure, error, ev)

    def _env_fails(self, s: Sample, call: EnvCall, failure: EnvFailure, error: str, ev: list[Event]) -> Sample:
        """Report a failed environment call; the sample carries it (``env/<failure>`` per step)."""
        ev.append(self._env_failed(s, call, failure, error))
        return turns.mark_failure(s, failure)

    async def step(self, env: EnvCalls, s: Sample, ev: list[Event]) -> tuple[Sample, bool]:
        """Call the environment on the current turn's action and append its observation;
        returns the sample and whether generation goes on."""
        t0 = now()
        out, failure, error = await env.step(turns.action(s, self.tok.decode))
        if out is None:
            s = self._env_fails(s, "step", failure or "raised", error, ev)
            return msgspec.structs.replace(s, finish_reason="stop"), False
        ids = self.tok.encode(out.observation) if out.observation else []
        s = turns.add_observation(
            s, ids, env_s=now() - t0, reward=float(out.reward), metrics=out.metrics, version=self.serving.version
        )
        if out.done or s.remaining_tokens == 0:
            return msgspec.structs.replace(s, finish_reason="stop" if out.done else "length"), False
        return s, True

    def _env_failed(self, s: Sample, call: EnvCall, failure: EnvFailure, error: str) -> EnvFailed:
        return self.stamp(
            EnvFailed(
                replica_id=self.replica_id,
                sample_id=s.sample_id,
                group_id=s.group_id,
                failure=failure,
                call=call,
                turn=len(s.turns),
                error=error,
                user_code=self.env_name,
            )
        )
