"""The user-loss protocol: what a ``loss_fn`` receives, what it must return, and how its
mistakes are reported.

A loss function named by ``"module:function"`` (``trainer.loss_fn``, ``TrainStep.loss_fn``,
``Engine.train(batch, loss_fn=...)``) is called once per micro-batch with one
:class:`LossInput` and returns ``(loss, stats)``:

    def reinforce_with_baseline(inp: LossInput) -> tuple[torch.Tensor, dict[str, float]]:
        baseline = group_mean(inp.rewards, inp.group_ids)           # [B]
        adv = (inp.rewards - baseline)[:, None] * inp.mask          # [B, T]
        loss = -(adv * inp.logp).sum() / inp.mask.sum().clamp(min=1)
        return loss, {"baseline_mean": float(baseline.mean())}

On a trainer of several ranks (``trainer.world_size > 1``) each rank calls the loss on the
micro-batches of its own share of the mini-batch: ``advantages`` are still computed over the
whole mini-batch and ``token_share`` is the micro-batch's share of the whole mini-batch's
tokens, so a token mean of per-token terms built on ``inp.advantages`` gives the same step as
one process. A loss that computes its own statistics across samples, as the example above
does with its baseline from ``inp.rewards``, sees only the samples of its micro-batch — the
rank's share of each group — as it already does with ``trainer.micro_batch_size``.

Invariants: every failure of a user loss — it cannot be imported, has the old six-argument
signature, raises, returns anything but ``(scalar tensor with grad, dict of numbers)``, or a
non-finite loss — becomes a :class:`UserCodeError` whose message starts with the user's spec
and says what happened; no optimizer step is taken for that batch (``Trainer.train_step``
checks before ``backward``). ``stats`` reach ``StepEnd.metrics`` as ``trainer/<name>``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from shunter.engine.config.trainer import TrainerConfig
from shunter.engine.io.errors import UserCodeError, type_name


@dataclass(frozen=True)
class LossInput:
    """One micro-batch of ``B`` samples, padded to ``T`` positions (``T`` = longest prompt +
    response minus one: position ``t`` holds the log-prob of token ``t + 1``). Tensors are on
    the trainer's device; [B, T] ones are 0 outside ``mask``."""

    logp: torch.Tensor
    """[B, T] log-probs of the response tokens under the weights being trained (with grad)."""
    old_logp: torch.Tensor
    """[B, T] the rollout's own log-probs of the same tokens (the behaviour policy, any version)."""
    advantages: torch.Tensor
    """[B, T] GRPO advantages — each sample's reward minus its group's mean reward, divided by
    the group's std — computed over the whole mini-batch, repeated over the sample's tokens."""
    mask: torch.Tensor
    """[B, T] 1.0 on response tokens, 0.0 on prompt and padding."""
    rewards: torch.Tensor
    """[B] each sample's reward (from the task's reward function)."""
    group_ids: torch.Tensor
    """[B] (long) the prompt group of each sample; samples of one prompt share it."""
    versions: torch.Tensor
    """[B, T] (long) weight version that generated each response token (-1 outside ``mask``)."""
    ref_logp: torch.Tensor | None
    """[B, T] log-probs under the initial model when ``trainer.kl_coef > 0``, else None."""
    trainer_version: int
    """The trainer's current weight version (staleness of a token = this minus its version)."""
    token_share: float
    """This micro-batch's share of the mini-batch's response tokens (the step sums
    ``loss * token_share`` over micro-batches, so a token-mean loss stays a token mean)."""
    cfg: TrainerConfig
    """The trainer section of the config (``clip_ratio``, ``kl_coef`` …)."""


class LossFn(Protocol):
    def __call__(self, inp: LossInput, /) -> tuple[torch.Tensor, dict[str, float]]: ...


def load_loss(spec: str) -> LossFn:
    """Import ``"module:function"`` and check it takes one ``LossInput``; ``UserCodeError`` else."""
    from shunter.policies.registry import import_object

    try:
        fn = import_object(spec, "loss_fn")
    except ValueError as e:
        raise UserCodeError(spec, f"cannot be loaded: {e}") from None
    if not callable(fn) or isinstance(fn, type):
        raise UserCodeError(spec, f"is {type_name(fn)}, not a function")
    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        return fn  # a builtin or C callable: trust it
    if len(params) != 1:
        names = ", ".join(p.name for p in params)
        raise UserCodeError(
            spec,
            f"takes {len(params)} required arguments ({names}); a loss takes one "
            "shunter.engine.trainer.loss.LossInput (inp.logp, inp.old_logp, inp.advantages, inp.mask, "
            "inp.rewards, inp.group_ids, inp.ref_logp, inp.cfg ...) and returns (loss, stats)",
        )
    return fn


def call_loss(fn: Callable[[LossInput], Any], spec: str, inp: LossInput) -> tuple[torch.Tensor, dict[str, float]]:
    """Run the user's loss on one micro-batch; ``UserCodeError`` for anything unusable."""
    try:
        out = fn(inp)
    except Exception as e:  # noqa: BLE001 - the user's code: report it as theirs
        raise UserCodeError.raised(spec, e) from e
    expected = "expected (loss: a scalar torch.Tensor with grad, stats: dict[str, float])"
    if not (isinstance(out, tuple) and len(out) == 2):
        raise UserCodeError(spec, f"returned {type_name(out)}; {expected}")
    loss, stats = out
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise UserCodeError(spec, f"returned loss {type_name(loss)}; {expected}")
    if not loss.requires_grad:
        raise UserCodeError(spec, "returned a loss with no gradient (computed without inp.logp, or detached)")
    if not isinstance(stats, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float | torch.Tensor) for k, v in stats.items()
    ):
        raise UserCodeError(spec, f"returned stats {type_name(stats)}; {expected}")
    if not math.isfinite(float(loss.detach())):
        raise UserCodeError(spec, f"returned a non-finite loss ({float(loss.detach())}); no step was taken")
    return loss.reshape(()), {k: float(v) for k, v in stats.items()}
