"""The simulator's cost model (:class:`CostModel`, the ``[cost]`` block of a scenario file) and the
response lengths it draws (:class:`LengthSampler`).

Invariants: every field is a stated term of a closed form, no hidden constant; every length is
drawn from a generator seeded by the caller, so a scenario replays identically.

Trainer: an optimizer step on ``t`` tokens over ``trainer_gpus`` data-parallel GPUs takes
``train_step_s + train_s_per_token * t / trainer_gpus`` plus a ring all-reduce of
``grad_bytes`` (``2 (g - 1) / g * grad_bytes / allreduce_Bps``). The real trainer it stands for
is shunter's own at ``trainer.world_size = trainer_gpus`` (``engine/trainer/fsdp.py``: FSDP2, each
rank its token-balanced share of the mini-batch, so the compute term divides by ``g``). FSDP2
moves more than a DDP all-reduce: the parameters all-gathered in the forward and again in the
backward and the gradients reduce-scattered, ``3 (g - 1) / g`` of the model's bytes when
parameters and gradients share a dtype — 1.5x the all-reduce term — most of it overlapped with
compute by FSDP2's prefetching; a scenario modelling it sets ``grad_bytes`` to what its steps
expose. Not calibrated against the sharded trainer: no GPU was lent to measure it on (as of
2026-12-07); each scenario file states its trainer terms. Publishing takes
``weight_bytes / sync_bandwidth_Bps + sync_latency_s + sync_s_per_replica * replicas +
sync_s_per_relay * relays`` (the standalone replicas; hybrid ones share the trainer's GPUs and
map its buffer; a transport that sends to each replica in turn costs the trainer more the more
replicas there are; 0 for one that publishes once and lets replicas fetch — the trainer then
hands the version to each host's relay, ``sync_s_per_relay`` a host); a replica applies weights in
``load_s``, sleeps in ``sleep_s``, wakes in ``wake_s``. A replica's decode and prefill terms are
read by ``shunter.bench.sim.replica_model`` (its ``ReplicaCost``). Response lengths are lognormal
(``length_median``, ``length_sigma``), capped by the token budget, or drawn from a file of lengths.
"""

from __future__ import annotations

import math
import random

import msgspec

from shunter.engine.replica import lengths


class CostModel(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    prompt_tokens: int = 256
    prefill_s_per_token: float = 2e-6
    prefill_s_per_token_ctx: float = 0.0
    """Prefill attention: a token at position ``c`` costs ``c`` times this on top."""
    prefill_chunk_tokens: int = 8192
    """Prefill tokens one decode step carries at most (vLLM's ``max_num_batched_tokens``)."""
    decode_step_s: float = 0.02
    decode_step_s_per_seq: float = 1e-4
    decode_s_per_kv_token: float = 0.0
    """Decode attention: seconds per step per token of context of every running sequence."""
    kv_tokens: int = 0
    """KV-cache capacity of one replica in tokens (0: unlimited)."""
    length_median: float = 1000.0
    length_sigma: float = 0.8
    lengths_file: str = ""
    train_step_s: float = 0.5
    train_s_per_token: float = 2e-6
    """Seconds per token of one GPU (divided over ``trainer_gpus``)."""
    trainer_gpus: int = 1
    grad_bytes: float = 0.0
    """Bytes all-reduced per optimizer step across the trainer's GPUs (0: none)."""
    allreduce_Bps: float = 100e9
    weight_bytes: float = 15e9
    sync_bandwidth_Bps: float = 50e9
    sync_latency_s: float = 0.05
    sync_s_per_replica: float = 0.0
    sync_s_per_relay: float = 0.0
    """The trainer's cost of handing a new version to one host's relay (one call per host: the
    replicas behind it read the one published copy); paid when the replicas sit behind relays."""
    load_s: float = 0.05
    sleep_s: float = 0.5
    wake_s: float = 0.5
    offload_s: float = 0.2
    tool_calls_max: int = 0
    """Tool calls per trajectory, drawn uniformly from 0..this (0: single-turn samples); each
    turn's length is then drawn as a response's is (``length_median`` / ``length_sigma``, or
    the lengths file)."""
    observation_tokens: int = 64
    """Tokens a tool's answer appends (masked out of the loss; prefilled, never decoded)."""
    env_latency_median_s: float = 2.0
    env_latency_sigma: float = 1.0
    """A tool call's latency: lognormal (median, sigma) — long-tailed — capped at ``env_latency_max_s``."""
    env_latency_max_s: float = 300.0

    def step_s(self, batch: int) -> float:
        """A decode step of ``batch`` sequences, context not counted."""
        return self.decode_step_s + self.decode_step_s_per_seq * batch

    def allreduce_s(self) -> float:
        g = self.trainer_gpus
        return 2 * (g - 1) / g * self.grad_bytes / self.allreduce_Bps if g > 1 and self.grad_bytes else 0.0

    def train_s(self, tokens: int) -> float:
        return self.train_step_s + self.train_s_per_token * tokens / self.trainer_gpus + self.allreduce_s()

    def publish_s(self, replicas: int = 0, relays: int = 0) -> float:
        return (
            self.weight_bytes / self.sync_bandwidth_Bps
            + self.sync_latency_s
            + self.sync_s_per_replica * replicas
            + self.sync_s_per_relay * relays
        )

    def lengths(self, seed: int) -> LengthSampler:
        return LengthSampler(self, seed)


class LengthSampler:
    """Seeded response lengths: lognormal, or uniform over the lengths in a file."""

    def __init__(self, cost: CostModel, seed: int) -> None:
        self.rng = random.Random(seed)
        self.cost = cost
        # the engine's length-file format (shunter.engine.replica.lengths): positive integers, '#' comments
        self.table = list(lengths.read_lengths(cost.lengths_file)) if cost.lengths_file else []

    def draw(self, rng: random.Random | None = None) -> int:
        r = rng or self.rng
        if self.table:
            return max(1, r.choice(self.table))
        mu = math.log(self.cost.length_median)
        return max(1, int(r.lognormvariate(mu, self.cost.length_sigma)))
