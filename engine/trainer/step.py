"""``Stepper``: the ``Trainer``'s optimizer steps — the batch collated into padded tensors, the
response tokens' log-probs (only the masked positions through the output head), the built-in PPO
objective or the user's loss, and the decoupled objective's proximal log-probs.

Held by ``shunter.engine.trainer.trainer.Trainer``, which builds it in ``setup`` and gives it the
trained model, its frozen reference (``None`` without a KL term), the optimizer, the device and
precision they run in, the config, the padding token, the rollout's temperature and the
trainer's ``TrainerCounters``; it keeps the decoupled objective's proximal weights and the user
losses it has imported. Invariants: each ``train_step`` is exactly one optimizer step on the
samples it is given, its micro-batches weighted by their share of the tokens so that it equals
the whole-batch token-mean step; a user loss that fails raises ``UserCodeError`` before any
optimizer step; with ``objective = "decoupled"`` the proximal log-probs are those of the weights
of the last publish (the start of the sync cycle): the live weights at the cycle's first step,
a host copy taken then for its later steps (``parameter_sync_step > 1``).
"""

from __future__ import annotations

import time

import torch

from shunter.engine.config.trainer import TrainerConfig
from shunter.engine.trainer import rl
from shunter.engine.trainer.batch_stats import batch_metrics
from shunter.engine.trainer.counters import TrainerCounters
from shunter.engine.trainer.loss import LossFn, LossInput, call_loss, load_loss
from shunter.events import Sample

_HEAD_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def plain_head(model) -> tuple[torch.nn.Linear | None, torch.nn.Module | None]:
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


class Stepper:
    def __init__(
        self,
        cfg: TrainerConfig,
        counters: TrainerCounters,
        model: torch.nn.Module,
        ref: torch.nn.Module | None,
        opt: torch.optim.Optimizer,
        *,
        device: str,
        amp: bool,
        pad_token_id: int,
        temperature: float,
    ) -> None:
        self.cfg = cfg
        self.counters = counters
        self.model = model
        self.ref = ref
        self.opt = opt
        self.device = device
        self.amp = amp  # bf16 autocast (fp32 master weights and optimizer state)
        self.pad_token_id = pad_token_id
        self.temperature = temperature
        self._prox_host: dict[str, torch.Tensor] | None = None  # decoupled PPO: the cycle's proximal weights
        self._losses: dict[str, LossFn] = {}  # the user's losses by spec

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

    def logp(self, model, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """Log-probs of the response tokens, [B, T-1] fp32; 0 outside ``b["mask"]``.

        Only the masked positions go through the output head, in chunks
        (``rl.head_logprobs``): full [B, T, V] logits of a 150k vocabulary would take tens of
        GiB at long response lengths. Models whose head does more than a linear map (logit
        soft-capping or scaling) take the plain path over the full logits."""
        targets = b["ids"][:, 1:]
        with torch.autocast(device_type=torch.device(self.device).type, dtype=torch.bfloat16, enabled=self.amp):
            head, body = plain_head(model)
            if head is None:
                logits = model(input_ids=b["ids"], attention_mask=b["attn"]).logits[:, :-1]
                return rl.token_logprobs(logits.float() / self.temperature, targets) * b["mask"]
            hidden = body(input_ids=b["ids"], attention_mask=b["attn"]).last_hidden_state[:, :-1]
            sel = b["mask"].bool()
            lp = rl.head_logprobs(hidden[sel], head.weight, head.bias, targets[sel], 1.0 / self.temperature)
        return torch.zeros_like(b["mask"]).index_put((sel.nonzero(as_tuple=True)), lp)

    def _loss(self, b: dict[str, torch.Tensor], adv: torch.Tensor, user: tuple[LossFn, str] | None, share: float):
        adv_tok = adv[:, None].expand_as(b["mask"])
        logp = self.logp(self.model, b)
        ref_logp = None
        if self.ref is not None:
            with torch.no_grad():
                ref_logp = self.logp(self.ref, b)
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
                trainer_version=self.counters.version,
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
    def prox_logps(self, batches: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """Decoupled PPO: log-probs under the weights of the last publish (module docstring)."""
        if self.counters.steps_since_publish == 0:
            if self.cfg.parameter_sync_step > 1:  # later steps of this cycle need these weights
                self._prox_host = {n: _host_copy(p) for n, p in self.model.named_parameters()}
            return [self.logp(self.model, b) for b in batches]
        if self._prox_host is None:
            raise RuntimeError(
                f"decoupled PPO: step {self.counters.step + 1} is {self.counters.steps_since_publish} steps after the "
                "last publish but no proximal weights were kept (trainer.parameter_sync_step = "
                f"{self.cfg.parameter_sync_step}; is something publishing less often?)"
            )
        params = dict(self.model.named_parameters())
        live = {n: p.data for n, p in params.items()}
        try:
            for n, p in params.items():
                p.data = self._prox_host[n].to(p.device, non_blocking=True)
            return [self.logp(self.model, b) for b in batches]
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
            for (b, _, _), prox in zip(chunks, self.prox_logps([b for b, _, _ in chunks]), strict=True):
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
        self.counters.step += 1
        self.counters.steps_since_publish += 1
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
        out.update(batch_metrics(samples, self.counters.version))
        return out

    def _user_loss(self, spec: str) -> LossFn:
        """The user's loss by spec, imported once per spec (a failed import is retried next time)."""
        if spec not in self._losses:
            self._losses[spec] = load_loss(spec)
        return self._losses[spec]
