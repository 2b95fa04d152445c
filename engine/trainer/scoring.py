"""``TokenScorer``: an HF causal LM as the module that turns a collated batch into the log-probs
of its response tokens — the forward pass the trainer differentiates.

Invariant: ``TokenScorer(lm)(batch)`` is ``[B, T-1]`` fp32 log-probs of the response tokens
under ``softmax(logits / temperature)``, 0 outside ``batch["mask"]``, whatever wraps it. Only
the masked positions go through the output head, in chunks (``rl.head_logprobs``): full
``[B, T, V]`` logits of a 150k vocabulary would take tens of GiB at long response lengths;
models whose head does more than a linear map (logit soft-capping or scaling) take the plain
path over the full logits.

Why a module of its own: a sharded trainer wraps this module as FSDP2's root
(``engine.trainer.fsdp``), so the output head's weight — read directly here, outside the LM's
own ``forward`` — is gathered by the root's pre-forward hook and its gradient reduced by the
root's post-backward one; calling the decoder body and then the head's weight from outside an
FSDP root would read a shard. The LM stays an attribute (``lm``): its ``state_dict`` keeps the
HF names that replicas load and checkpoints write.
"""

from __future__ import annotations

import torch

from shunter.engine.trainer import rl

_HEAD_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def plain_head(model: torch.nn.Module) -> tuple[torch.nn.Linear | None, torch.nn.Module | None]:
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


class TokenScorer(torch.nn.Module):
    def __init__(self, lm: torch.nn.Module, *, temperature: float, amp: bool) -> None:
        super().__init__()
        self.lm = lm
        self.temperature = temperature
        self.amp = amp  # bf16 autocast (a sharded trainer's bf16 comes from FSDP's MixedPrecisionPolicy instead)

    def forward(self, ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        mask = mask.float()  # FSDP's mixed precision casts float inputs to bf16: the answer stays fp32
        targets = ids[:, 1:]
        with torch.autocast(device_type=ids.device.type, dtype=torch.bfloat16, enabled=self.amp):
            head, body = plain_head(self.lm)
            if head is None:
                logits = self.lm(input_ids=ids, attention_mask=attn).logits[:, :-1]
                return rl.token_logprobs(logits.float() / self.temperature, targets) * mask
            hidden = body(input_ids=ids, attention_mask=attn).last_hidden_state[:, :-1]
            sel = mask.bool()
            lp = rl.head_logprobs(hidden[sel], head.weight, head.bias, targets[sel], 1.0 / self.temperature)
        return torch.zeros_like(mask).index_put(sel.nonzero(as_tuple=True), lp)
