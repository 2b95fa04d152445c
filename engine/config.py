"""Run configuration: msgspec Structs loaded from TOML, checked once at start.

Invariant: a config that loads is internally consistent — every cross-field rule of the
seed (``train_batch_size == parameter_sync_step * ppo_mini_batch_size``, whole prompt
groups per mini-batch, replicas the policy needs ...) is checked in :func:`check`, and
every failure raises :class:`ConfigError` naming the field(s) and the values. Unknown
keys are errors (a typo never silently falls back to a default).

Every field carries its documentation in ``msgspec.Meta(description=...)``;
``shunter config-schema`` prints them as JSON schema.

The sections live beside this module: ``engine/config_base.py`` (``ConfigError``, field types,
bounds), ``engine/config_run.py`` (run, model, task, data, validation),
``engine/config_rollout.py`` (rollout) and ``engine/config_trainer.py`` (trainer); every name
is re-exported here, so ``from shunter.engine.config import ...`` reaches all of them.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import msgspec

from shunter.engine import lengths
from shunter.engine.config_base import MAX_ENV_TIMEOUT_S as MAX_ENV_TIMEOUT_S  # re-exported
from shunter.engine.config_base import MAX_GENERATE_TIMEOUT_S as MAX_GENERATE_TIMEOUT_S  # re-exported
from shunter.engine.config_base import MAX_TURNS as MAX_TURNS  # re-exported
from shunter.engine.config_base import MIN_GENERATE_TIMEOUT_S as MIN_GENERATE_TIMEOUT_S  # re-exported
from shunter.engine.config_base import ConfigError as ConfigError  # re-exported
from shunter.engine.config_base import NonNegInt as NonNegInt  # re-exported
from shunter.engine.config_base import PosFloat as PosFloat  # re-exported
from shunter.engine.config_base import PosInt as PosInt  # re-exported
from shunter.engine.config_base import _d as _d  # re-exported
from shunter.engine.config_base import _Section as _Section  # re-exported
from shunter.engine.config_rollout import RolloutConfig as RolloutConfig  # re-exported
from shunter.engine.config_run import DataConfig as DataConfig  # re-exported
from shunter.engine.config_run import ModelConfig as ModelConfig  # re-exported
from shunter.engine.config_run import RunConfig as RunConfig  # re-exported
from shunter.engine.config_run import TaskConfig as TaskConfig  # re-exported
from shunter.engine.config_run import ValidationConfig as ValidationConfig  # re-exported
from shunter.engine.config_trainer import TrainerConfig as TrainerConfig  # re-exported
from shunter.events.data import SamplingSpec


class EngineConfig(_Section):
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


def from_dict(data: dict[str, Any], *, origin: str = "config", overrides: dict[str, Any] | None = None) -> EngineConfig:
    """Build and check a config from plain data (e.g. parsed TOML); a value refused that came
    from ``overrides`` (merged into ``data`` by the caller) is blamed on the override, not on
    ``origin``."""
    try:
        cfg = msgspec.convert(data, EngineConfig)
    except msgspec.ValidationError as e:
        where = _overridden(str(e), overrides or {})
        source = f"override {where} (over {origin})" if where else origin
        raise ConfigError(f"{source}: {e}{_value_of(str(e), data)}{_did_you_mean(str(e))}") from None
    try:
        check(cfg)
    except ConfigError as e:  # a rule across fields: say which of them the caller's overrides set
        given = [k for k in _leaves(overrides or {}) if k in str(e)]  # only fields the rule names
        if not given:
            raise
        raise ConfigError(f"{e} (overrides given over {origin}: {', '.join(given)})") from None
    return cfg


def _leaves(over: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys an overrides dict sets (``{"run": {"total_steps": 5}}`` -> ``run.total_steps``)."""
    out = []
    for k, v in over.items():
        out += _leaves(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [f"{prefix}{k}"]
    return out


def _overridden(error: str, overrides: dict[str, Any]) -> str:
    """The dotted key msgspec's error is about (``- at `$.run.total_steps```, or an unknown
    field's own name) where ``overrides`` gave it; else ""."""
    import re

    m = re.search(r"- at `\$((?:\.\w+)*)`", error)
    keys = m.group(1).split(".")[1:] if m else []
    unknown = re.search(r"unknown field `([^`]+)`", error)
    keys += [unknown.group(1)] if unknown else []
    return ".".join(keys) if _lookup(overrides, keys) else ""


def _lookup(data: dict[str, Any], keys: list[str]) -> tuple[Any] | tuple[()]:
    """``(value,)`` at the nested ``keys`` of ``data``; ``()`` where a key is missing."""
    value: Any = data
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return ()
        value = value[key]
    return (value,)


def _value_of(error: str, data: dict[str, Any]) -> str:
    """For msgspec's "Expected `int` <= 256 - at `$.task.max_turns`": the value given, `` (got 1000000)``."""
    import re

    m = re.search(r"^Expected [^,]*? - at `\$((?:\.\w+)+)`$", error)
    found = _lookup(data, m.group(1).split(".")[1:]) if m else ()
    return f" (got {found[0]!r:.80})" if found else ""


def _did_you_mean(error: str) -> str:
    """For msgspec's "Object contains unknown field `x` - at `$.run`": the closest field names."""
    import difflib
    import re

    m = re.search(r"unknown field `([^`]+)`(?: - at `\$(?:\.(\w+))?`)?", error)
    if not m:
        return ""
    section = {f.name: f.type for f in msgspec.structs.fields(EngineConfig)}.get(m.group(2) or "")
    names = (
        [f.name for f in msgspec.structs.fields(section)]
        if section
        else [f.name for f in msgspec.structs.fields(EngineConfig)]
    )
    if "." in m.group(1):  # {"run.total_steps": 5}: a dotted key where a nested table is meant
        section, _, key = m.group(1).partition(".")
        return f" (nest it: {{{section!r}: {{{key!r}: ...}}}}, as a TOML table [{section}] does)"
    close = difflib.get_close_matches(m.group(1), names, n=3)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> EngineConfig:
    """Load a TOML file; ``overrides`` (nested dict) is merged over it before checking.

    Import strings in the config (``run.policy``, ``task.name``, ``task.reward``,
    ``trainer.loss_fn``) are resolved from the config file's folder and the working directory
    first (both absolute, appended to ``run.import_paths``), then from installed packages."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from None
    data = merge(data, overrides or {})
    run = data.setdefault("run", {}) if isinstance(data.get("run", {}), dict) else {}
    paths = list(run.get("import_paths", []))
    for folder in (p.resolve().parent, Path.cwd().resolve()):
        if str(folder) not in paths:
            paths.append(str(folder))
    run["import_paths"] = paths
    files = data.get("data")
    if isinstance(files, dict):  # dataset paths and globs from the config's folder
        for key in ("train_files", "val_files"):
            if isinstance(files.get(key), list):
                files[key] = [
                    f if not isinstance(f, str) or Path(f).expanduser().is_absolute() else str(p.resolve().parent / f)
                    for f in files[key]
                ]
    ro = data.get("rollout")
    if isinstance(ro, dict) and isinstance(ro.get("length_dist"), str):
        ro["length_dist"] = lengths.resolved(ro["length_dist"], p.resolve().parent)
    return from_dict(data, origin=str(p), overrides=overrides)


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def check(cfg: EngineConfig) -> None:
    """The seed's consistency checks; raise ConfigError naming fields and values."""
    t, r = cfg.trainer, cfg.rollout
    if t.mis != "none" and not t.mis_low < 1.0 < t.mis_high:
        raise ConfigError(
            f"trainer.mis_low = {t.mis_low:g} and trainer.mis_high = {t.mis_high:g} must enclose 1 "
            "(a ratio of 1 is on-policy and must be kept)"
        )
    if t.objective == "decoupled" and t.loss_fn:
        raise ConfigError("trainer.objective = 'decoupled' is the built-in loss; trainer.loss_fn replaces it — set one")
    if t.train_batch_size != t.parameter_sync_step * t.ppo_mini_batch_size:
        raise ConfigError(
            f"trainer.train_batch_size ({t.train_batch_size}) must equal trainer.parameter_sync_step "
            f"({t.parameter_sync_step}) * trainer.ppo_mini_batch_size ({t.ppo_mini_batch_size}) "
            f"= {t.parameter_sync_step * t.ppo_mini_batch_size}"
        )
    if t.ppo_mini_batch_size % r.n_samples_per_prompt:
        raise ConfigError(
            f"trainer.ppo_mini_batch_size ({t.ppo_mini_batch_size}) must be a multiple of "
            f"rollout.n_samples_per_prompt ({r.n_samples_per_prompt}): a mini-batch holds whole groups"
        )
    if r.admit_staleness > r.max_staleness:
        raise ConfigError(
            f"rollout.admit_staleness ({r.admit_staleness}) is above rollout.max_staleness ({r.max_staleness}): the "
            "gate would start groups that could only be trained past the bound — lower it, or raise max_staleness"
        )
    if r.standalone_replicas + r.hybrid_replicas == 0:
        raise ConfigError("rollout.standalone_replicas + rollout.hybrid_replicas is 0: no replica to generate with")
    if r.max_tokens >= r.max_model_len:
        raise ConfigError(
            f"rollout.max_tokens ({r.max_tokens}) must be below rollout.max_model_len ({r.max_model_len}): "
            "the context must hold the prompt and the whole response"
        )
    try:
        lengths.check(r.length_dist)
    except ValueError as e:
        raise ConfigError(f"rollout.length_dist: {e}") from None
    if r.max_in_flight_per_replica < r.n_samples_per_prompt:
        raise ConfigError(
            f"rollout.max_in_flight_per_replica ({r.max_in_flight_per_replica}) is below "
            f"rollout.n_samples_per_prompt ({r.n_samples_per_prompt}): no group would ever fit"
        )
    if cfg.task.environment:
        check_env_timeout(cfg.task.env_timeout_s, r.generate_timeout_s)
    for key, res in (("trainer.resources", t.resources), ("rollout.resources", r.resources)):
        for name, amount in res.items():
            if name in ("CPU", "GPU", "memory", "object_store_memory") or amount <= 0:
                raise ConfigError(
                    f"{key}: {name} = {amount:g} — custom resources are names a node offers ('ray start "
                    "--resources') with amounts above 0; CPUs and GPUs are num_cpus / num_gpus"
                )
    if r.cpu_bind and len(r.cpu_bind) != r.standalone_replicas + r.hybrid_replicas:
        raise ConfigError(
            f"rollout.cpu_bind has {len(r.cpu_bind)} entries for {r.standalone_replicas + r.hybrid_replicas} replicas"
        )
    from shunter.engine.placement import plan  # GPU configs must fit a placement plan

    plan(cfg)
    from shunter.policies import make_policy, policy_class  # policies know what replicas they need
    from shunter.policies.registry import import_paths

    with import_paths(cfg.run.import_paths):
        try:
            cls = policy_class(cfg.run.policy)
            cls.check_setup(standalone=r.standalone_replicas, hybrid=r.hybrid_replicas)
            make_policy(cfg.run.policy, cfg.run.policy_options)  # its options, as its constructor takes them
        except ValueError as e:
            raise ConfigError(f"run.policy = {cfg.run.policy!r}: {e}") from None
        _check_task(cfg)


def _check_task(cfg: EngineConfig) -> None:
    """The task and the reward override load (the replicas load them again, in their processes),
    the dataset's files exist (their rows are checked when the run loads them) and its prompt
    limit leaves the response its room in the context."""
    from shunter.engine.datasets import DataError, expand
    from shunter.engine.tasks import load_reward, load_task

    try:
        load_task(cfg.task.name)
    except ValueError as e:
        raise ConfigError(f"task.name = {cfg.task.name!r}: {e}") from None
    for key in ("train_files", "val_files"):
        try:
            expand(getattr(cfg.data, key), what=f"data.{key}")
        except DataError as e:
            raise ConfigError(str(e)) from None
    if cfg.data.val_files and not cfg.data.train_files:
        raise ConfigError("data.val_files is set without data.train_files: give the training files too")
    room = cfg.rollout.max_model_len - cfg.rollout.max_tokens
    if cfg.data.max_prompt_tokens > room:
        raise ConfigError(
            f"data.max_prompt_tokens ({cfg.data.max_prompt_tokens}) is above rollout.max_model_len "
            f"({cfg.rollout.max_model_len}) - rollout.max_tokens ({cfg.rollout.max_tokens}) = {room}: "
            "a prompt that long leaves the response no room in the context; lower it (0 takes the room)"
        )
    if cfg.task.reward:
        try:
            load_reward(cfg.task.reward)
        except ValueError as e:
            raise ConfigError(f"task.reward = {cfg.task.reward!r}: {e}") from None
    if cfg.task.environment:
        from shunter.engine.environments import load_environment

        try:
            load_environment(cfg.task.environment)
        except ValueError as e:
            raise ConfigError(f"task.environment = {cfg.task.environment!r}: {e}") from None


def schema() -> dict[str, Any]:
    return msgspec.json.schema(EngineConfig)


def check_env_timeout(env_timeout_s: float, generate_timeout_s: float) -> None:
    """An environment call must end (``env/timeout``) before its replica's silence is taken as a
    hang: ``env_timeout_s`` below ``heartbeat.slack(generate_timeout_s)``."""
    from shunter.engine.heartbeat import slack

    if env_timeout_s >= slack(generate_timeout_s):
        raise ConfigError(
            f"task.env_timeout_s ({env_timeout_s:g}) must be below 0.9 x rollout.generate_timeout_s "
            f"({generate_timeout_s:g} -> {slack(generate_timeout_s):g}): a hanging environment call would get its "
            "replica killed as hung instead of ending its trajectory (env/timeout)"
        )
