"""``Validation``: one replica's validation — greedy answers to held-out prompts on one
version, scored by the task's reward, through the multi-turn sample loop itself when an
environment is set. ``RolloutCore`` holds it and hands it ``RunValidation`` orders; it is
given the replica's id, backend, tokenizer, rewards (and the reward's name) and stamper, the
serving state (``serving.Serving``: the version, and the lock it holds), the running requests'
table (``running.RunningRequests``: the request numbers it draws), the sample runner
(``samples.SampleRunner``: a prompt's token ids, a multi-turn trajectory) and the environments
(``envs.Environments``: which one is set, and its name).

Invariants: a validation holds ``serving.stable``, so no weight load lands while it runs and
its ``ValidateEnd.version`` is the version every answer came from; a held-out prompt that
cannot be tokenized, a reward or an environment that fails scores 0 (or as the trajectory
stood) and is counted, and ``ValidateEnd.errors`` has one line per kind naming the user's code
and the first cause (the validation itself succeeded: no ``CommandFailed``).
"""

from __future__ import annotations

import asyncio

from shunter.engine.data.rewards import Rewards
from shunter.engine.io.errors import describe
from shunter.engine.replica.backend import Backend, GenParams, Tokenizer
from shunter.engine.replica.clock import now
from shunter.engine.replica.envs import Environments
from shunter.engine.replica.running import RunningRequests
from shunter.engine.replica.samples import SampleRunner
from shunter.engine.replica.serving import Serving
from shunter.events import (
    EnvFailed,
    Event,
    PromptSpec,
    RewardFailed,
    RunValidation,
    Sample,
    SampleEnd,
    SamplingSpec,
    Stamper,
    ValidateBegin,
    ValidateEnd,
)


class Validation:
    def __init__(
        self,
        replica_id: str,
        backend: Backend,
        tokenizer: Tokenizer,
        rewards: Rewards,
        reward_name: str,
        stamp: Stamper,
        serving: Serving,
        requests: RunningRequests,
        samples: SampleRunner,
        envs: Environments,
    ) -> None:
        self.replica_id = replica_id
        self.backend = backend
        self.tok = tokenizer
        self.rewards = rewards
        self.reward_name = reward_name
        self.stamp = stamp
        self.serving = serving
        self.requests = requests
        self.samples = samples
        self.envs = envs

    async def validate(self, cmd: RunValidation, max_tokens: int) -> list[Event]:
        t0 = now()
        begin = self.stamp(
            ValidateBegin(version=self.serving.version, prompts=len(cmd.prompts), replica_ids=[self.replica_id])
        )
        params = GenParams(max_tokens=max_tokens, temperature=0.0, stop_token_ids=(self.tok.eos_token_id,))

        errors: list[str] = []
        env_errors: list[str] = []

        async def one(p: PromptSpec) -> float:
            if self.envs.environment is not None:
                return await self._validate_turns(p, max_tokens, errors, env_errors)
            rid = f"{self.replica_id}-val-{next(self.requests.ids)}"
            try:
                ids = self.samples.prompt_ids(p)
            except Exception as e:  # noqa: BLE001 - counted and reported below
                errors.append(f"prompt {p.prompt_id} cannot be tokenized: {describe(e, limit=300)}")
                return 0.0
            res = await self.backend.generate(rid, ids, params)
            text = self.tok.decode([t for t in res.token_ids if t != self.tok.eos_token_id])
            scored = await self.rewards.score(p, text)
            if scored.failure:
                errors.append(scored.error)
            return scored.reward

        async with self.serving.stable:
            version = self.serving.version
            rewards = await asyncio.gather(*(one(p) for p in cmd.prompts))
        n = max(1, len(rewards))
        metrics = {"reward_mean": sum(rewards) / n, "exact": sum(r >= 1.0 for r in rewards) / n}
        if errors:
            metrics["reward_errors"] = float(len(errors))
        if env_errors:
            metrics["env_errors"] = float(len(env_errors))
        failures = [
            f"{what} failed on {len(failed)} held-out prompts ({scored}), first: {failed[0]}"
            for failed, what, scored in (
                (errors, f"reward function {self.reward_name}", "scored 0"),
                (env_errors, f"environment {self.envs.env_name}", "scored as they stood"),
            )
            if failed
        ]
        end = ValidateEnd(version=version, duration_s=now() - t0, metrics=metrics, errors=failures)
        return [begin, self.stamp(end)]

    async def _validate_turns(self, p: PromptSpec, max_tokens: int, errors: list[str], env_errors: list[str]) -> float:
        """A held-out prompt's greedy multi-turn trajectory, through the sample loop itself."""
        try:
            ids = self.samples.prompt_ids(p)
        except Exception as e:  # noqa: BLE001 - counted and reported by validate
            errors.append(f"prompt {p.prompt_id} cannot be tokenized: {describe(e, limit=300)}")
            return 0.0
        s = Sample(
            sample_id=f"val-{next(self.requests.ids)}",
            group_id=-1,
            prompt_id=p.prompt_id,
            prompt_token_ids=ids,
            max_tokens=max_tokens,
        )
        events = await self.samples.run(s, p, SamplingSpec(max_tokens=max_tokens, temperature=0.0))
        errors += [e.error for e in events if isinstance(e, RewardFailed)]
        env_errors += [e.error for e in events if isinstance(e, EnvFailed)]
        return next((e.sample.reward for e in events if isinstance(e, SampleEnd)), 0.0)
