"""The ``[rollout]`` config section (:class:`RolloutConfig`): the vLLM replicas — how many, how they
sample, stay fresh, take new weights, are replaced, placed and report.

Invariant: each field is checked alone here (type and bounds, every one documented with ``doc``);
rules across fields and sections live in :func:`shunter.engine.config.check`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from shunter.engine.config.base import (
    MAX_GENERATE_TIMEOUT_S,
    MIN_GENERATE_TIMEOUT_S,
    NonNegInt,
    PosFloat,
    PosInt,
    Section,
    doc,
)
from shunter.events.vocab import WeightUpdate


class RolloutConfig(Section):
    standalone_replicas: Annotated[
        NonNegInt, doc("vLLM replicas on their own resources; they generate continuously.")
    ] = 1
    hybrid_replicas: Annotated[
        NonNegInt, doc("vLLM replicas that share the trainer's resources; the policy lends them to rollout.")
    ] = 0
    n_samples_per_prompt: Annotated[PosInt, doc("Samples per prompt (GRPO group size).")] = 8
    max_tokens: Annotated[PosInt, doc("Token budget of one sample, including any resumed part.")] = 16
    temperature: Annotated[float, doc("Sampling temperature.", ge=0)] = 1.0
    top_p: Annotated[float, doc("Nucleus sampling.", gt=0, le=1)] = 1.0
    top_k: Annotated[int, doc("Top-k sampling; -1 disables.")] = -1
    ignore_eos: Annotated[
        bool, doc("Keep generating past the eos token (throughput benchmarks with random-init models).")
    ] = False
    length_dist: Annotated[
        str,
        doc(
            "Benchmark knob: each sample's token budget drawn from 'lognormal:<median>:<sigma>', or from the lengths in a file, 'file:<path>' (whitespace-separated positive integers, '#' comments; a relative path is resolved from the config file's folder), capped at max_tokens; with ignore_eos, long-tail response lengths from a model that never stops. Empty: every sample may use max_tokens."
        ),
    ] = ""
    max_staleness: Annotated[
        NonNegInt, doc("Largest allowed (trainer version - oldest token version) of a trained sample.")
    ] = 1
    admit_staleness: Annotated[
        int,
        doc(
            "The staleness gate's admission bound: on weights of version v a new group starts only while fewer than (admit_staleness + v + 1) versions' worth of groups (train_batch_size / n_samples_per_prompt each) have started and not been dropped (AReaL's gate). -1: max_staleness. Set lower, the rollout starts less work ahead of the trainer while a straggler may still be max_staleness versions old when trained; with the trainer's replicas lent for the first batch, fewer groups share the replicas and the first ones complete sooner (docs/benchmarks.md, long_tail). At most max_staleness.",
            ge=-1,
        ),
    ] = -1

    spread_at_end: Annotated[
        bool,
        doc(
            "Once every group the run trains has started, a replica left with nothing to generate takes samples off the most loaded replicas (cut and resumed from their prefix, which is prefilled again), so the replicas finish the run's last groups together instead of a few decoding the stragglers in full batches while the rest idle."
        ),
    ] = False

    @property
    def admit_bound(self) -> int:
        """The gate's admission bound in effect: ``admit_staleness``, or ``max_staleness`` (-1)."""
        return self.max_staleness if self.admit_staleness < 0 else self.admit_staleness

    on_stale: Annotated[
        Literal["wait", "drop"],
        doc(
            "'wait': batches take finished groups first as far as the bound allows and wait for a straggler only once its deadline has come, so none exceeds it; 'drop': batches take finished groups first and drop any that exceeded it."
        ),
    ] = "wait"
    weight_update: Annotated[
        WeightUpdate,
        doc(
            "How a generating replica takes new weights: 'abort' cuts its requests and resumes them from their prefix on the new weights (re-prefilled); 'keep' pauses them with their KV cache, swaps the weights and lets them go on (no re-prefill; later tokens attend to context the old weights computed). Tokens carry the version that produced them either way."
        ),
    ] = "abort"
    max_in_flight_per_replica: Annotated[PosInt, doc("Samples in flight on one replica at most.")] = 128
    max_model_len: Annotated[PosInt, doc("vLLM context length.")] = 64
    generate_timeout_s: Annotated[
        float,
        Meta(ge=MIN_GENERATE_TIMEOUT_S, le=MAX_GENERATE_TIMEOUT_S),
        doc(
            f"A replica whose generation call has made no progress for this long (no turn generated, no environment call answered, no sample ended; a sample whose reward is being scored counts as progress; it reports progress at most a tenth of this late) is taken as hung: it is killed, reported down, and its samples resume elsewhere. It bounds silence, not total time: a trajectory of many slow tool calls may run far longer. At least {MIN_GENERATE_TIMEOUT_S:g} s: a stream beats every tenth of it, so at most 10 beats a second (one Ray call each)."
        ),
    ] = 1800.0
    replica_restarts: Annotated[
        NonNegInt,
        doc(
            "A replica that dies (its actor or its inference engine) is replaced, up to this many times per replica slot (rank) within an hour, after a backoff that doubles each time; 0: never replaced. The run ends with an error when no replica is left and none can be replaced."
        ),
    ] = 3
    replacement_wait_s: Annotated[
        PosFloat,
        doc(
            "A replacement (or a replica added mid-run) that finds no room in the Ray cluster — its node lost, its custom resources offered by no node with room — waits this long for room (a node back, or one added: replica.pending says what it waits for) before it counts as a failed start."
        ),
    ] = 300.0
    replica_restart_backoff_s: Annotated[
        float, doc("Wait before the first replacement of a replica slot (doubles each time, at most 60 s).", ge=0)
    ] = 2.0
    num_cpus: Annotated[float, doc("Ray CPUs reserved per replica actor (fractional is fine).", ge=0)] = 0.5
    num_gpus: Annotated[
        float,
        doc(
            "Ray GPUs per replica actor, at most 1: a fraction shares a GPU (with the trainer, for cuda_ipc weight sync); a hybrid replica of tensor_parallel_size T takes this share of each of its T GPUs, a standalone one a bundle of T whole GPUs. 0 on CPU machines.",
            ge=0,
        ),
    ] = 0.0
    tensor_parallel_size: Annotated[
        PosInt,
        doc(
            "vLLM tensor parallelism: each replica is this many devices (GPUs; worker processes on CPU) serving one engine through vLLM's own multiprocessing executor, which shards every weight it loads over them; a weight group's bytes reach its first rank, which hands them to the others over vLLM's own group. It must divide the model's attention and KV heads. GPU configs: a standalone replica reserves one placement bundle of this many GPUs; hybrid replicas span this many of the trainer's GPUs each (trainer.gpus a multiple of it: trainer.gpus / T hybrid replicas at most). CPU: each rollout.cpu_bind entry names one core list per rank, or 'nobind'. The death of any of its processes is the replica's death."
        ),
    ] = 1
    gpu_memory_utilization: Annotated[
        float, doc("Share of the GPU's memory one vLLM engine may take (GPU only).", gt=0, le=1)
    ] = 0.4
    share_trainer_gpu: Annotated[
        bool,
        doc(
            "Standalone replicas too live on the trainer's GPU (one-GPU machines), each with rollout.num_gpus of it; weights then reach them over IPC. Off: each standalone replica gets a GPU of its own."
        ),
    ] = False
    stream_interval: Annotated[
        PosInt,
        doc(
            "vLLM hands generated tokens to the replica every this many tokens (and at the end of a request, an abort included, so none is lost); 1 streams every token at a large host cost with many concurrent requests."
        ),
    ] = 16
    enable_sleep_mode: Annotated[
        bool,
        doc("Start vLLM with sleep mode so SwitchToTrainer frees its GPU memory (GPU only; sleep is a no-op on CPU)."),
    ] = True
    engine_args: Annotated[dict[str, float | int | str | bool], doc("Extra vLLM engine arguments.")] = {}
    cpu_bind: Annotated[
        list[str],
        doc(
            "VLLM_CPU_OMP_THREADS_BIND per replica in rank order (CPU build only): 'nobind', 'auto', or one core list per tensor-parallel rank, '|'-separated (e.g. '0|1' for tensor_parallel_size 2); empty: 'nobind' (no core named by two engines: the OS spreads every engine's workers over the cores; the ranks of a tensor-parallel replica then share the actor's OpenMP threads, one each at least, instead of one per core each)."
        ),
    ] = []
    resources: Annotated[
        dict[str, float],
        doc(
            "Custom Ray resources each standalone replica needs (e.g. {node_b = 1}: only nodes started with 'ray start --resources' offering them take replicas); GPU configs reserve them in each replica's placement bundle."
        ),
    ] = {}
    placement_strategy: Annotated[
        Literal["PACK", "SPREAD", "STRICT_SPREAD"],
        doc(
            "GPU configs: how the standalone replicas' placement group lays their bundles over the nodes ('SPREAD': over as many nodes as it can, so a lost node takes few; 'PACK': on as few as it can; 'STRICT_SPREAD': one per node). The trainer's GPUs are always on one node (STRICT_PACK)."
        ),
    ] = "SPREAD"
    report_window_s: Annotated[
        float,
        doc(
            "Relays fold the per-sample facts (a sample begun, resumed, cut, ended; a weight load) of the replicas behind them into one report per this many seconds, so the coordinator handles one message per window instead of one per sample; each fact waits at most this long. 0: only the facts of one sample's end travel together (no wait).",
            ge=0,
            le=1.0,
        ),
    ] = 0.01
    report_max_events: Annotated[
        PosInt,
        doc(
            "A relay's report holds at most this many facts (a fuller window is sent at once); 1 folds nothing: every fact reaches the coordinator alone."
        ),
    ] = 512
