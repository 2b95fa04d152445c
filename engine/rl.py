"""RL math: GRPO advantages, token log-probs, the PPO clipped objective in bypass mode.

Invariants: pure functions of tensors (no state, no I/O); every loss is averaged over the
response tokens of the whole mini-batch ("token-level"), so long and short answers weigh
by their tokens; in bypass mode the *rollout's* log-probs are the old policy's, so no
extra forward pass is needed and the ratio also absorbs the trainer–rollout mismatch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def group_advantages(rewards: torch.Tensor, group_ids: Sequence[int], *, scale: bool = True, eps: float = 1e-6) -> torch.Tensor:
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


def head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                  inv_temperature: float = 1.0, budget_bytes: int = 1 << 30) -> torch.Tensor:
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


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate, token level. All tensors [B, T]; ``advantages`` broadcast per token."""
    log_ratio = (logp - old_logp) * mask
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - clip, 1 + clip) * advantages
    loss = -masked_mean(torch.minimum(unclipped, clipped), mask)
    with torch.no_grad():
        m = mask.bool()
        r = ratio[m]
        clipfrac = masked_mean(((ratio - 1).abs() > clip).float(), mask)
        stats = {
            "pg_clipfrac": float(clipfrac),
            "ratio_mean": float(r.mean()) if r.numel() else 1.0,
            "ratio_max": float(r.max()) if r.numel() else 1.0,
            "mismatch_kl": float(masked_mean(old_logp - logp, mask)),
        }
    return loss, stats


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref) per token (non-negative, low variance)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1
