"""``Tally``: the running totals a run reports when it ends (``RunEnded.summary``).

Invariant: everything here is derived from events already applied (tokens of ``SampleEnd``,
``batch/reward_mean`` of ``StepEnd``, ``ValidateEnd`` metrics), restored from a checkpoint on
resume, so a resumed run's summary covers the whole run, not only its last attempt.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from shunter.events import ValidateEnd


class Tally:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.started_at = clock()
        self.tokens = 0
        self.rewards: list[float] = []
        """Mean reward of each trained batch, in order."""
        self.validations: list[ValidateEnd] = []
        self.failed_groups = 0
        self.rewards_scored = 0
        """Samples the reward function scored."""
        self.reward_failures: Counter[str] = Counter()
        """Samples scored 0.0 because the reward failed, by ``RewardFailure``."""
        self.env_in_play = False
        """An environment is configured (``task.environment``) or a multi-turn sample ended:
        the summary has ``env/steps`` even when no step ever answered."""
        self.env_steps = 0
        """Environment steps that answered (multi-turn trajectories)."""
        self.env_failures: Counter[str] = Counter()
        """Trajectories ended by a failed environment call, by ``EnvFailure``."""
        self.workers_lost: Counter[str] = Counter()
        """Reward workers lost under a replica's calls (``RewardWorkerLost``), by ``WorkerLoss``."""

    def wall_s(self) -> float:
        return self.clock() - self.started_at

    def restore(
        self, *, tokens: int, rewards: list[float], validations: list[ValidateEnd], failed_groups: int, wall_s: float
    ) -> None:
        self.tokens, self.rewards, self.validations = tokens, list(rewards), list(validations)
        self.failed_groups = failed_groups
        self.started_at = self.clock() - wall_s

    def summary(self, *, steps: int, version: int, buffer: dict[str, int], extra: dict[str, float]) -> dict[str, float]:
        wall = self.wall_s()
        out: dict[str, float] = {
            "wall_s": wall,
            "steps": float(steps),
            "version": float(version),
            "rollout/tokens_per_s": self.tokens / wall if wall > 0 else 0.0,
        }
        out.update({f"buffer/{k}_groups": float(v) for k, v in buffer.items()})
        if self.rewards:
            k = max(1, min(5, len(self.rewards) // 4))
            out["batch/reward_first"] = sum(self.rewards[:k]) / k
            out["batch/reward_last"] = sum(self.rewards[-k:]) / k
        if self.validations:
            for key, val in self.validations[0].metrics.items():
                out[f"validate/{key}_first"] = val
            for key, val in self.validations[-1].metrics.items():
                out[f"validate/{key}_last"] = val
        for failure, n in self.reward_failures.items():
            out[f"reward/{failure}"] = float(n)
        for loss, n in self.workers_lost.items():
            out[f"reward/worker_{loss}"] = float(n)
        if self.env_in_play or self.env_steps or self.env_failures:
            out["env/steps"] = float(self.env_steps)
        for failure, n in self.env_failures.items():
            out[f"env/{failure}"] = float(n)
        out.update(extra)
        return out
