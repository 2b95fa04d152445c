"""Run configuration: msgspec Structs loaded from TOML, checked once at start.

Invariant: a config that loads is internally consistent — every cross-field rule of the
seed (``train_batch_size == parameter_sync_step * ppo_mini_batch_size``, whole prompt
groups per mini-batch, replicas the policy needs ...) is checked in :func:`check`, and
every failure raises :class:`ConfigError` naming the field(s) and the values. Unknown
keys are errors (a typo never silently falls back to a default).

Every field carries its documentation in ``msgspec.Meta(description=...)``;
``shunter config-schema`` prints them as JSON schema.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from shunter.engine import lengths
from shunter.events.data import SamplingSpec
from shunter.events.vocab import WeightUpdate


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the field and the values."""


PosInt = Annotated[int, Meta(ge=1)]
NonNegInt = Annotated[int, Meta(ge=0)]
PosFloat = Annotated[float, Meta(gt=0)]
MIN_GENERATE_TIMEOUT_S = 1.0
"""``rollout.generate_timeout_s``'s floor: a generation stream beats every tenth of it
(``engine.heartbeat``), each beat one Ray call (about 1.3 ms on 2 cores), so at most 10 beats a
second a stream — never a flood of beats that starves the loop it reports from."""
MAX_GENERATE_TIMEOUT_S = 7 * 86400.0
"""...and its ceiling (a week): a finite bound on a hung replica's silence (``inf`` was taken)."""
MAX_TURNS = 256
"""``task.max_turns`` at most: more environment steps than any token budget holds."""
MAX_ENV_TIMEOUT_S = 86400.0
"""``task.env_timeout_s`` at most (a day): a larger (or infinite) limit bounds nothing."""


def _d(text: str, **kw: Any) -> Meta:
    return Meta(description=text, **kw)


class _Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class RunConfig(_Section):
    name: Annotated[str, _d("Run name; the run id is '<name>-<random suffix>'.")] = "shunter"
    seed: Annotated[int, _d("Seed for prompts, sampling and the trainer.")] = 0
    output_dir: Annotated[
        str,
        _d("Where runs write their folders (<output_dir>/<run_id>: events.bin, metrics.jsonl, run.log, checkpoints/)."),
    ] = "runs"
    total_steps: Annotated[PosInt, _d("Optimizer steps to run before stopping.")] = 100
    policy: Annotated[
        str, _d("Switching policy: a built-in name (separate, lend_when_idle, colocated) or 'module:Class'.")
    ] = "separate"
    policy_options: Annotated[
        dict[str, float | int | str | bool], _d("Keyword arguments for the policy's constructor.")
    ] = {}
    trainer_driver: Annotated[
        Literal["engine", "user"],
        _d("'engine': the policy runs train steps; 'user': the embedding program takes batches and trains."),
    ] = "engine"
    ray_address: Annotated[
        str,
        _d(
            "Ray cluster to join ('auto', or the head's address as 'ray start --head' printed it; shunter run --address); empty: start a local one bound to 127.0.0.1, dashboard off."
        ),
    ] = ""
    relays: Annotated[
        Literal["auto", "all", "none"],
        _d(
            "Relay actors, one per host that runs replicas: each holds its host's generation streams, folds their per-sample facts into one report per rollout.report_window_s and takes new weights from the trainer for them (one call per host a publish). 'auto': on every host but the driver's (whose replicas the coordinator's own process serves, folding alike: on one machine no extra process); 'all': on the driver's host too; 'none': the coordinator's process holds every stream."
        ),
    ] = "auto"
    direct_weights: Annotated[
        bool,
        _d(
            "New weights go from the trainer straight to each replica the coordinator's process serves (the trainer orders its load as it publishes: one hop fewer than a relay, two fewer than through the coordinator); false: the coordinator orders those loads once the trainer has published. Replicas behind a relay actor take weights from it either way; a collective weight transport (nccl / gloo) pairs every load with a send and goes through the coordinator."
        ),
    ] = True
    num_cpus: Annotated[float, _d("CPUs of the local Ray cluster (0: all cores).", ge=0)] = 0
    timeout_s: Annotated[PosFloat, _d("Upper bound on any single wait (actor setup, weight load, RPC).")] = 300.0
    stall_timeout_s: Annotated[
        PosFloat,
        _d(
            "End the run with an error if nothing is in flight and no message arrives for this long (a policy that never acts again); engine-driven runs only."
        ),
    ] = 60.0
    progress: Annotated[bool, _d("Show a progress bar on the terminal.")] = True
    checkpoint_every: Annotated[
        NonNegInt,
        _d(
            "Save a checkpoint (model, optimizer, step, version, buffer, prompts in flight, policy state) into <output_dir>/<run_id>/checkpoints at the first publish at least this many optimizer steps after the last one, and at the end; 0 disables."
        ),
    ] = 0
    checkpoint_keep: Annotated[
        PosInt, _d("Complete checkpoints kept (older ones are removed once a newer one is committed).")
    ] = 2
    max_restarts: Annotated[
        NonNegInt,
        _d(
            "When the trainer or the coordinator dies, restart the run from its last checkpoint up to this many times (needs checkpoint_every > 0)."
        ),
    ] = 2
    policy_max_failures: Annotated[
        PosInt,
        _d(
            "End the run when the policy's decide() raises or returns something other than a list of intents this many times in a row (each failure is reported as policy.failed)."
        ),
    ] = 10
    policy_budget_ms: Annotated[
        PosFloat,
        _d(
            "Warn (policy.slow) when one decide() call takes longer than this; it runs on the coordinator's loop, so every millisecond delays every replica's next request."
        ),
    ] = 10.0
    policy_timeout_s: Annotated[
        PosFloat,
        _d(
            "A decide() call still running after this long is interrupted and the run ends with an error naming the policy (an endless loop would otherwise freeze the coordinator's loop)."
        ),
    ] = 10.0
    import_paths: Annotated[
        list[str],
        _d(
            "Folders searched first for 'module:name' import strings (policy, task, reward, loss), in every process of the run. load_config() adds the config file's folder and the working directory at load time."
        ),
    ] = []


class ModelConfig(_Section):
    path: Annotated[str, _d("HF-format model directory (config.json, weights, tokenizer).")] = (
        ".shunter/models/sort-tiny"
    )
    build_tiny: Annotated[
        str, _d("If set to a task name and 'path' holds no model, build the tiny warm-started model there first.")
    ] = ""
    sft_steps: Annotated[NonNegInt, _d("Supervised warm-start steps when building the tiny model.")] = 25
    preset: Annotated[
        Literal["tiny", "qwen2-0.5b"],
        _d(
            "Shape of the model build_tiny builds: 'tiny' (warm-started, learns the task on CPU) or 'qwen2-0.5b' (Qwen2-0.5B's shape, random init, bf16: for GPU throughput and weight-sync measurements)."
        ),
    ] = "tiny"


class TaskConfig(_Section):
    name: Annotated[str, _d("Built-in task (sort_digits) or 'module:Class'.")] = "sort_digits"
    reward: Annotated[
        str,
        _d(
            "Reward override: a built-in ('math': the last \\boxed{} or number against the ground truth, by math-verify) or 'module:function': (prompt, response, answer) or verl's (data_source, solution_str, ground_truth, extra_info), returning a float or a dict with 'score'; empty: the task's own."
        ),
    ] = ""
    reward_timeout_s: Annotated[
        float,
        _d(
            f"Each reward call's limit, in seconds, above 0 and at most {MAX_ENV_TIMEOUT_S:g}; a call that raises, returns junk or runs longer scores 0.0 and is counted (reward/raised, reward/returned, reward/timeout).",
            gt=0,
            le=MAX_ENV_TIMEOUT_S,
        ),
    ] = 30.0
    reward_threads: Annotated[
        PosInt,
        _d(
            "Threads that run reward calls, per replica (off the replica's event loop) or, with task.reward_workers, per reward worker."
        ),
    ] = 4
    reward_workers: Annotated[
        NonNegInt,
        _d(
            "Reward worker processes (Ray actors) shared by the run's replicas, each running task.reward_threads calls at once, each bounded by task.reward_timeout_s; a reward that crashes its process or holds the interpreter costs only its worker (started again) and scores 0.0 for the calls it held. 0: rewards run in threads on each replica."
        ),
    ] = 0
    reward_worker_cpus: Annotated[PosFloat, _d("CPUs Ray reserves for each reward worker.")] = 1.0
    environment: Annotated[
        str,
        _d(
            "Multi-turn rollouts: an environment, built-in (calculator) or 'module:Class' (one object per trajectory, with stop strings, async reset(prompt, transcript) and step(action) -> StepResult). Generation stops at a tool call, the environment answers, its observation is appended masked out of the loss. Empty: single turn."
        ),
    ] = ""
    max_turns: Annotated[
        int,
        _d(
            f"Environment steps per trajectory at most (1 to {MAX_TURNS}); after the last, the model generates once more without tool calls.",
            ge=1,
            le=MAX_TURNS,
        ),
    ] = 4
    env_timeout_s: Annotated[
        float,
        _d(
            f"Each environment call's limit (the constructor, reset, step, close), in seconds, above 0 and at most {MAX_ENV_TIMEOUT_S:g}, below 0.9 x rollout.generate_timeout_s; a call that raises, returns junk or runs longer ends its trajectory (env/raised, env/returned, env/timeout).",
            gt=0,
            le=MAX_ENV_TIMEOUT_S,
        ),
    ] = 30.0


class DataConfig(_Section):
    train_files: Annotated[
        list[str],
        _d(
            "Prompt files in verl's layout (parquet or JSONL: prompt as chat messages or a string, data_source, reward_model.ground_truth, extra_info), paths or globs; relative ones from the config file's folder. Empty: the task's own prompts."
        ),
    ] = []
    val_files: Annotated[
        list[str],
        _d(
            "Held-out prompt files (same layout); validation scores their first validation.prompts rows. Empty with train_files set: no validation."
        ),
    ] = []
    shuffle: Annotated[bool, _d("Shuffle each epoch's order (seeded by run.seed and the epoch).")] = True
    epochs: Annotated[
        NonNegInt,
        _d(
            "Passes over train_files; when they are done the run trains what it has and ends. 0: no end but total_steps."
        ),
    ] = 0
    max_prompt_tokens: Annotated[
        NonNegInt,
        _d(
            "Prompts longer than this are left out at load (counted in the run summary); 0: rollout.max_model_len - rollout.max_tokens."
        ),
    ] = 0


class RolloutConfig(_Section):
    standalone_replicas: Annotated[
        NonNegInt, _d("vLLM replicas on their own resources; they generate continuously.")
    ] = 1
    hybrid_replicas: Annotated[
        NonNegInt, _d("vLLM replicas that share the trainer's resources; the policy lends them to rollout.")
    ] = 0
    n_samples_per_prompt: Annotated[PosInt, _d("Samples per prompt (GRPO group size).")] = 8
    max_tokens: Annotated[PosInt, _d("Token budget of one sample, including any resumed part.")] = 16
    temperature: Annotated[float, _d("Sampling temperature.", ge=0)] = 1.0
    top_p: Annotated[float, _d("Nucleus sampling.", gt=0, le=1)] = 1.0
    top_k: Annotated[int, _d("Top-k sampling; -1 disables.")] = -1
    ignore_eos: Annotated[
        bool, _d("Keep generating past the eos token (throughput benchmarks with random-init models).")
    ] = False
    length_dist: Annotated[
        str,
        _d(
            "Benchmark knob: each sample's token budget drawn from 'lognormal:<median>:<sigma>', or from the lengths in a file, 'file:<path>' (whitespace-separated positive integers, '#' comments; a relative path is resolved from the config file's folder), capped at max_tokens; with ignore_eos, long-tail response lengths from a model that never stops. Empty: every sample may use max_tokens."
        ),
    ] = ""
    max_staleness: Annotated[
        NonNegInt, _d("Largest allowed (trainer version - oldest token version) of a trained sample.")
    ] = 1
    on_stale: Annotated[
        Literal["wait", "drop"],
        _d(
            "'wait': batches take finished groups first as far as the bound allows and wait for a straggler only once its deadline has come, so none exceeds it; 'drop': batches take finished groups first and drop any that exceeded it."
        ),
    ] = "wait"
    weight_update: Annotated[
        WeightUpdate,
        _d(
            "How a generating replica takes new weights: 'abort' cuts its requests and resumes them from their prefix on the new weights (re-prefilled); 'keep' pauses them with their KV cache, swaps the weights and lets them go on (no re-prefill; later tokens attend to context the old weights computed). Tokens carry the version that produced them either way."
        ),
    ] = "abort"
    max_in_flight_per_replica: Annotated[PosInt, _d("Samples in flight on one replica at most.")] = 128
    max_model_len: Annotated[PosInt, _d("vLLM context length.")] = 64
    generate_timeout_s: Annotated[
        float,
        Meta(ge=MIN_GENERATE_TIMEOUT_S, le=MAX_GENERATE_TIMEOUT_S),
        _d(
            f"A replica whose generation call has made no progress for this long (no turn generated, no environment call answered, no sample ended; a sample whose reward is being scored counts as progress; it reports progress at most a tenth of this late) is taken as hung: it is killed, reported down, and its samples resume elsewhere. It bounds silence, not total time: a trajectory of many slow tool calls may run far longer. At least {MIN_GENERATE_TIMEOUT_S:g} s: a stream beats every tenth of it, so at most 10 beats a second (one Ray call each)."
        ),
    ] = 1800.0
    replica_restarts: Annotated[
        NonNegInt,
        _d(
            "A replica that dies (its actor or its inference engine) is replaced, up to this many times per replica slot (rank) within an hour, after a backoff that doubles each time; 0: never replaced. The run ends with an error when no replica is left and none can be replaced."
        ),
    ] = 3
    replacement_wait_s: Annotated[
        PosFloat,
        _d(
            "A replacement (or a replica added mid-run) that finds no room in the Ray cluster — its node lost, its custom resources offered by no node with room — waits this long for room (a node back, or one added: replica.pending says what it waits for) before it counts as a failed start."
        ),
    ] = 300.0
    replica_restart_backoff_s: Annotated[
        float, _d("Wait before the first replacement of a replica slot (doubles each time, at most 60 s).", ge=0)
    ] = 2.0
    num_cpus: Annotated[float, _d("Ray CPUs reserved per replica actor (fractional is fine).", ge=0)] = 0.5
    num_gpus: Annotated[
        float,
        _d(
            "Ray GPUs per replica actor; a fraction shares a GPU (with the trainer, for cuda_ipc weight sync). 0 on CPU machines.",
            ge=0,
        ),
    ] = 0.0
    gpu_memory_utilization: Annotated[
        float, _d("Share of the GPU's memory one vLLM engine may take (GPU only).", gt=0, le=1)
    ] = 0.4
    share_trainer_gpu: Annotated[
        bool,
        _d(
            "Standalone replicas too live on the trainer's GPU (one-GPU machines), each with rollout.num_gpus of it; weights then reach them over IPC. Off: each standalone replica gets a GPU of its own."
        ),
    ] = False
    stream_interval: Annotated[
        PosInt,
        _d(
            "vLLM hands generated tokens to the replica every this many tokens (and at the end of a request, an abort included, so none is lost); 1 streams every token at a large host cost with many concurrent requests."
        ),
    ] = 16
    enable_sleep_mode: Annotated[
        bool,
        _d("Start vLLM with sleep mode so SwitchToTrainer frees its GPU memory (GPU only; sleep is a no-op on CPU)."),
    ] = True
    engine_args: Annotated[dict[str, float | int | str | bool], _d("Extra vLLM engine arguments.")] = {}
    cpu_bind: Annotated[
        list[str], _d("VLLM_CPU_OMP_THREADS_BIND per replica in rank order (CPU build only); empty: 'nobind'.")
    ] = []
    resources: Annotated[
        dict[str, float],
        _d(
            "Custom Ray resources each standalone replica needs (e.g. {node_b = 1}: only nodes started with 'ray start --resources' offering them take replicas); GPU configs reserve them in each replica's placement bundle."
        ),
    ] = {}
    placement_strategy: Annotated[
        Literal["PACK", "SPREAD", "STRICT_SPREAD"],
        _d(
            "GPU configs: how the standalone replicas' placement group lays their bundles over the nodes ('SPREAD': over as many nodes as it can, so a lost node takes few; 'PACK': on as few as it can; 'STRICT_SPREAD': one per node). The trainer's GPUs are always on one node (STRICT_PACK)."
        ),
    ] = "SPREAD"
    report_window_s: Annotated[
        float,
        _d(
            "Relays fold the per-sample facts (a sample begun, resumed, cut, ended; a weight load) of the replicas behind them into one report per this many seconds, so the coordinator handles one message per window instead of one per sample; each fact waits at most this long. 0: only the facts of one sample's end travel together (no wait).",
            ge=0,
            le=1.0,
        ),
    ] = 0.01
    report_max_events: Annotated[
        PosInt,
        _d(
            "A relay's report holds at most this many facts (a fuller window is sent at once); 1 folds nothing: every fact reaches the coordinator alone."
        ),
    ] = 512


class TrainerConfig(_Section):
    ppo_mini_batch_size: Annotated[PosInt, _d("Samples per optimizer step.")] = 128
    parameter_sync_step: Annotated[PosInt, _d("Optimizer steps between weight publishes.")] = 2
    train_batch_size: Annotated[
        PosInt, _d("Samples per publish cycle; must equal parameter_sync_step * ppo_mini_batch_size.")
    ] = 256
    lr: Annotated[PosFloat, _d("AdamW learning rate.")] = 2e-4
    weight_decay: Annotated[float, _d("AdamW weight decay.", ge=0)] = 0.0
    clip_ratio: Annotated[PosFloat, _d("PPO clip range epsilon.")] = 0.2
    kl_coef: Annotated[
        float,
        _d("Weight of the KL penalty to the reference (initial) model; 0 disables it and loads no reference.", ge=0),
    ] = 0.0
    grad_clip: Annotated[float, _d("Gradient norm clip; 0 disables.", ge=0)] = 1.0
    loss_fn: Annotated[str, _d("Loss override 'module:function'; empty: built-in PPO clip in bypass mode.")] = ""
    objective: Annotated[
        Literal["bypass", "decoupled"],
        _d(
            "'bypass': the rollout's log-probs are the old policy's (PPO ratio pi_theta / mu, no extra forward pass); 'decoupled': decoupled PPO — the trust region around the proximal policy (the weights at the start of the sync cycle, kept in host memory when parameter_sync_step > 1), each token weighted by pi_prox / mu corrected by 'tis' / 'mis'."
        ),
    ] = "bypass"
    tis: Annotated[
        Literal["none", "token", "sequence"],
        _d(
            "Truncated importance sampling of the behaviour weight pi_prox / mu (decoupled only): per token or per sequence (product over its tokens), capped at tis_cap; 'none': uncapped."
        ),
    ] = "token"
    tis_cap: Annotated[PosFloat, _d("Cap of the TIS weight.")] = 5.0
    mis: Annotated[
        Literal["none", "token", "sequence"],
        _d(
            "Masked importance sampling (IcePop-style): drop tokens whose behaviour ratio (pi_prox / mu; in bypass pi_theta / mu) leaves [mis_low, mis_high], per token or per sequence (geometric mean ratio)."
        ),
    ] = "none"
    mis_low: Annotated[PosFloat, _d("Lower edge of the MIS band.")] = 0.5
    mis_high: Annotated[PosFloat, _d("Upper edge of the MIS band.")] = 2.0
    micro_batch_size: Annotated[
        NonNegInt,
        _d(
            "Samples per forward/backward pass (gradients accumulate over a mini-batch); 0: the whole mini-batch at once."
        ),
    ] = 0
    num_threads: Annotated[PosInt, _d("torch intra-op threads of the trainer.")] = 1
    resources: Annotated[
        dict[str, float],
        _d(
            "Custom Ray resources the trainer needs (e.g. {node_a = 1}: it runs on a node started with 'ray start --resources' offering them); hybrid replicas live on the trainer's node."
        ),
    ] = {}
    num_cpus: Annotated[float, _d("Ray CPUs reserved for the trainer actor.", ge=0)] = 1.0
    device: Annotated[str, _d("torch device; 'auto': cuda if available else cpu.")] = "auto"
    num_gpus: Annotated[
        float,
        _d(
            "Ray GPUs for the trainer actor (at most 1: it is one process; a fraction leaves room for hybrid replicas on its GPU); 0 on CPU machines.",
            ge=0,
            le=1,
        ),
    ] = 0.0
    gpus: Annotated[
        PosInt,
        _d(
            "GPUs on the trainer's side of the placement (GPU configs): the trainer process uses the first; hybrid replicas spread over all of them, round robin. More than 1 lets a synchronous run (colocated) generate on every GPU it trains beside."
        ),
    ] = 1
    precision: Annotated[
        Literal["auto", "fp32", "bf16"],
        _d(
            "'bf16': forward/backward under bf16 autocast with fp32 master weights and optimizer state, weights published in bf16; 'auto': bf16 on cuda, fp32 on cpu."
        ),
    ] = "auto"
    weight_transport: Annotated[
        Literal["auto", "safetensors", "cuda_ipc", "vllm_ipc", "nccl", "gloo"],
        _d(
            "How published weights reach replicas: 'safetensors' (a blob through the Ray object store; any device), 'cuda_ipc' (CUDA IPC handles to the trainer's GPU copy, loaded by shunter's worker extension; replicas on the same GPU), 'vllm_ipc' (the same handles in vLLM's packed format, loaded by vLLM's own weight-transfer engine, backend 'ipc'), 'nccl' (a broadcast over an NCCL group of the trainer and each standalone replica, on other GPUs; hybrid replicas on the trainer's GPU map the cuda_ipc handles), 'gloo' (the same over gloo, CPU: the stand-in the tests run); 'auto': cuda_ipc on cuda, else safetensors."
        ),
    ] = "auto"
    weight_bucket_mb: Annotated[
        PosFloat, _d("nccl / gloo: the flat weight copy goes over the wire in buckets of at most this many MiB.")
    ] = 256.0
    weight_group_timeout_s: Annotated[
        PosFloat,
        _d(
            "nccl / gloo: deadline of every collective (joining a group, one weight broadcast); past it the group is aborted and the failure reported."
        ),
    ] = 120.0


class ValidationConfig(_Section):
    every: Annotated[
        NonNegInt,
        _d(
            "Validate at the start and every this many optimizer steps (on the first weights published at or after each multiple), and at the end; 0 disables."
        ),
    ] = 0
    prompts: Annotated[PosInt, _d("Held-out prompts, generated greedily.")] = 64


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
