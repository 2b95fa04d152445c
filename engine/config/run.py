"""The run-wide config sections: ``[run]`` (:class:`RunConfig`), ``[model]`` (:class:`ModelConfig`),
``[task]`` (:class:`TaskConfig`), ``[data]`` (:class:`DataConfig`) and ``[validation]``
(:class:`ValidationConfig`).

Invariant: each field is checked alone here (type and bounds, every one documented with ``doc``);
rules across fields and sections live in :func:`shunter.engine.config.check`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from shunter.engine.config.base import MAX_ENV_TIMEOUT_S, MAX_TURNS, NonNegInt, PosFloat, PosInt, Section, doc


class RunConfig(Section):
    name: Annotated[str, doc("Run name; the run id is '<name>-<random suffix>'.")] = "shunter"
    seed: Annotated[int, doc("Seed for prompts, sampling and the trainer.")] = 0
    output_dir: Annotated[
        str,
        doc(
            "Where runs write their folders (<output_dir>/<run_id>: events.bin, metrics.jsonl, run.log, checkpoints/)."
        ),
    ] = "runs"
    total_steps: Annotated[PosInt, doc("Optimizer steps to run before stopping.")] = 100
    policy: Annotated[
        str, doc("Switching policy: a built-in name (separate, lend_when_idle, colocated) or 'module:Class'.")
    ] = "separate"
    policy_options: Annotated[
        dict[str, float | int | str | bool], doc("Keyword arguments for the policy's constructor.")
    ] = {}
    trainer_driver: Annotated[
        Literal["engine", "user"],
        doc("'engine': the policy runs train steps; 'user': the embedding program takes batches and trains."),
    ] = "engine"
    ray_address: Annotated[
        str,
        doc(
            "Ray cluster to join ('auto', or the head's address as 'ray start --head' printed it; shunter run --address); empty: start a local one bound to 127.0.0.1, dashboard off."
        ),
    ] = ""
    connect_timeout_s: Annotated[
        PosFloat,
        doc(
            "How long a run joining run.ray_address waits for the cluster's GCS to answer (a head still starting is tried again within it) before it ends naming the address and what to check; a refused auth token ends it at once."
        ),
    ] = 15.0
    relays: Annotated[
        Literal["auto", "all", "none"],
        doc(
            "Relay actors, one per host that runs replicas: each holds its host's generation streams, folds their per-sample facts into one report per rollout.report_window_s and takes new weights from the trainer for them (one call per host a publish). 'auto': on every host but the driver's (whose replicas the coordinator's own process serves, folding alike: on one machine no extra process); 'all': on the driver's host too; 'none': the coordinator's process holds every stream."
        ),
    ] = "auto"
    direct_weights: Annotated[
        bool,
        doc(
            "New weights go from the trainer straight to each replica the coordinator's process serves (the trainer orders its load as it publishes: one hop fewer than a relay, two fewer than through the coordinator); false: the coordinator orders those loads once the trainer has published. Replicas behind a relay actor take weights from it either way; a collective weight transport (nccl / gloo) pairs every load with a send and goes through the coordinator."
        ),
    ] = True
    num_cpus: Annotated[float, doc("CPUs of the local Ray cluster (0: all cores).", ge=0)] = 0
    timeout_s: Annotated[PosFloat, doc("Upper bound on any single wait (actor setup, weight load, RPC).")] = 300.0
    stall_timeout_s: Annotated[
        PosFloat,
        doc(
            "End the run with an error if nothing is in flight and no message arrives for this long (a policy that never acts again); engine-driven runs only."
        ),
    ] = 60.0
    progress: Annotated[bool, doc("Show a progress bar on the terminal.")] = True
    checkpoint_every: Annotated[
        NonNegInt,
        doc(
            "Save a checkpoint (model, optimizer, step, version, buffer, prompts in flight, policy state) into <output_dir>/<run_id>/checkpoints at the first publish at least this many optimizer steps after the last one, and at the end; 0 disables."
        ),
    ] = 0
    checkpoint_retries: Annotated[
        NonNegInt,
        doc(
            "A checkpoint that cannot be written (a folder made unwritable, a full disk) is tried again at the next publish — at the end of the run, at once — up to this many times in a row; then the run ends with an error naming the folder, the OS error and the last good checkpoint (exit status 1). Each failed try is reported as command.failed."
        ),
    ] = 2
    checkpoint_keep: Annotated[
        PosInt, doc("Complete checkpoints kept (older ones are removed once a newer one is committed).")
    ] = 2
    max_restarts: Annotated[
        NonNegInt,
        doc(
            "When the trainer or the coordinator dies, restart the run from its last checkpoint up to this many times (needs checkpoint_every > 0)."
        ),
    ] = 2
    restart_wait_s: Annotated[
        PosFloat,
        doc(
            "Such a restart that finds no room in the Ray cluster for the trainer (its node lost) waits this long for room — a node back, or one added: trainer.pending says what it waits for — before the run ends with an error naming the step and the --resume line."
        ),
    ] = 300.0
    restart_keeps_replicas: Annotated[
        bool,
        doc(
            "On such a restart, standalone replicas whose vLLM engine still answers are kept: they load the checkpoint's weights in place instead of starting a new engine (false: every replica is started again)."
        ),
    ] = True
    policy_max_failures: Annotated[
        PosInt,
        doc(
            "End the run when the policy's decide() raises or returns something other than a list of intents this many times in a row (each failure is reported as policy.failed)."
        ),
    ] = 10
    policy_budget_ms: Annotated[
        PosFloat,
        doc(
            "Warn (policy.slow) when one decide() call takes longer than this; the coordinator waits for every call to return (a user's policy runs on a thread of its own, the built-ins on the coordinator's loop), so every millisecond delays every replica's next request."
        ),
    ] = 10.0
    policy_timeout_s: Annotated[
        PosFloat,
        doc(
            "A decide() call still running after this long ends the run with an error naming the policy, the event and 'did not return': a call stuck in Python (an endless loop) is interrupted; a user's policy runs on a thread of its own, so one blocked in C (a lock, I/O, a native call) is abandoned 1 s later (engine/coordinator/policy_worker.py). Built-in policies run on the coordinator's loop."
        ),
    ] = 10.0
    import_paths: Annotated[
        list[str],
        doc(
            "Folders searched first for 'module:name' import strings (policy, task, reward, loss), in every process of the run. load_config() adds the config file's folder and the working directory at load time."
        ),
    ] = []


class ModelConfig(Section):
    path: Annotated[str, doc("HF-format model directory (config.json, weights, tokenizer).")] = (
        ".shunter/models/sort-tiny"
    )
    build_tiny: Annotated[
        str, doc("If set to a task name and 'path' holds no model, build the tiny warm-started model there first.")
    ] = ""
    sft_steps: Annotated[NonNegInt, doc("Supervised warm-start steps when building the tiny model.")] = 25
    preset: Annotated[
        Literal["tiny", "qwen2-0.5b"],
        doc(
            "Shape of the model build_tiny builds: 'tiny' (warm-started, learns the task on CPU) or 'qwen2-0.5b' (Qwen2-0.5B's shape, random init, bf16: for GPU throughput and weight-sync measurements)."
        ),
    ] = "tiny"


class TaskConfig(Section):
    name: Annotated[str, doc("Built-in task (sort_digits) or 'module:Class'.")] = "sort_digits"
    reward: Annotated[
        str,
        doc(
            "Reward override: a built-in ('math': the last \\boxed{} or number against the ground truth, by math-verify) or 'module:function': (prompt, response, answer) or verl's (data_source, solution_str, ground_truth, extra_info), returning a float or a dict with 'score'; empty: the task's own."
        ),
    ] = ""
    reward_timeout_s: Annotated[
        float,
        doc(
            f"Each reward call's limit, in seconds, above 0 and at most {MAX_ENV_TIMEOUT_S:g}; a call that raises, returns junk or runs longer scores 0.0 and is counted (reward/raised, reward/returned, reward/timeout).",
            gt=0,
            le=MAX_ENV_TIMEOUT_S,
        ),
    ] = 30.0
    reward_threads: Annotated[
        PosInt,
        doc(
            "Threads that run reward calls, per replica (off the replica's event loop) or, with task.reward_workers, per reward worker."
        ),
    ] = 4
    reward_workers: Annotated[
        NonNegInt,
        doc(
            "Reward worker processes (Ray actors) shared by the run's replicas, each running task.reward_threads calls at once, each bounded by task.reward_timeout_s; a reward that crashes its process or holds the interpreter costs only its worker (started again) and scores 0.0 for the calls it held. 0: rewards run in threads on each replica."
        ),
    ] = 0
    reward_worker_cpus: Annotated[PosFloat, doc("CPUs Ray reserves for each reward worker.")] = 1.0
    environment: Annotated[
        str,
        doc(
            "Multi-turn rollouts: an environment, built-in (calculator) or 'module:Class' (one object per trajectory, with stop strings, async reset(prompt, transcript) and step(action) -> StepResult). Generation stops at a tool call, the environment answers, its observation is appended masked out of the loss. Empty: single turn."
        ),
    ] = ""
    max_turns: Annotated[
        int,
        doc(
            f"Environment steps per trajectory at most (1 to {MAX_TURNS}); after the last, the model generates once more without tool calls.",
            ge=1,
            le=MAX_TURNS,
        ),
    ] = 4
    env_timeout_s: Annotated[
        float,
        doc(
            f"Each environment call's limit (the constructor, reset, step, close), in seconds, above 0 and at most {MAX_ENV_TIMEOUT_S:g}, below 0.9 x rollout.generate_timeout_s; a call that raises, returns junk or runs longer ends its trajectory (env/raised, env/returned, env/timeout).",
            gt=0,
            le=MAX_ENV_TIMEOUT_S,
        ),
    ] = 30.0


class DataConfig(Section):
    train_files: Annotated[
        list[str],
        doc(
            "Prompt files in verl's layout (parquet or JSONL: prompt as chat messages or a string, data_source, reward_model.ground_truth, extra_info), paths or globs; relative ones from the config file's folder. Empty: the task's own prompts."
        ),
    ] = []
    val_files: Annotated[
        list[str],
        doc(
            "Held-out prompt files (same layout); validation scores their first validation.prompts rows. Empty with train_files set: no validation."
        ),
    ] = []
    shuffle: Annotated[bool, doc("Shuffle each epoch's order (seeded by run.seed and the epoch).")] = True
    epochs: Annotated[
        NonNegInt,
        doc(
            "Passes over train_files; when they are done the run trains what it has and ends. 0: no end but total_steps."
        ),
    ] = 0
    max_prompt_tokens: Annotated[
        NonNegInt,
        doc(
            "Prompts longer than this are left out at load (counted in the run summary); 0: rollout.max_model_len - rollout.max_tokens."
        ),
    ] = 0


class ValidationConfig(Section):
    every: Annotated[
        NonNegInt,
        doc(
            "Validate at the start and every this many optimizer steps (on the first weights published at or after each multiple), and at the end; 0 disables."
        ),
    ] = 0
    prompts: Annotated[PosInt, doc("Held-out prompts, generated greedily.")] = 64
