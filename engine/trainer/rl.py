"""RL math: GRPO advantages, token log-probs, the PPO clipped objective and its off-policy
corrections.

Invariants: pure functions of tensors (no state, no I/O); every loss is averaged over the
response tokens of the whole mini-batch ("token-level"), so long and short answers weigh
by their tokens (a token dropped by a mask counts in that denominator with a zero term, so
masking shrinks the step instead of re-weighting the tokens kept).

Objectives (``trainer.objective``):

- ``bypass``: the *rollout's* log-probs ``mu`` are the old policy's; the PPO ratio
  ``pi_theta / mu`` absorbs both staleness and the trainer–rollout mismatch; no extra
  forward pass.
- ``decoupled`` (decoupled PPO, AReaL): the trust region is taken around a *proximal*
  policy ``pi_prox`` (the trainer's weights at the start of the sync cycle, recomputed by
  the trainer), the ratio is ``pi_theta / pi_prox``, and each token is weighted by the
  behaviour importance weight ``pi_prox / mu`` (the rollout's own log-prob, whatever version
  made the token), corrected by TIS / MIS below.

Corrections of the behaviour ratio ``rho`` (``pi_prox / mu``; in bypass ``pi_theta / mu``
detached, for MIS only):

- TIS (``tis``): truncate the weight at ``tis_cap`` — per token, or per sequence with the
  sequence weight ``prod_t rho_t`` (then the same for all its tokens);
- MIS / IcePop (``mis``): drop tokens whose ``rho`` leaves ``[mis_low, mis_high]`` — per
  token, or whole sequences whose geometric-mean ratio ``exp(mean_t log rho_t)`` leaves it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def group_advantages(
    rewards: torch.Tensor, group_ids: Sequence[int], *, scale: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO: reward minus its group's mean, divided by the group's std (if ``scale``)."""
    out = torch.empty_like(rewards)
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(int(g), []).append(i)
    for idx in groups.values():
        r = rewards[idx]
        centered = r - r.mean()
        if scale and len(idx) > 1:
            centered = centered / (r.std(unbiased=True) + eps)
        out[idx] = centered
    return out


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per position; ``logits`` [B, T, V], ``targets`` [B, T] -> [B, T]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    inv_temperature: float = 1.0,
    budget_bytes: int = 1 << 30,
) -> torch.Tensor:
    """log p(target) for selected positions straight from the last hidden states: ``hidden``
    [N, H] through the output head (``weight`` [V, H]) at ``1 / inv_temperature``, ``targets``
    [N] -> [N] in fp32. Equal to ``token_logprobs`` on the full logits, but never holds more
    than ``budget_bytes`` of [*, V] logits at once: the positions go in chunks, and under
    autograd each chunk is recomputed in the backward pass (only ``hidden`` is kept), so a
    150k-token vocabulary over 30k response tokens costs ~1 GiB instead of ~60 GiB."""
    vocab = weight.shape[0]
    chunk = max(1, budget_bytes // (vocab * 12))  # bf16 logits + fp32 copy + fp32 grad per element

    def one(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        logits = torch.nn.functional.linear(h, weight, bias).float() * inv_temperature
        return logits.gather(-1, t.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)

    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    parts = []
    for i in range(0, hidden.shape[0], chunk):
        h, t = hidden[i : i + chunk], targets[i : i + chunk]
        if grad:
            from torch.utils.checkpoint import checkpoint

            parts.append(checkpoint(one, h, t, use_reentrant=False))
        else:
            parts.append(one(h, t))
    return torch.cat(parts) if parts else hidden.new_zeros(0, dtype=torch.float32)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def behaviour_correction(
    log_rho: torch.Tensor,
    mask: torch.Tensor,
    *,
    tis: str = "none",
    tis_cap: float = 2.0,
    mis: str = "none",
    mis_low: float = 0.5,
    mis_high: float = 2.0,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """TIS weight and MIS keep-mask from the per-token log behaviour ratio ``log_rho``
    ([B, T], padding where ``mask`` is 0). Returns (weight, keep, stats); no gradient flows.

    ``tis``: ``none`` (weight ``rho``, uncapped), ``token`` (``min(rho_t, cap)``),
    ``sequence`` (``min(prod_t rho_t, cap)`` on every token of the sequence), or ``off``
    (weight 1: the bypass objective, whose PPO ratio already holds ``rho``).
    ``mis``: ``none``, ``token`` or ``sequence`` (geometric mean), band ``[mis_low, mis_high]``."""
    with torch.no_grad():
        lr = (log_rho * mask).float()
        m = mask.bool()
        n_tok = mask.sum().clamp(min=1)
        seq_tokens = mask.sum(-1).clamp(min=1)
        seq_log = lr.sum(-1, keepdim=True)  # log prod_t rho_t
        if tis not in ("off", "none", "token", "sequence"):
            raise ValueError(f"tis = {tis!r}; expected off, none, token or sequence")
        raw = torch.ones_like(lr) if tis == "off" else torch.exp(seq_log if tis == "sequence" else lr).expand_as(lr)
        cap = tis_cap if tis in ("token", "sequence") else math.inf
        weight, truncated = raw.clamp(max=cap), (raw > cap).float()
        lo, hi = math.log(mis_low), math.log(mis_high)
        if mis == "none":
            keep = torch.ones_like(lr)
        elif mis == "token":
            keep = ((lr >= lo) & (lr <= hi)).float()
        elif mis == "sequence":
            geo = (seq_log.squeeze(-1) / seq_tokens)[:, None].expand_as(lr)
            keep = ((geo >= lo) & (geo <= hi)).float()
        else:
            raise ValueError(f"mis = {mis!r}; expected none, token or sequence")
        weight, keep = weight * mask, keep * mask
        rho = torch.exp(lr[m])
        stats = {
            "is_ratio_mean": float(rho.mean()) if rho.numel() else 1.0,
            "is_ratio_max": float(rho.max()) if rho.numel() else 1.0,
            "is_ratio_min": float(rho.min()) if rho.numel() else 1.0,
            "is_weight_mean": float((weight * keep).sum() / keep.sum().clamp(min=1)),
            "is_truncated_frac": float((truncated * mask).sum() / n_tok),
            "is_masked_frac": float(1 - keep.sum() / n_tok),
            # KL(mu || pi_ref) estimated on the rollout's tokens: k1 = E[log mu - log pi_ref], k3 >= 0
            "mismatch_kl": float(masked_mean(-lr, mask)),
            "mismatch_k3": float(masked_mean(torch.exp(lr) - lr - 1, mask)),
        }
    return weight, keep, stats


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float,
    weight: torch.Tensor | None = None,
    keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate, token level. All tensors [B, T]; ``advantages`` broadcast per token.

    ``old_logp`` is the trust region's centre (``mu`` in bypass, ``pi_prox`` in decoupled
    PPO); ``weight`` (detached, default 1) multiplies each token's term; ``keep`` (0/1,
    default 1) drops tokens; the mean is over all response tokens of ``mask``."""
    log_ratio = (logp - old_logp) * mask
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - clip, 1 + clip) * advantages
    term = torch.minimum(unclipped, clipped)
    if weight is not None:
        term = term * weight
    if keep is not None:
        term = term * keep
    loss = -masked_mean(term, mask)
    with torch.no_grad():
        m = mask.bool()
        r = ratio[m]
        clipfrac = masked_mean(((ratio - 1).abs() > clip).float(), mask)
        stats = {
            "pg_clipfrac": float(clipfrac),
            "ratio_mean": float(r.mean()) if r.numel() else 1.0,
            "ratio_max": float(r.max()) if r.numel() else 1.0,
        }
    return loss, stats


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref) per token (non-negative, low variance)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1
