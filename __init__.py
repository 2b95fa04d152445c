"""shunter: asynchronous RL for language models.

Every component is an asyncio Ray actor; components talk only through typed msgspec
events (``shunter.events``); a pluggable policy object (``shunter.policies``) decides
when replicas switch between rollout and training.

The package, bottom to top (nothing imports upward; ``tests/unit/test_tree.py``):

- ``events``: the messages, the codec, the view, the vocabulary;
- ``policies``: switching policies, pure objects over events;
- ``engine``: everything a run does, in plain objects, one sub-package per role (its map);
- ``actors``: the Ray shells around the engine's objects, and the only code that imports vLLM;
- ``api``: the ``Engine`` facade users embed (its parts: ``api_link``, ``api_replicas``,
  ``api_steering``);
- ``progress``: a run with a terminal progress bar, and what it learned;
- ``bench``: throughput benchmarks, the simulated cluster, the bound;
- ``contract``: the policy contract (``shunter check-policy``);
- ``cli``: the ``shunter`` command.

The package root stays light: ``import shunter.events`` must not pull in torch, vLLM or
Ray, so the heavy facade (``Engine``) is imported lazily on first attribute access.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = [
    "Engine",
    "EngineConfig",
    "EngineError",
    "EngineSetupError",
    "IntentRefused",
    "LossInput",
    "NoBatchError",
    "ReplicaPool",
    "RestartError",
    "StepResult",
    "RunEndedError",
    "UserCodeError",
    "load_config",
    "__version__",
]
_ERRORS = (
    "EngineError",
    "EngineSetupError",
    "IntentRefused",
    "NoBatchError",
    "RestartError",
    "RunEndedError",
    "UserCodeError",
)


def __getattr__(name: str) -> object:
    if name == "Engine":
        from shunter.api import Engine

        return Engine
    if name in ("EngineConfig", "load_config"):
        from shunter.engine import config

        return getattr(config, name)
    if name in _ERRORS:
        from shunter.engine.io import errors

        return getattr(errors, name)
    if name == "ReplicaPool":
        from shunter.actors.pool import ReplicaPool

        return ReplicaPool
    if name == "LossInput":
        from shunter.engine.trainer.loss import LossInput

        return LossInput
    if name == "StepResult":
        from shunter.engine.data.environments import StepResult

        return StepResult
    raise AttributeError(f"module 'shunter' has no attribute {name!r}")
