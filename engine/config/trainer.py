"""The ``[trainer]`` config section (:class:`TrainerConfig`): batch sizes, the optimizer, the
objective and its importance weights, the trainer's resources and how its weights reach replicas.

Invariant: each field is checked alone here (type and bounds, every one documented with ``doc``);
rules across fields and sections (``train_batch_size == parameter_sync_step *
ppo_mini_batch_size`` ...) live in :func:`shunter.engine.config.check`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from shunter.engine.config.base import NonNegInt, PosFloat, PosInt, Section, doc


class TrainerConfig(Section):
    ppo_mini_batch_size: Annotated[PosInt, doc("Samples per optimizer step.")] = 128
    parameter_sync_step: Annotated[PosInt, doc("Optimizer steps between weight publishes.")] = 2
    train_batch_size: Annotated[
        PosInt, doc("Samples per publish cycle; must equal parameter_sync_step * ppo_mini_batch_size.")
    ] = 256
    lr: Annotated[PosFloat, doc("AdamW learning rate.")] = 2e-4
    weight_decay: Annotated[float, doc("AdamW weight decay.", ge=0)] = 0.0
    clip_ratio: Annotated[PosFloat, doc("PPO clip range epsilon.")] = 0.2
    kl_coef: Annotated[
        float,
        doc("Weight of the KL penalty to the reference (initial) model; 0 disables it and loads no reference.", ge=0),
    ] = 0.0
    grad_clip: Annotated[float, doc("Gradient norm clip; 0 disables.", ge=0)] = 1.0
    loss_fn: Annotated[str, doc("Loss override 'module:function'; empty: built-in PPO clip in bypass mode.")] = ""
    objective: Annotated[
        Literal["bypass", "decoupled"],
        doc(
            "'bypass': the rollout's log-probs are the old policy's (PPO ratio pi_theta / mu, no extra forward pass); 'decoupled': decoupled PPO — the trust region around the proximal policy (the weights at the start of the sync cycle, kept in host memory when parameter_sync_step > 1), each token weighted by pi_prox / mu corrected by 'tis' / 'mis'."
        ),
    ] = "bypass"
    tis: Annotated[
        Literal["none", "token", "sequence"],
        doc(
            "Truncated importance sampling of the behaviour weight pi_prox / mu (decoupled only): per token or per sequence (product over its tokens), capped at tis_cap; 'none': uncapped."
        ),
    ] = "token"
    tis_cap: Annotated[PosFloat, doc("Cap of the TIS weight.")] = 5.0
    mis: Annotated[
        Literal["none", "token", "sequence"],
        doc(
            "Masked importance sampling (IcePop-style): drop tokens whose behaviour ratio (pi_prox / mu; in bypass pi_theta / mu) leaves [mis_low, mis_high], per token or per sequence (geometric mean ratio)."
        ),
    ] = "none"
    mis_low: Annotated[PosFloat, doc("Lower edge of the MIS band.")] = 0.5
    mis_high: Annotated[PosFloat, doc("Upper edge of the MIS band.")] = 2.0
    micro_batch_size: Annotated[
        NonNegInt,
        doc(
            "Samples per forward/backward pass (gradients accumulate over a mini-batch); 0: the whole mini-batch at once."
        ),
    ] = 0
    num_threads: Annotated[PosInt, doc("torch intra-op threads of the trainer.")] = 1
    resources: Annotated[
        dict[str, float],
        doc(
            "Custom Ray resources the trainer needs (e.g. {node_a = 1}: it runs on a node started with 'ray start --resources' offering them); hybrid replicas live on the trainer's node."
        ),
    ] = {}
    num_cpus: Annotated[float, doc("Ray CPUs reserved for the trainer actor.", ge=0)] = 1.0
    device: Annotated[str, doc("torch device; 'auto': cuda if available else cpu.")] = "auto"
    num_gpus: Annotated[
        float,
        doc(
            "Ray GPUs for the trainer actor (at most 1: it is one process; a fraction leaves room for hybrid replicas on its GPU); 0 on CPU machines.",
            ge=0,
            le=1,
        ),
    ] = 0.0
    gpus: Annotated[
        PosInt,
        doc(
            "GPUs on the trainer's side of the placement (GPU configs): the trainer process uses the first; hybrid replicas spread over all of them, round robin. More than 1 lets a synchronous run (colocated) generate on every GPU it trains beside."
        ),
    ] = 1
    world_size: Annotated[
        PosInt,
        doc(
            "Trainer ranks: processes (one GPU each on GPU configs) that train one model together, sharded by torch FSDP2 (fully_shard per transformer block and the root) in one torch.distributed group (nccl on cuda, gloo on cpu); each rank takes its share of a mini-batch, balanced by tokens, and the loss is normalised over the whole mini-batch, so N ranks take the same step as one process. 1: one process, no sharding."
        ),
    ] = 1
    activation_checkpointing: Annotated[
        bool,
        doc(
            "Recompute each transformer block's activations in the backward pass instead of keeping them (less memory, about one more forward pass of time); sharded trainers (world_size > 1) and world_size 1 alike."
        ),
    ] = False
    collective_timeout_s: Annotated[
        PosFloat,
        doc(
            "world_size > 1: deadline of every collective of the trainer ranks (a gather, a gradient reduction, a checkpoint); past it the rank fails with the collective named and the run restarts from its checkpoint as after any trainer death."
        ),
    ] = 300.0
    precision: Annotated[
        Literal["auto", "fp32", "bf16"],
        doc(
            "'bf16': forward/backward under bf16 autocast with fp32 master weights and optimizer state, weights published in bf16; 'auto': bf16 on cuda, fp32 on cpu."
        ),
    ] = "auto"
    weight_transport: Annotated[
        Literal["auto", "safetensors", "cuda_ipc", "vllm_ipc", "nccl", "gloo"],
        doc(
            "How published weights reach replicas: 'safetensors' (a blob through the Ray object store; any device), 'cuda_ipc' (CUDA IPC handles to the trainer's GPU copy, loaded by shunter's worker extension; replicas on the same GPU), 'vllm_ipc' (the same handles in vLLM's packed format, loaded by vLLM's own weight-transfer engine, backend 'ipc'), 'nccl' (a broadcast over an NCCL group of the trainer and each standalone replica, on other GPUs; hybrid replicas on the trainer's GPU map the cuda_ipc handles), 'gloo' (the same over gloo, CPU: the stand-in the tests run); 'auto': cuda_ipc on cuda, else safetensors."
        ),
    ] = "auto"
    weight_bucket_mb: Annotated[
        PosFloat, doc("nccl / gloo: the flat weight copy goes over the wire in buckets of at most this many MiB.")
    ] = 256.0
    weight_group_timeout_s: Annotated[
        PosFloat,
        doc(
            "nccl / gloo: deadline of every collective (joining a group, one weight broadcast); past it the group is aborted and the failure reported."
        ),
    ] = 120.0
