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
the tokenizer files of the original model — that replicas can serve directly) and
``path/trainer.pt`` (optimizer state, step, version, RNG; loaded with
``weights_only=True``, nothing is unpickled). ``Trainer(..., init_from=path)`` continues
from them; the reference model for the KL term always comes from the original model.

The ``Trainer``'s methods are in three modules: this one builds it (model, optimizer, weight
transport) and saves and loads its checkpoints; ``trainer_step`` takes one optimizer step;
``trainer_weights`` publishes its weights, serves the weight groups and offloads to the host. The
other two are mixins of ``Trainer``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from shunter.engine.config.trainer import TrainerConfig
from shunter.engine.trainer.publish import TrainerWeights
from shunter.engine.trainer.step import TrainerStep
from shunter.engine.weights import transport as weight_transport


def state_dict_to_blob(state_dict: dict, dtype: torch.dtype | None = None) -> bytes:
    """An HF-named state dict as safetensors bytes (tied tensors written once, under the
    first name; the replica side restores the tie)."""
    return weight_transport.to_safetensors(weight_transport.unique_tensors(state_dict), dtype)


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


class Trainer(TrainerStep, TrainerWeights):
    def __init__(
        self,
        cfg: TrainerConfig,
        model_dir: str,
        *,
        seed: int = 0,
        pad_token_id: int = 0,
        temperature: float = 1.0,
        init_from: str = "",
    ) -> None:
        self.cfg = cfg
        self.model_dir = model_dir
        self.init_from = init_from
        self.seed = seed
        self.pad_token_id = pad_token_id
        # the rollout samples from softmax(logits / T) and reports those log-probs; the
        # trainer must score the same distribution or the PPO ratio is off by the temperature
        self.temperature = temperature if temperature > 0 else 1.0
        self.version = 0
        self.step = 0
        self.device = "cpu"
        self.model = None
        self.ref = None
        self.opt = None
        self.amp = False  # bf16 autocast (fp32 master weights and optimizer state)
        self.transport = weight_transport.SAFETENSORS
        self._publisher: weight_transport.FlatPublisher | None = None
        self.sender = None  # engine.weight_group.WeightSender for the nccl / gloo transports
        self.weight_host = "127.0.0.1"  # the address replicas reach this trainer's weight groups at
        self.published_nbytes = 0  # bytes of the weights last published (a cuda_ipc payload is only handles)
        self.last_publish: dict[str, float] = {}  # seconds the last publish spent, by part (WeightsReady.detail)
        self.steps_since_publish = 0
        self._items_cache: tuple[tuple[int, ...], list[tuple[str, torch.Tensor]], torch.Tensor | None] | None = None
        self._prox_host: dict[str, torch.Tensor] | None = None  # decoupled PPO: the cycle's proximal weights

    def setup(self) -> None:
        torch.manual_seed(self.seed)
        torch.set_num_threads(self.cfg.num_threads)
        dev = self.cfg.device
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if dev == "auto" else dev
        cuda = self.device.startswith("cuda")
        self.amp = self.cfg.precision == "bf16" or (self.cfg.precision == "auto" and cuda)
        wt = self.cfg.weight_transport
        self.transport = (weight_transport.CUDA_IPC if cuda else weight_transport.SAFETENSORS) if wt == "auto" else wt
        if self.transport in weight_transport.IPC_TRANSPORTS:
            if not cuda:
                raise ValueError(
                    f"trainer.weight_transport = {self.transport!r} needs a cuda device, "
                    f"the trainer is on {self.device}"
                )
            self._publisher = weight_transport.FlatPublisher()
        elif self.transport in weight_transport.COLLECTIVE_TRANSPORTS:
            if self.transport == weight_transport.NCCL and not cuda:
                raise ValueError(
                    f"trainer.weight_transport = 'nccl' needs a cuda device, the trainer is on {self.device}"
                )
            from shunter.engine.weights.group import WeightSender

            self._publisher = weight_transport.FlatPublisher()
            self.sender = WeightSender(
                self.transport,
                self._publisher,
                host=self.weight_host,
                bucket_bytes=int(self.cfg.weight_bucket_mb * (1 << 20)),
                timeout_s=self.cfg.weight_group_timeout_s,
                device=torch.device(self.device) if cuda else None,
            )
        start = str(Path(self.init_from) / "model") if self.init_from else self.model_dir
        self.model = load_causal_lm(start, self.device)
        self.model.train()
        weight_transport.flatten_module(self.model)  # a publish casts the weights with one copy
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)
        if self.cfg.kl_coef > 0:
            self.ref = load_causal_lm(self.model_dir, self.device).eval().requires_grad_(False)
        if self.init_from:
            self._load_state(Path(self.init_from) / "trainer.pt")

    # -- checkpoints -----------------------------------------------------------------------
    def save(self, path: str) -> int:
        """Write the trainer's part of a checkpoint under ``path``; returns bytes written."""
        root = Path(path)
        self.model.save_pretrained(root / "model", safe_serialization=True)
        for f in Path(self.model_dir).iterdir():  # tokenizer and friends, as the original model had them
            if (
                f.is_file()
                and not (root / "model" / f.name).exists()
                and f.suffix not in (".safetensors", ".bin", ".pt")
            ):
                shutil.copy2(f, root / "model" / f.name)
        torch.save(
            {
                "optimizer": self.opt.state_dict(),
                "step": self.step,
                "version": self.version,
                "rng": torch.get_rng_state(),
            },
            root / "trainer.pt",
        )
        return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())

    def _load_state(self, path: Path) -> None:
        try:
            st = torch.load(path, map_location=self.device, weights_only=True)
            self.opt.load_state_dict(st["optimizer"])
            self.step, self.version = int(st["step"]), int(st["version"])
            torch.set_rng_state(st["rng"].cpu())
        except Exception as e:  # noqa: BLE001 - name the file and the cause
            raise ModelDirError(f"trainer state {str(path)!r} does not load: {type(e).__name__}: {e}") from e
