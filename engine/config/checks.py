"""The rules across a config's fields and sections, checked once when a config is built.

Invariant: a config that passes :func:`check` is internally consistent — every cross-field rule of
the seed (``train_batch_size == parameter_sync_step * ppo_mini_batch_size``, whole prompt groups per
mini-batch, replicas the policy needs ...) holds, the task, reward, environment and dataset files it
names load, and its GPUs fit a placement plan; every failure raises :class:`ConfigError` naming
the field(s) and the values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shunter.engine.config.base import ConfigError
from shunter.engine.config.engine_config import EngineConfig
from shunter.engine.replica import lengths


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
    if t.world_size > 1:
        _check_ranks(cfg)
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
    _check_tensor_parallel(cfg)
    from shunter.engine.config.placement import plan  # GPU configs must fit a placement plan

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


def _check_ranks(cfg: EngineConfig) -> None:
    """A trainer of several ranks: what it cannot do yet, named with the fields to change."""
    t = cfg.trainer
    if t.weight_transport in ("cuda_ipc", "vllm_ipc", "nccl"):
        raise ConfigError(
            f"trainer.weight_transport = {t.weight_transport!r} with trainer.world_size = {t.world_size}: a sharded "
            "trainer publishes through 'safetensors' or 'gloo' (its weights are gathered bucket by bucket into host "
            "memory) — set one of those, or 'auto'"
        )


def _check_task(cfg: EngineConfig) -> None:
    """The task and the reward override load (the replicas load them again, in their processes),
    the dataset's files exist (their rows are checked when the run loads them) and its prompt
    limit leaves the response its room in the context."""
    from shunter.engine.data.files import DataError, expand
    from shunter.engine.tasks.base import load_reward, load_task

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
        from shunter.engine.data.environments import load_environment

        try:
            load_environment(cfg.task.environment)
        except ValueError as e:
            raise ConfigError(f"task.environment = {cfg.task.environment!r}: {e}") from None


def check_env_timeout(env_timeout_s: float, generate_timeout_s: float) -> None:
    """An environment call must end (``env/timeout``) before its replica's silence is taken as a
    hang: ``env_timeout_s`` below ``heartbeat.slack(generate_timeout_s)``."""
    from shunter.engine.replica.heartbeat import slack

    if env_timeout_s >= slack(generate_timeout_s):
        raise ConfigError(
            f"task.env_timeout_s ({env_timeout_s:g}) must be below 0.9 x rollout.generate_timeout_s "
            f"({generate_timeout_s:g} -> {slack(generate_timeout_s):g}): a hanging environment call would get its "
            "replica killed as hung instead of ending its trajectory (env/timeout)"
        )


def _check_tensor_parallel(cfg: EngineConfig) -> None:
    """``rollout.tensor_parallel_size`` fits what the replicas run on: each ``rollout.cpu_bind``
    entry names a core list per rank (or is 'nobind' / 'auto'), and the model (when its folder is
    there already; a model built at start is checked then, ``check_heads``) splits its heads."""
    r = cfg.rollout
    tp = r.tensor_parallel_size
    for i, entry in enumerate(r.cpu_bind):
        if entry in ("nobind", "auto"):
            continue
        if len(entry.split("|")) != tp:
            raise ConfigError(
                f"rollout.cpu_bind[{i}] = {entry!r} names {len(entry.split('|'))} core list(s) for a replica of "
                f"rollout.tensor_parallel_size = {tp}: give one per rank, '|'-separated (e.g. '0|1'), or 'nobind'"
            )
    if tp > 1 and (Path(cfg.model.path) / "config.json").is_file():
        check_heads(tp, cfg.model.path)


def check_heads(tensor_parallel_size: int, model_dir: str | Path) -> None:
    """vLLM shards attention by heads: ``rollout.tensor_parallel_size`` must divide the attention
    heads of the model in ``model_dir`` (its ``config.json``; a multimodal model's text config),
    and divide its KV heads or be a multiple of them (vLLM splits KV heads over the ranks, or
    replicates them when there are fewer heads than ranks)."""
    tp = tensor_parallel_size
    if tp == 1:
        return
    path = Path(model_dir) / "config.json"
    try:
        conf: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.path: cannot read {path} to check rollout.tensor_parallel_size: {e}") from None
    conf = conf.get("text_config") or conf
    heads = conf.get("num_attention_heads")
    kv = conf.get("num_key_value_heads", heads)
    if isinstance(heads, int) and heads % tp:
        raise ConfigError(
            f"rollout.tensor_parallel_size = {tp} does not divide the {heads} attention heads of model.path "
            f"({model_dir}): vLLM gives each rank an equal share of them"
        )
    if isinstance(kv, int) and kv % tp and tp % kv:
        raise ConfigError(
            f"rollout.tensor_parallel_size = {tp} and the {kv} KV heads of model.path ({model_dir}) divide neither "
            "the other: vLLM splits the KV heads over the ranks, or replicates them when there are fewer"
        )
