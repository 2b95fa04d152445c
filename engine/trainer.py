"""``Trainer``: the torch side — an HF causal LM, AdamW, one optimizer step per mini-batch,
weights published as a safetensors blob.

Invariants: ``version`` counts publishes (0 = the weights the run started from, which the
replicas also start from); a sample's staleness at a step is ``version - min(versions)``;
each ``train_step`` is exactly one optimizer step on the samples it is given. With
``objective = "decoupled"`` the proximal log-probs of a step are those of the weights of
the last publish (the start of the sync cycle): the live weights at the cycle's first
step, a host copy taken then for its later steps (``parameter_sync_step > 1``). The user's
own loss plugs in by ``"module:function"`` as ``loss_fn(LossInput) -> (loss, stats)``
(``shunter.engine.loss``); when it fails, ``train_step`` raises ``UserCodeError`` before any
optimizer step.

Checkpoints: ``save(path)`` writes ``path/model`` (an HF model folder — weights, config and
the tokenizer files of the original model — that replicas can serve directly) and
``path/trainer.pt`` (optimizer state, step, version, RNG; loaded with
``weights_only=True``, nothing is unpickled). ``Trainer(..., init_from=path)`` continues
from them; the reference model for the KL term always comes from the original model.
"""

from __future__ import annotations

import itertools
import shutil
import time
from pathlib import Path

import torch

from shunter.engine import rl, weight_transport
from shunter.engine.batch_stats import batch_metrics
from shunter.engine.config import TrainerConfig
from shunter.engine.loss import LossFn, LossInput, call_loss, load_loss
from shunter.events import Sample


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


_HEAD_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def _plain_head(model) -> tuple[torch.nn.Linear | None, torch.nn.Module | None]:
    """(output head, decoder body) when the logits are exactly ``head(body(...))``, else
    (None, None)."""
    cfg = getattr(model, "config", None)
    if any(getattr(cfg, k, None) not in (None, 1, 1.0) for k in _HEAD_TRANSFORMS):
        return None, None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    body = model.get_decoder() if hasattr(model, "get_decoder") else None
    if not isinstance(head, torch.nn.Linear) or body is None or body is model:
        return None, None
    return head, body


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in host memory (pinned when ``t`` is on a GPU, for fast copies back)."""
    out = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=t.is_cuda)
    out.copy_(t.detach(), non_blocking=t.is_cuda)
    if t.is_cuda:
        torch.cuda.current_stream(t.device).synchronize()
    return out


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
            from shunter.engine.weight_group import WeightSender

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

    # -- one optimizer step --------------------------------------------------------------
    def collate(self, samples: list[Sample]) -> dict[str, torch.Tensor]:
        rows = [s.prompt_token_ids + s.token_ids for s in samples]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width - 1))
        old = torch.zeros((len(rows), width - 1))
        versions = torch.full((len(rows), width - 1), -1, dtype=torch.long)
        for i, (s, row) in enumerate(zip(samples, rows, strict=True)):
            ids[i, : len(row)] = torch.tensor(row)
            attn[i, : len(row)] = 1
            p, n = len(s.prompt_token_ids), len(s.token_ids)
            # logits at t predict token t+1; an environment's observation tokens are context only
            mask[i, p - 1 : p - 1 + n] = torch.tensor(s.loss_mask, dtype=torch.float32) if s.loss_mask else 1
            old[i, p - 1 : p - 1 + n] = torch.tensor(s.logprobs, dtype=torch.float32)
            versions[i, p - 1 : p - 1 + n] = torch.tensor(s.versions, dtype=torch.long)
        dev = self.device
        return {
            "ids": ids.to(dev),
            "attn": attn.to(dev),
            "mask": mask.to(dev),
            "old": old.to(dev),
            "versions": versions.to(dev),
            "rewards": torch.tensor([s.reward for s in samples], dtype=torch.float32, device=dev),
            "group_ids": torch.tensor([s.group_id for s in samples], dtype=torch.long, device=dev),
        }

    def _logp(self, model, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """Log-probs of the response tokens, [B, T-1] fp32; 0 outside ``b["mask"]``.

        Only the masked positions go through the output head, in chunks
        (``rl.head_logprobs``): full [B, T, V] logits of a 150k vocabulary would take tens of
        GiB at long response lengths. Models whose head does more than a linear map (logit
        soft-capping or scaling) take the plain path over the full logits."""
        targets = b["ids"][:, 1:]
        with torch.autocast(device_type=torch.device(self.device).type, dtype=torch.bfloat16, enabled=self.amp):
            head, body = _plain_head(model)
            if head is None:
                logits = model(input_ids=b["ids"], attention_mask=b["attn"]).logits[:, :-1]
                return rl.token_logprobs(logits.float() / self.temperature, targets) * b["mask"]
            hidden = body(input_ids=b["ids"], attention_mask=b["attn"]).last_hidden_state[:, :-1]
            sel = b["mask"].bool()
            lp = rl.head_logprobs(hidden[sel], head.weight, head.bias, targets[sel], 1.0 / self.temperature)
        return torch.zeros_like(b["mask"]).index_put((sel.nonzero(as_tuple=True)), lp)

    def _loss(self, b: dict[str, torch.Tensor], adv: torch.Tensor, user: tuple[LossFn, str] | None, share: float):
        adv_tok = adv[:, None].expand_as(b["mask"])
        logp = self._logp(self.model, b)
        ref_logp = None
        if self.ref is not None:
            with torch.no_grad():
                ref_logp = self._logp(self.ref, b)
        if user is not None:
            fn, spec = user
            inp = LossInput(
                logp=logp,
                old_logp=b["old"],
                advantages=adv_tok,
                mask=b["mask"],
                rewards=b["rewards"],
                group_ids=b["group_ids"],
                versions=b["versions"],
                ref_logp=ref_logp,
                trainer_version=self.version,
                token_share=share,
                cfg=self.cfg,
            )
            return call_loss(fn, spec, inp)
        c = self.cfg
        band = {"mis": c.mis, "mis_low": c.mis_low, "mis_high": c.mis_high}
        if c.objective == "decoupled":
            weight, keep, is_stats = rl.behaviour_correction(
                b["prox"] - b["old"], b["mask"], tis=c.tis, tis_cap=c.tis_cap, **band
            )
            loss, stats = rl.ppo_clip_loss(
                logp, b["prox"], adv_tok, b["mask"], clip=c.clip_ratio, weight=weight, keep=keep
            )
        else:  # bypass: the PPO ratio already is pi_theta / mu; MIS may still drop tokens
            _, keep, is_stats = rl.behaviour_correction(logp.detach() - b["old"], b["mask"], tis="off", **band)
            loss, stats = rl.ppo_clip_loss(logp, b["old"], adv_tok, b["mask"], clip=c.clip_ratio, keep=keep)
        stats.update(is_stats)
        if ref_logp is not None:
            kl = rl.masked_mean(rl.kl_k3(logp, ref_logp), b["mask"])
            loss = loss + c.kl_coef * kl
            stats["kl"] = float(kl.detach())
        return loss, stats

    @torch.no_grad()
    def _prox_logps(self, batches: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """Decoupled PPO: log-probs under the weights of the last publish (module docstring)."""
        if self.steps_since_publish == 0:
            if self.cfg.parameter_sync_step > 1:  # later steps of this cycle need these weights
                self._prox_host = {n: _host_copy(p) for n, p in self.model.named_parameters()}
            return [self._logp(self.model, b) for b in batches]
        if self._prox_host is None:
            raise RuntimeError(
                f"decoupled PPO: step {self.step + 1} is {self.steps_since_publish} steps after the "
                "last publish but no proximal weights were kept (trainer.parameter_sync_step = "
                f"{self.cfg.parameter_sync_step}; is something publishing less often?)"
            )
        params = dict(self.model.named_parameters())
        live = {n: p.data for n, p in params.items()}
        try:
            for n, p in params.items():
                p.data = self._prox_host[n].to(p.device, non_blocking=True)
            return [self._logp(self.model, b) for b in batches]
        finally:
            for n, p in params.items():
                p.data = live[n]

    def train_step(self, samples: list[Sample], loss_fn: str = "") -> dict[str, float]:
        """One optimizer step. The batch is cut into micro-batches of
        ``trainer.micro_batch_size`` samples (gradients accumulate); each micro-batch's
        token-mean loss is weighted by its share of the tokens, so the step equals the
        whole-batch token-mean step. Advantages are computed over the whole batch.
        ``loss_fn``: a user loss ``"module:function"`` (empty: the built-in objective); if it
        fails, ``UserCodeError`` is raised and no optimizer step is taken."""
        if not samples:
            raise ValueError("train_step needs at least one sample")
        user = (self._user_loss(loss_fn), loss_fn) if loss_fn else None
        t0 = time.perf_counter()
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
        adv = rl.group_advantages(rewards, [s.group_id for s in samples]).to(self.device)
        size = self.cfg.micro_batch_size or len(samples)
        total = max(1, sum(s.trained_tokens for s in samples))
        chunks = [
            (
                self.collate(samples[i : i + size]),
                adv[i : i + size],
                max(1, sum(s.trained_tokens for s in samples[i : i + size])) / total,
            )
            for i in range(0, len(samples), size)
        ]
        if self.cfg.objective == "decoupled" and user is None:
            for (b, _, _), prox in zip(chunks, self._prox_logps([b for b, _, _ in chunks]), strict=True):
                b["prox"] = prox
        self.opt.zero_grad(set_to_none=True)
        loss_sum, stats_sum = 0.0, {}
        for b, a, w in chunks:
            loss, stats = self._loss(b, a, user, w)
            (loss * w).backward()
            loss_sum += float(loss.detach()) * w
            for k, v in stats.items():  # maxima and minima over micro-batches, token-weighted means else
                v = float(v)
                if k.endswith("_max"):
                    stats_sum[k] = max(stats_sum.get(k, v), v)
                elif k.endswith("_min"):
                    stats_sum[k] = min(stats_sum.get(k, v), v)
                else:
                    stats_sum[k] = stats_sum.get(k, 0.0) + v * w
        stats, loss = stats_sum, torch.tensor(loss_sum)
        clip = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip))
        self.opt.step()
        if self.device.startswith("cuda"):  # the step's time holds its optimizer kernels, not the next publish's
            torch.cuda.synchronize(self.device)
        self.step += 1
        self.steps_since_publish += 1
        lens = [len(s.token_ids) for s in samples]
        out = {f"trainer/{k}": float(v) for k, v in stats.items()}
        out.update(
            {
                "trainer/loss": float(loss.detach()),
                "trainer/grad_norm": grad_norm,
                "trainer/step_s": time.perf_counter() - t0,
                "trainer/tokens": float(sum(lens)),
            }
        )
        out.update(batch_metrics(samples, self.version))
        return out

    def _user_loss(self, spec: str) -> LossFn:
        """The user's loss by spec, imported once per spec (a failed import is retried next time)."""
        cache = self.__dict__.setdefault("_losses", {})
        if spec not in cache:
            cache[spec] = load_loss(spec)
        return cache[spec]

    # -- weights ---------------------------------------------------------------------------
    @property
    def publish_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.amp else torch.float32

    def publish(self) -> bytes:
        """Bump the version and return the weights' payload (HF names): a safetensors blob,
        or a CUDA IPC package (ours or vLLM's format) for replicas on the trainer's GPU
        (``weight_transport``)."""
        t0 = time.perf_counter()
        items, source = self._publish_items()
        t1 = time.perf_counter()
        dtype = self.publish_dtype
        self.published_nbytes = sum(t.numel() for _, t in items) * dtype.itemsize
        if self._publisher is not None:
            wire = self.transport
            if wire in weight_transport.COLLECTIVE_TRANSPORTS:  # hybrid replicas on this GPU map the handle
                wire = weight_transport.CUDA_IPC if self.device.startswith("cuda") else weight_transport.FLAT
            blob = self._publisher.publish(items, dtype, wire=wire, version=self.version + 1, source=source)
            self.last_publish = {"items_s": t1 - t0, **self._publisher.last}
        else:
            blob = weight_transport.to_safetensors(items, dtype)
            self.last_publish = {"items_s": t1 - t0, "pack_s": time.perf_counter() - t1}
        self.version += 1
        self.steps_since_publish = 0
        return blob

    def _publish_items(self) -> tuple[list[tuple[str, torch.Tensor]], torch.Tensor | None]:
        """``unique_tensors(state_dict())`` and the flat tensor they lie in (None: they do not),
        kept while every parameter and buffer keeps its memory (checked by address: an
        offload, onload or any ``.data`` swap changes it) — the state dict alone costs ~2 ms a
        publish for a 0.5B model on an H200."""
        key = tuple(t.data_ptr() for t in itertools.chain(self.model.parameters(), self.model.buffers()))
        cached = self._items_cache
        if cached is None or cached[0] != key:
            items = weight_transport.unique_tensors(self.model.state_dict())
            cached = self._items_cache = (key, items, weight_transport.flat_source(items))
        return cached[1], cached[2]

    def _sender(self):
        if self.sender is None:
            raise RuntimeError(f"trainer.weight_transport = {self.transport!r} has no weight groups (nccl / gloo do)")
        return self.sender

    def open_weight_group(self, replica_id: str) -> tuple[str, int]:
        """Open ``replica_id``'s weight group as rank 0; the replica joins at (host, port)."""
        return self._sender().open(replica_id)

    def send_weights(self, replica_id: str, version: int) -> dict:
        """Broadcast the flat copy of ``version`` to ``replica_id`` (it receives concurrently)."""
        return self._sender().send(replica_id, version)

    def drop_weight_group(self, replica_id: str) -> None:
        if self.sender is not None:
            self.sender.drop(replica_id)

    def offload(self, parts: list[str]) -> int:
        return self._move(parts, "cpu")

    def onload(self, parts: list[str]) -> int:
        moved = self._move(parts, self.device)
        if "params" in parts:
            weight_transport.flatten_module(self.model)  # back in one flat buffer
        return moved

    def _move(self, parts: list[str], device: str) -> int:
        """Move optimizer state / params / grads; returns bytes that changed device."""
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
