"""``Stepper``: the ``Trainer``'s optimizer steps — the batch collated into padded tensors, the
response tokens' log-probs (``TokenScorer``), the built-in PPO objective or the user's loss, and
the decoupled objective's proximal log-probs — on one process or on each of N trainer ranks.

Held by ``shunter.engine.trainer.trainer.Trainer``, which builds it in ``setup`` and gives it the
scorer of the trained model (``TokenScorer``: the FSDP root on a sharded trainer), the scorer of
its frozen reference (``None`` without a KL term), the optimizer, the ``RankGroup``, the device,
the config, the padding token and the trainer's ``TrainerCounters``; it keeps the decoupled
objective's proximal weights (this rank's shards) and the user losses it has imported.

Invariants: each ``train_step`` is exactly one optimizer step on the samples it is given, equal
to the whole-batch token-mean step of one process: every rank gets the whole batch, computes
the advantages over it and trains its share (``shares.token_shares``, balanced by tokens), each
micro-batch's loss weighted by its share of the **whole mini-batch's** tokens; FSDP averages
gradients over the ranks, so each rank's loss is scaled by the world size to make that average
the sum. Every rank runs the same number of forward/backward passes (each is a collective);
a rank with fewer samples runs passes weighted 0. A user loss that fails on any rank raises
``UserCodeError`` on every rank before any ``backward`` (a flag all-reduced first), so no rank
is left in a gradient reduction and no optimizer step is taken. With ``objective =
"decoupled"`` the proximal log-probs are those of the weights of the last publish (the start
of the sync cycle): the live weights at the cycle's first step, a host copy of this rank's
shards taken then for its later steps (``parameter_sync_step > 1``).
"""

from __future__ import annotations

import time

import torch

from shunter.engine.config.trainer import TrainerConfig
from shunter.engine.io.errors import UserCodeError
from shunter.engine.trainer import rl
from shunter.engine.trainer.batch_stats import batch_metrics
from shunter.engine.trainer.counters import TrainerCounters
from shunter.engine.trainer.loss import LossFn, LossInput, call_loss, load_loss
from shunter.engine.trainer.rank_group import RankGroup, merge_stats
from shunter.engine.trainer.scoring import TokenScorer
from shunter.engine.trainer.shares import micro_steps, token_shares
from shunter.events import Sample


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
        scorer: TokenScorer,
        ref: TokenScorer | None,
        opt: torch.optim.Optimizer,
        *,
        device: str,
        pad_token_id: int,
        group: RankGroup | None = None,
    ) -> None:
        self.cfg = cfg
        self.counters = counters
        self.scorer = scorer
        self.model = scorer.lm  # the trained LM (its parameters: this rank's shards when sharded)
        self.ref = ref
        self.opt = opt
        self.device = device
        self.pad_token_id = pad_token_id
        self.group = group or RankGroup()
        self._prox_host: dict[str, torch.Tensor] | None = None  # decoupled PPO: the cycle's proximal weights
        self._losses: dict[str, LossFn] = {}  # the user's losses by spec

    @property
    def amp(self) -> bool:
        return self.scorer.amp

    @property
    def temperature(self) -> float:
        return self.scorer.temperature

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

    def logp(self, model: torch.nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """Log-probs of the response tokens, [B, T-1] fp32; 0 outside ``b["mask"]``
        (``TokenScorer``); ``model``: a scorer, or a bare LM (scored the way this trainer scores)."""
        if not isinstance(model, TokenScorer):
            model = TokenScorer(model, temperature=self.temperature, amp=self.amp)
        return model(b["ids"], b["attn"], b["mask"])

    def _loss(self, b: dict[str, torch.Tensor], adv: torch.Tensor, user: tuple[LossFn, str] | None, share: float):
        adv_tok = adv[:, None].expand_as(b["mask"])
        logp = self.scorer(b["ids"], b["attn"], b["mask"])
        ref_logp = None
        if self.ref is not None:
            with torch.no_grad():
                ref_logp = self.ref(b["ids"], b["attn"], b["mask"])
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

    @staticmethod
    def _locals(model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """Each parameter's tensor on this rank: its shard (a DTensor's local part) when sharded."""
        return {n: (p.to_local() if hasattr(p, "to_local") else p.data) for n, p in model.named_parameters()}

    @torch.no_grad()
    def prox_logps(self, batches: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """Decoupled PPO: log-probs under the weights of the last publish (module docstring).
        A collective on a sharded trainer: every rank passes the same number of batches."""
        if self.counters.steps_since_publish == 0:
            if self.cfg.parameter_sync_step > 1:  # later steps of this cycle need these weights
                self._prox_host = {n: _host_copy(t) for n, t in self._locals(self.model).items()}
            return [self.scorer(b["ids"], b["attn"], b["mask"]) for b in batches]
        if self._prox_host is None:
            raise RuntimeError(
                f"decoupled PPO: step {self.counters.step + 1} is {self.counters.steps_since_publish} steps after the "
                "last publish but no proximal weights were kept (trainer.parameter_sync_step = "
                f"{self.cfg.parameter_sync_step}; is something publishing less often?)"
            )
        local = self._locals(self.model)
        live = {n: _host_copy(t) for n, t in local.items()}  # copied in place: a shard's storage is FSDP's
        try:
            self._reshard()
            for n, t in local.items():
                t.copy_(self._prox_host[n], non_blocking=True)
            return [self.scorer(b["ids"], b["attn"], b["mask"]) for b in batches]
        finally:
            self._reshard()
            for n, t in local.items():
                t.copy_(live[n], non_blocking=True)

    def _reshard(self) -> None:
        """The shards as they are now for the next forward (``fsdp.reshard``): the weights
        swapped in for the proximal log-probs, then the live ones back."""
        from shunter.engine.trainer import fsdp

        fsdp.reshard(self.scorer)

    def _chunks(self, samples: list[Sample]) -> list[tuple[list[Sample], list[int], float]]:
        """This rank's micro-batches: (samples, their indices in the batch, share of the whole
        mini-batch's tokens). Every rank gets as many (module docstring): a filler pass repeats
        one sample with share 0."""
        g = self.group
        tokens = [s.trained_tokens for s in samples]
        total = max(1, sum(tokens))
        shares = token_shares(tokens, g.world)
        mine = shares[g.rank]
        n = micro_steps(shares, self.cfg.micro_batch_size)
        size = max(1, -(-len(mine) // n)) if mine else 1
        out = []
        for k in range(n):
            idx = mine[k * size : (k + 1) * size]
            if idx:
                out.append(([samples[i] for i in idx], idx, max(1, sum(tokens[i] for i in idx)) / total))
            else:
                out.append(([samples[0]], [0], 0.0))
        return out

    def train_step(self, samples: list[Sample], loss_fn: str = "") -> dict[str, float]:
        """One optimizer step (module docstring). On one process the batch is cut into
        micro-batches of ``trainer.micro_batch_size`` samples (gradients accumulate); each
        micro-batch's token-mean loss is weighted by its share of the tokens, so the step equals
        the whole-batch token-mean step. Advantages are computed over the whole batch.
        ``loss_fn``: a user loss ``"module:function"`` (empty: the built-in objective); if it
        fails, ``UserCodeError`` is raised and no optimizer step is taken."""
        if not samples:
            raise ValueError("train_step needs at least one sample")
        g = self.group
        user = self._user_loss_everywhere(loss_fn) if loss_fn else None
        t0 = time.perf_counter()
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
        adv = rl.group_advantages(rewards, [s.group_id for s in samples]).to(self.device)
        chunks = [(self.collate(part), adv[idx], w) for part, idx, w in self._chunks(samples)]
        if self.cfg.objective == "decoupled" and user is None:
            for (b, _, _), prox in zip(chunks, self.prox_logps([b for b, _, _ in chunks]), strict=True):
                b["prox"] = prox
        self.opt.zero_grad(set_to_none=True)
        loss_sum, stats_sum = 0.0, {}
        for b, a, w in chunks:
            try:
                loss, stats = self._loss(b, a, user, w)
                failed: UserCodeError | None = None
            except UserCodeError as e:
                failed = e
            # no rank goes into a gradient reduction another one will not join: a flag all-reduced
            # each pass, the messages gathered only when a rank failed
            if g.sharded and g.any(failed is not None, self.device):
                self._agree(failed, user[1] if user else "")
            if failed is not None:
                raise failed
            (loss * (w * g.world)).backward()
            if w == 0.0:
                continue  # a filler pass: it only keeps this rank in step with the others
            loss_sum += float(loss.detach()) * w
            for k, v in stats.items():  # maxima and minima over micro-batches, token-weighted means else
                v = float(v)
                if k.endswith("_max"):
                    stats_sum[k] = max(stats_sum.get(k, v), v)
                elif k.endswith("_min"):
                    stats_sum[k] = min(stats_sum.get(k, v), v)
                else:
                    stats_sum[k] = stats_sum.get(k, 0.0) + v * w
        stats_sum["loss"] = loss_sum
        stats = merge_stats(g.gather(stats_sum)) if g.sharded else stats_sum
        clip = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        self.opt.step()
        if self.device.startswith("cuda"):  # the step's time holds its optimizer kernels, not the next publish's
            torch.cuda.synchronize(self.device)
        self.counters.step += 1
        self.counters.steps_since_publish += 1
        lens = [len(s.token_ids) for s in samples]
        loss_value = stats.pop("loss")
        out = {f"trainer/{k}": float(v) for k, v in stats.items()}
        out.update(
            {
                "trainer/loss": loss_value,
                "trainer/grad_norm": grad_norm,
                "trainer/step_s": time.perf_counter() - t0,
                "trainer/tokens": float(sum(lens)),
            }
        )
        out.update(batch_metrics(samples, self.counters.version))
        return out

    def _agree(self, failed: UserCodeError | None, spec: str) -> None:
        """Every rank learns whether the user's loss failed on any rank; one that did not fail
        raises the first failure's message, naming the rank it happened on."""
        outcomes = self.group.gather(None if failed is None else str(failed))
        first = next(((r, m) for r, m in enumerate(outcomes) if m is not None), None)
        if first is not None and failed is None:
            r, msg = first
            raise UserCodeError(spec, f"failed on trainer rank {r}: {msg.removeprefix(spec).lstrip()}")

    def _user_loss_everywhere(self, spec: str) -> tuple[LossFn, str]:
        """The user's loss on every rank, or ``UserCodeError`` on every rank (a collective when sharded)."""
        try:
            fn: LossFn | None = self._user_loss(spec)
            failed = None
        except UserCodeError as e:
            fn, failed = None, e
        if self.group.sharded:
            self._agree(failed, spec)
        if failed is not None:
            raise failed
        assert fn is not None
        return fn, spec

    def _user_loss(self, spec: str) -> LossFn:
        """The user's loss by spec, imported once per spec (a failed import is retried next time)."""
        if spec not in self._losses:
            self._losses[spec] = load_loss(spec)
        return self._losses[spec]
