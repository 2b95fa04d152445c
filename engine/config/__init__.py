"""A run's configuration: plain data loaded from TOML and checked once, before anything starts.

Modules (each imports only those above it, the bottom layers and, lazily, the parts a check
needs to load: ``engine.data``, ``engine.tasks``, ``shunter.policies``):

- ``base``: ``ConfigError``, the constrained field types, bounds, ``doc`` and ``Section``;
- ``run``, ``rollout``, ``trainer``: the sections (``[run]``, ``[model]``, ``[task]``, ``[data]``,
  ``[validation]``; ``[rollout]``; ``[trainer]``), one documented field per line;
- ``engine_config``: ``EngineConfig``, the sections together and the figures derived from them;
- ``checks``: every rule across fields, the task / reward / files / environment it names, the
  policy's setup, the placement plan;
- ``load``: TOML or a dict -> a checked ``EngineConfig`` (``load_config``, ``from_dict``), the
  error that names the field and the value; ``schema``;
- ``placement``: where each actor of a run goes (the plan of its placement groups).

The names below are the public API (``from shunter.engine.config import load_config``);
the engine's own modules import each from the module that defines it.
"""

from shunter.engine.config.base import ConfigError
from shunter.engine.config.checks import check, check_env_timeout
from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.config.load import from_dict, load_config, merge, schema
from shunter.engine.config.rollout import RolloutConfig
from shunter.engine.config.run import DataConfig, ModelConfig, RunConfig, TaskConfig, ValidationConfig
from shunter.engine.config.trainer import TrainerConfig

__all__ = [
    "ConfigError",
    "DataConfig",
    "EngineConfig",
    "ModelConfig",
    "RolloutConfig",
    "RunConfig",
    "TaskConfig",
    "TrainerConfig",
    "ValidationConfig",
    "check",
    "check_env_timeout",
    "from_dict",
    "load_config",
    "merge",
    "schema",
]
