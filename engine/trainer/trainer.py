"""``Trainer``: the torch side — an HF causal LM, AdamW, one optimizer step per mini-batch,
weights published as a safetensors blob.

Invariants: ``version`` counts publishes (0 = the weights the run started from, which the
replicas also start from); a sample's staleness at a step is ``version - min(versions)``;
each ``train_step`` is exactly one optimizer step on the samples it is given. With
``objective = "decoupled"`` the proximal log-probs of a step are those of the weights of
the last publish (the start of the sync cycle): the live weights at the cycle's first
step, a host copy taken then for its later steps (``parameter_sync_step > 1``). The user's
own loss plugs in by ``"module:function"`` as ``loss_fn(LossInput) -> (loss, stats)``
(``shunter.engine.trainer.loss``); when it fails, ``train_step`` raises ``UserCodeError`` before any
optimizer step.

Checkpoints: ``save(path)`` writes ``path/model`` (an HF model folder — weights, config and
the tokenizer files of the original model — that replicas can serve directly, gathered from the
shards) and the trainer's state by torch Distributed Checkpoint (model, optimizer, each rank's
RNG, step and version: ``engine.trainer.shards``), which loads at any world size;
``Trainer(..., init_from=path)`` continues from it (or from the one-process format before it);
the reference model for the KL term always comes from the original model.

A trainer of several ranks (``group``, a ``RankGroup`` of ``trainer.world_size``) is one of
these per rank, each holding its shards of the model (``engine.trainer.fsdp``) and taking every
call here together with the others (``train_step``, ``publish``, ``save`` are collectives).

The ``Trainer`` holds the model, its frozen reference and the optimizer, and does what touches
only those: it builds them, saves and loads them in checkpoints (with the step, version and
RNG) and moves their tensors off the GPU and back (a hybrid replica's turn on the GPU; the
parameters are back in one flat buffer after an ``onload`` of ``params``, so a publish casts
them with one copy). Its parts: ``counters``
(``TrainerCounters``: step, version, steps since the last publish — the one table all share),
and, built in ``setup`` from the model, the optimizer and the config, ``stepper`` (``Stepper``,
``shunter.engine.trainer.step``: the optimizer steps) and ``weights`` (``WeightPublisher``,
``shunter.engine.trainer.publish``: the publishes and the weight groups). Their public methods and
figures that callers use (``TrainerHost``'s core protocol) are passed through.
"""

from __future__ import annotations

from pathlib import Path

import torch

from shunter.engine.config.trainer import TrainerConfig
from shunter.engine.trainer.counters import TrainerCounters
from shunter.engine.trainer.publish import WeightPublisher, open_transport
from shunter.engine.trainer.rank_group import RankGroup
from shunter.engine.trainer.scoring import TokenScorer
from shunter.engine.trainer.step import Stepper
from shunter.engine.weights import transport as weight_transport
from shunter.events import Sample


class ModelDirError(ValueError):
    """The model directory is missing or does not hold a loadable HF model."""


def load_causal_lm(model_dir: str, device: str):
    from transformers import AutoModelForCausalLM

    p = Path(model_dir)
    if not (p / "config.json").is_file():
        raise ModelDirError(f"model dir {model_dir!r} has no config.json (missing or not an HF model folder)")
    try:
        return AutoModelForCausalLM.from_pretrained(str(p), dtype=torch.float32).to(device)
    except Exception as e:  # noqa: BLE001 - name the folder and the cause
        raise ModelDirError(f"model dir {model_dir!r} does not load: {type(e).__name__}: {e}") from e


def _model_dir(path: str) -> str:
    """``path`` when it holds an HF model's config, else ``ModelDirError`` naming it."""
    if not (Path(path) / "config.json").is_file():
        raise ModelDirError(f"model dir {path!r} has no config.json (missing or not an HF model folder)")
    return path


class Trainer:
    def __init__(
        self,
        cfg: TrainerConfig,
        model_dir: str,
        *,
        seed: int = 0,
        pad_token_id: int = 0,
        temperature: float = 1.0,
        init_from: str = "",
        group: RankGroup | None = None,
    ) -> None:
        self.cfg = cfg
        self.group = group or RankGroup()  # the trainer ranks this one trains with (one: no sharding)
        self.model_dir = model_dir
        self.init_from = init_from
        self.seed = seed
        self.pad_token_id = pad_token_id
        # the rollout samples from softmax(logits / T) and reports those log-probs; the
        # trainer must score the same distribution or the PPO ratio is off by the temperature
        self.temperature = temperature if temperature > 0 else 1.0
        self.counters = TrainerCounters()
        self.device = "cpu"
        self.model = None  # the trained HF LM (its parameters: this rank's shards when sharded)
        self.scorer: TokenScorer | None = None  # the LM as the module the step differentiates (the FSDP root)
        self.ref: TokenScorer | None = None
        self.opt = None
        self.amp = False  # bf16 autocast (fp32 master weights and optimizer state)
        self.weight_host = "127.0.0.1"  # the address replicas reach this trainer's weight groups at
        self.stepper: Stepper | None = None
        self.weights: WeightPublisher | None = None

    def setup(self) -> None:
        torch.manual_seed(self.seed)
        torch.set_num_threads(self.cfg.num_threads)
        dev = self.cfg.device
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if dev == "auto" else dev
        cuda = self.device.startswith("cuda")
        self.amp = self.cfg.precision == "bf16" or (self.cfg.precision == "auto" and cuda)
        transport, flat, sender = open_transport(self.cfg, self.device, self.weight_host)
        start = str(Path(self.init_from) / "model") if self.init_from else self.model_dir
        if self.group.sharded:
            from shunter.engine.trainer import fsdp

            shard = dict(temperature=self.temperature, bf16=self.amp, checkpointing=self.cfg.activation_checkpointing)
            self.scorer = fsdp.build(_model_dir(start), self.group, self.device, **shard)
            if self.cfg.kl_coef > 0:
                self.ref = fsdp.build(_model_dir(self.model_dir), self.group, self.device, **shard, trainable=False)
        else:
            lm = load_causal_lm(start, self.device)
            lm.train()
            if self.cfg.activation_checkpointing:
                lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            weight_transport.flatten_module(lm)  # a publish casts the weights with one copy
            self.scorer = TokenScorer(lm, temperature=self.temperature, amp=self.amp)
            if self.cfg.kl_coef > 0:
                ref = load_causal_lm(self.model_dir, self.device).eval().requires_grad_(False)
                self.ref = TokenScorer(ref, temperature=self.temperature, amp=self.amp)
        self.model = self.scorer.lm
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)
        if self.init_from:
            self._load_state(Path(self.init_from))
        self.stepper = Stepper(
            self.cfg,
            self.counters,
            self.scorer,
            self.ref,
            self.opt,
            device=self.device,
            pad_token_id=self.pad_token_id,
            group=self.group,
        )
        self.weights = WeightPublisher(
            self.model,
            self.counters,
            transport,
            flat,
            sender,
            device=self.device,
            amp=self.amp,
            group=self.group,
            bucket_bytes=int(self.cfg.weight_bucket_mb * (1 << 20)),
        )

    # -- the parts' methods and figures, passed through --------------------------------------
    @property
    def step(self) -> int:
        return self.counters.step

    @property
    def version(self) -> int:
        return self.counters.version

    def collate(self, samples: list[Sample]) -> dict[str, torch.Tensor]:
        return self.stepper.collate(samples)

    def train_step(self, samples: list[Sample], loss_fn: str = "") -> dict[str, float]:
        return self.stepper.train_step(samples, loss_fn)

    @property
    def transport(self) -> str:
        return self.weights.transport

    @property
    def published_nbytes(self) -> int:
        return self.weights.published_nbytes

    @property
    def last_publish(self) -> dict[str, float]:
        return self.weights.last_publish

    def publish(self) -> bytes:
        if self.group.sharded:  # gathered from the shards as they are (FSDP keeps the root's after a forward)
            from shunter.engine.trainer import fsdp

            fsdp.reshard(self.scorer)
        return self.weights.publish()

    def open_weight_group(self, replica_id: str) -> tuple[str, int]:
        return self.weights.open_weight_group(replica_id)

    def send_weights(self, replica_id: str, version: int) -> dict:
        return self.weights.send_weights(replica_id, version)

    def drop_weight_group(self, replica_id: str) -> None:
        self.weights.drop_weight_group(replica_id)

    # -- checkpoints -----------------------------------------------------------------------
    def save(self, path: str) -> int:
        """Write the trainer's part of a checkpoint under ``path`` (``engine.trainer.shards``:
        model and optimizer by torch Distributed Checkpoint, each rank its shards, loadable at
        any world size; the HF folder a replica serves, gathered); returns bytes written. A
        collective on a sharded trainer: every rank calls it."""
        from shunter.engine.trainer import fsdp, shards

        root = Path(path)
        if self.group.sharded:
            fsdp.reshard(self.scorer)
        shards.write_hf_folder(root / "model", self.model, self.model_dir)
        return shards.save_state(
            root,
            self.model,
            self.opt,
            step=self.counters.step,
            version=self.counters.version,
            model_dir=self.model_dir,
        )

    def _load_state(self, path: Path) -> None:
        """Model, optimizer, step, version and RNG from the checkpoint at ``path`` (any world
        size, this format or the one-process one before it)."""
        from shunter.engine.trainer import shards

        try:
            self.counters.step, self.counters.version = shards.load_state(path, self.model, self.opt)
        except Exception as e:  # noqa: BLE001 - name the checkpoint and the cause
            raise ModelDirError(f"trainer state in {str(path)!r} does not load: {type(e).__name__}: {e}") from e

    # -- the model and optimizer off the GPU and back --------------------------------------
    def offload(self, parts: list[str]) -> int:
        return self._move(parts, "cpu")

    def onload(self, parts: list[str]) -> int:
        moved = self._move(parts, self.device)
        if "params" in parts and not self.group.sharded:
            weight_transport.flatten_module(self.model)  # back in one flat buffer
        return moved

    def _move(self, parts: list[str], device: str) -> int:
        """Move optimizer state / params / grads; returns bytes that changed device."""
        if self.group.sharded:
            return self._move_shards(parts, torch.device(device))
        moved = 0
        tensors: list[torch.Tensor] = []
        if "optimizer" in parts:
            tensors += [v for st in self.opt.state.values() for v in st.values() if torch.is_tensor(v)]
        if "params" in parts:
            tensors += [p.data for p in self.model.parameters()]
        if "grads" in parts:
            tensors += [p.grad for p in self.model.parameters() if p.grad is not None]
        target = torch.device(device)
        for t in tensors:
            if t.device.type != target.type:
                moved += t.numel() * t.element_size()
                if target.type == "cpu" and torch.cuda.is_available():  # pinned, so the copy runs at full bandwidth
                    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                    host.copy_(t.data, non_blocking=True)
                    t.data = host
                else:
                    t.data = t.data.to(target, non_blocking=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            if target.type == "cpu":
                torch.cuda.empty_cache()  # give the freed blocks back, so vLLM can wake into them
        return moved

    def _move_shards(self, parts: list[str], target: torch.device) -> int:
        """A sharded trainer's ``_move``, this rank's shards only: the parameters (and their
        gradients with them) by ``Module.to``, which FSDP2 follows — it re-registers its sharded
        parameters on the new device (verl offloads its FSDP2 models this way) — and the
        optimizer's state tensors replaced by moved copies. Returns bytes that changed device."""
        from shunter.engine.trainer import fsdp

        def nbytes(t: torch.Tensor) -> int:
            t = t.to_local() if hasattr(t, "to_local") else t
            return t.numel() * t.element_size() if t.device.type != target.type else 0

        moved = 0
        if "params" in parts or "grads" in parts:
            params = list(self.model.parameters())
            moved += sum(nbytes(p) for p in params) + sum(nbytes(p.grad) for p in params if p.grad is not None)
            fsdp.reshard(self.scorer)
            self.scorer.to(target)
        if "optimizer" in parts:
            for st in self.opt.state.values():
                for k, v in st.items():
                    if torch.is_tensor(v) and v.device.type != target.type:
                        moved += nbytes(v)
                        st[k] = v.to(target, non_blocking=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            if target.type == "cpu":
                torch.cuda.empty_cache()
        return moved
