"""``EngineConfig``: a run's whole configuration — its sections, and the figures derived from them.

Invariant: plain data (msgspec Structs, every field documented); a value that loads is checked
across fields once, by ``engine.config.checks.check``, when ``engine.config.load`` builds it.
"""

from __future__ import annotations

import msgspec

from shunter.engine.config.base import Section
from shunter.engine.config.rollout import RolloutConfig
from shunter.engine.config.run import DataConfig, ModelConfig, RunConfig, TaskConfig, ValidationConfig
from shunter.engine.config.trainer import TrainerConfig
from shunter.events.data import SamplingSpec


class EngineConfig(Section):
    run: RunConfig = msgspec.field(default_factory=RunConfig)
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    task: TaskConfig = msgspec.field(default_factory=TaskConfig)
    data: DataConfig = msgspec.field(default_factory=DataConfig)
    rollout: RolloutConfig = msgspec.field(default_factory=RolloutConfig)
    trainer: TrainerConfig = msgspec.field(default_factory=TrainerConfig)
    validation: ValidationConfig = msgspec.field(default_factory=ValidationConfig)

    @property
    def groups_per_mini_batch(self) -> int:
        return self.trainer.ppo_mini_batch_size // self.rollout.n_samples_per_prompt

    def sampling(self) -> SamplingSpec:
        """How every sample of the run is generated."""
        r = self.rollout
        return SamplingSpec(
            max_tokens=r.max_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            ignore_eos=r.ignore_eos,
            length_dist=r.length_dist,
        )

    def prompt_room(self) -> tuple[int, str]:
        """The prompt length in force, and the setting that sets it: ``data.max_prompt_tokens``,
        or (when 0) the context the response leaves, ``rollout.max_model_len - rollout.max_tokens``."""
        if self.data.max_prompt_tokens:
            return self.data.max_prompt_tokens, "data.max_prompt_tokens"
        return self.rollout.max_model_len - self.rollout.max_tokens, "rollout.max_model_len - rollout.max_tokens"
